// verifyd: the verify service's executable. Parses flags, builds the engine, starts the
// server, and waits for SIGTERM/SIGINT (drain: health NOT_SERVING, in-flight requests
// finish, exit 0) or an engine failure (exit 1). Logs one line per event with spdlog.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/engine_factory.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#ifdef VERIFYD_WITH_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "gRPC listen address (host:port)");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9400",
          "Prometheus /metrics listen address; empty disables");
ABSL_FLAG(std::string, model, "tiny", "model preset name or checkpoint directory");
ABSL_FLAG(uint64_t, seed, 0, "weight seed for presets");
ABSL_FLAG(std::string, backend, "auto", "cpu | cuda | auto (cpu when no GPU) | toy (test)");
ABSL_FLAG(int, tp, 1, "tensor-parallel ranks");
ABSL_FLAG(int64_t, kv_slots, 65536, "latent KV pool capacity in tokens");
ABSL_FLAG(int, max_batch, 64, "requests per engine step");
ABSL_FLAG(int, max_queue, 1024, "requests waiting for the engine before RESOURCE_EXHAUSTED");
ABSL_FLAG(int, session_ttl_s, 600, "idle seconds before a session expires; 0 disables");
ABSL_FLAG(int, max_sessions, 4096, "open sessions at once");
ABSL_FLAG(bool, reflection, false, "enable gRPC server reflection");
ABSL_FLAG(int, max_message_bytes, 16 << 20, "largest accepted gRPC message");
ABSL_FLAG(int, drain_timeout_s, 30, "seconds in-flight requests get to finish on SIGTERM");
ABSL_FLAG(std::string, log_level, "info", "trace | debug | info | warn | error");

namespace {

struct StopState {
  absl::Mutex mu;
  bool stop = false;
  int exit_code = 0;
  std::string reason;
};

void RequestStop(StopState* s, int code, const std::string& reason) {
  absl::MutexLock lock(&s->mu);
  if (s->stop) return;
  s->stop = true;
  s->exit_code = code;
  s->reason = reason;
}

void SdNotify(const char* msg) {
#ifdef VERIFYD_WITH_SYSTEMD
  sd_notify(0, msg);
#else
  (void)msg;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("verifyd: speculative-decoding tree verification service");
  absl::ParseCommandLine(argc, argv);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%fZ level=%l %v", spdlog::pattern_time_type::utc);
  const std::string level = absl::GetFlag(FLAGS_log_level);
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    spdlog::critical("--log_level: '{}' is not one of trace, debug, info, warn, error", level);
    return 2;
  }
  spdlog::set_level(parsed);

  // Every thread inherits this mask; one thread takes the signals with sigwait.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  verifyd::server::EngineSpec spec;
  spec.backend = absl::GetFlag(FLAGS_backend);
  spec.model = absl::GetFlag(FLAGS_model);
  spec.seed = absl::GetFlag(FLAGS_seed);
  spec.tp = absl::GetFlag(FLAGS_tp);
  spec.kv_slots = absl::GetFlag(FLAGS_kv_slots);
  spec.max_batch = absl::GetFlag(FLAGS_max_batch);
  spdlog::info("loading model={} backend={} tp={} kv_slots={}", spec.model, spec.backend,
               spec.tp, spec.kv_slots);
  auto engine = verifyd::server::CreateEngine(spec);
  if (!engine.ok()) {
    spdlog::critical("engine: {}", engine.status().ToString());
    return 2;
  }

  StopState stop;
  verifyd::server::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.max_batch = absl::GetFlag(FLAGS_max_batch);
  options.max_queue = absl::GetFlag(FLAGS_max_queue);
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.session_ttl = absl::Seconds(absl::GetFlag(FLAGS_session_ttl_s));
  options.reflection = absl::GetFlag(FLAGS_reflection);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.on_engine_failure = [&stop] { RequestStop(&stop, 1, "engine failed"); };
  auto server = verifyd::server::Server::BuildAndStart(options, *std::move(engine));
  if (!server.ok()) {
    spdlog::critical("server: {}", server.status().ToString());
    return 2;
  }
  SdNotify("READY=1");

  // systemd watchdog (WatchdogSec=): ping at half the interval while the engine makes
  // progress; the pings stop when a step hangs longer than the interval or the engine failed.
  absl::Notification stop_watchdog;
  std::thread watchdog;
#ifdef VERIFYD_WITH_SYSTEMD
  uint64_t watchdog_usec = 0;
  if (sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0) {
    const absl::Duration interval = absl::Microseconds(static_cast<int64_t>(watchdog_usec));
    spdlog::info("systemd watchdog: interval {} ms", absl::ToInt64Milliseconds(interval));
    watchdog = std::thread([&, interval] {
      do {
        if ((*server)->engine_progressing(interval)) {
          SdNotify("WATCHDOG=1");
        } else {
          spdlog::error("watchdog: engine not progressing, withholding the ping");
        }
      } while (!stop_watchdog.WaitForNotificationWithTimeout(interval / 2));
    });
  }
#endif

  std::thread signals([&stop, sigs] {
    int sig = 0;
    if (sigwait(&sigs, &sig) == 0) {
      RequestStop(&stop, 0, sig == SIGTERM ? "SIGTERM" : "SIGINT");
    }
  });
  signals.detach();  // stays blocked in sigwait if the engine fails first

  int code = 0;
  {
    absl::MutexLock lock(&stop.mu);
    stop.mu.Await(absl::Condition(&stop.stop));
    code = stop.exit_code;
    spdlog::info("stopping: {}", stop.reason);
  }
  SdNotify("STOPPING=1");
  (*server)->Shutdown(absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s)));
  stop_watchdog.Notify();
  if (watchdog.joinable()) watchdog.join();
  spdlog::info("exit code={}", code);
  return code;
}
