// verifyd: the verify service's executable. Parses flags (a usage error exits 2 with one
// line), opens the listeners (gRPC answering UNAVAILABLE "model loading", health NOT_SERVING,
// /metrics with the load gauges), loads the model (progress logged, sent to systemd and
// exported), then serves and waits for SIGTERM/SIGINT (drain: health NOT_SERVING, in-flight
// requests finish, exit 0) or an engine failure (exit 1). A load failure exits 2. Logs one
// line per event with spdlog.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "kernels/cuda/verify_attention/config.h"
#include "server/engine_factory.h"
#include "server/server.h"
#include "server/startup_metrics.h"
#include "server/systemd_notify.h"
#include "spdlog/spdlog.h"
#include "tp/checkpoint_reader.h"
#include "tp/memory_plan.h"
#include "tp/presets.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "gRPC listen address (host:port)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9400",
          "Prometheus /metrics listen address (loopback by default: a scraper on another host "
          "needs e.g. 0.0.0.0:9400, as the deploy files set); empty disables");
ABSL_FLAG(std::string, model, "tiny",
          absl::StrCat("a preset name (", absl::StrJoin(verifyd::tp::PresetNames(), ", "),
                       ") or a checkpoint directory (config.json + safetensors)"));
ABSL_FLAG(std::string, served_model_name, "",
          "the model_name label of every metric series (vLLM's label); empty: the --model value");
ABSL_FLAG(uint64_t, seed, 0, "weight seed for presets");
ABSL_FLAG(int64_t, preset_layers, 0,
          "decoder layers of a preset model (0: the preset's own count; e.g. kimi-k2-attn with "
          "61 for Kimi-K2's depth)");
ABSL_FLAG(std::string, backend, "auto", "cpu | cuda | auto (cpu when no GPU) | toy (test)");
ABSL_FLAG(int, tp, 1, "tensor-parallel ranks");
ABSL_FLAG(std::string, cuda_devices, "",
          "cuda backend: the CUDA device of each rank, comma-separated (default 0..tp-1); one "
          "device repeated for every rank (e.g. 0,0,0,0) runs the ranks on that GPU through the "
          "loopback communicator (testing tensor parallelism on one GPU)");
ABSL_FLAG(bool, fp8_experts, true,
          "cuda backend: keep FP8-stored weights (routed and shared experts, dense MLP layers, "
          "attention projections but kv_b; 128x128 block scales) in FP8 on sm_90 GPUs "
          "(block-scaled FP8 GEMMs, activations quantized per 128 columns); false: dequantize "
          "them to bf16");
ABSL_FLAG(bool, expert_parallel, true,
          "cuda backend, tp > 1: each rank holds n_routed_experts / tp whole routed experts "
          "(expert parallelism) when they divide evenly; false: a 1/tp slice of every expert");
ABSL_FLAG(bool, batch_invariant, true,
          "cuda backend: batch-invariant steps (a request's logits do not depend on the rest "
          "of the step, so speculative output equals plain decoding bit for bit); false: the "
          "batch-adaptive kernels, lossless only up to float near-ties (docs/PERF.md has the "
          "speed of both)");
ABSL_FLAG(std::string, verify_config, "auto",
          "cuda backend, with --batch_invariant=false: the verify attention configuration of "
          "every layer, for benchmarks and diagnosis (kernels/cuda/verify_attention/config.h): " +
              verifyd::kernels::cuda::VerifyKernelConfigHelp());
ABSL_FLAG(int64_t, kv_slots, 65536, "latent KV pool capacity in tokens");
ABSL_FLAG(std::string, kv_dtype, "auto",
          "latent KV cache storage: auto (float32 on the cpu backend, bf16 on cuda) or fp8 "
          "(e4m3 with a scale per 128 columns, bf16 RoPE part: 656 bytes a token for "
          "DeepSeek-V3, 1.76x the tokens; on an H200 one-node decode attention is 1.2-1.4x "
          "faster than bf16's, draft trees and 64+ heads per GPU slower: docs/PERF.md)");
ABSL_FLAG(int64_t, fp8_staging_keys, 262144,
          "cuda backend, --kv_dtype=fp8 on sm_90: keys of one step the verify attention may "
          "dequantize into a bf16 staging area (1,156 bytes of device memory each) for steps "
          "with 256+ rows in a request; 0: none (those steps convert tile by tile, slower)");
ABSL_FLAG(int, max_batch, 64, "requests per engine step");
ABSL_FLAG(int, max_queue, 1024, "requests waiting for the engine before RESOURCE_EXHAUSTED");
ABSL_FLAG(int, session_ttl_s, 600, "idle seconds before a session expires; 0 disables");
ABSL_FLAG(int, max_sessions, 4096, "open sessions at once");
ABSL_FLAG(int, prefill_chunk, 32,
          "prompt rows per prefill engine step (the engine's per-request row limit caps it); a "
          "longer prompt is prefilled over several steps, interleaved with other sessions");
ABSL_FLAG(bool, reflection, false, "enable gRPC server reflection");
ABSL_FLAG(int, max_message_bytes, 16 << 20, "largest accepted gRPC message");
ABSL_FLAG(int, drain_timeout_s, 30, "seconds in-flight requests get to finish on SIGTERM");
ABSL_FLAG(std::string, log_level, "info", "trace | debug | info | warn | error");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain: serve the API over TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates signed by it (mutual TLS); sessions "
          "are bound to the client certificate's subject");
ABSL_FLAG(std::string, auth_token_file, "",
          "file of bearer tokens ('<name> <token>' per line); every call must send "
          "'authorization: Bearer <token>'; needs TLS; sessions are bound to the token's name");
ABSL_FLAG(std::string, health_listen, "",
          "extra plaintext port serving only grpc.health.v1 without auth (probes); empty: none");
ABSL_FLAG(int, max_call_deadline_s, 120,
          "deadline given to calls without one (and to each VerifyStream message)");
ABSL_FLAG(int, max_concurrent_streams, 128, "HTTP/2 streams per client connection");
ABSL_FLAG(int, max_metadata_bytes, 16 << 10,
          "largest metadata (headers) of one call; a call over it gets RESOURCE_EXHAUSTED and "
          "the connection's other calls go on (a header block over 1 MiB fails its whole "
          "connection: gRPC's own limit)");
ABSL_FLAG(int, max_threads, 1024,
          "threads the gRPC server may hold for running calls and open VerifyStreams, all "
          "connections together; beyond it new calls get RESOURCE_EXHAUSTED");
ABSL_FLAG(int, stall_timeout_s, 60,
          "an engine step running longer than this turns health NOT_SERVING (API and "
          "--health_listen ports) until it finishes, with or without systemd; 0 disables");
ABSL_FLAG(bool, print_memory_plan, false,
          "print the cuda backend's per-GPU memory plan of --model (a preset or a checkpoint's "
          "config.json; no weights read) at --tp, --expert_parallel, --fp8_experts, --kv_dtype, "
          "--max_batch and --kv_slots: weights by part, workspaces, KV bytes a token and the KV "
          "tokens that fit; exit 0, or 2 with the error when --kv_slots does not fit");
ABSL_FLAG(double, device_memory_gb, 150.11,
          "--print_memory_plan: device memory per GPU in GB (10^9 bytes; 150.11: an H200, as "
          "cudaMemGetInfo reports it)");
ABSL_FLAG(int, slice_rank, -1,
          "benchmarks only (cuda backend): run rank R of --tp alone on one GPU, its collectives "
          "recorded instead of run, to measure one GPU of a model too large for one; its "
          "answers are NOT the model's. -1: every rank");
ABSL_FLAG(std::string, testing_fault, "",
          "tests only (cpu backend): fail:<rank>@<step>, slow:<ms> (every step) or load:<ms> "
          "(a slower model load) fault injection");

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

// Usage errors, found before Abseil's parser (which exits 1 after printing them): an unknown
// flag, a flag without its value, a value its flag cannot parse, a positional argument. The
// one-line message, or "" when the command line is fine.
std::string UsageError(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") return "";
    if (arg.size() < 2 || arg[0] != '-') {
      return absl::StrCat("unexpected argument '", arg, "': every option is a --flag");
    }
    absl::string_view body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    const bool has_value = eq != absl::string_view::npos;
    const absl::string_view name = body.substr(0, eq);
    // Abseil's own flags (help, flag files): left to its parser.
    if (name == "help" || name == "helpfull" || name == "helpshort" || name == "helppackage" ||
        name == "helpmatch" || name == "helpon" || name == "version" || name == "only_check_args" ||
        name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok") {
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>()) continue;  // --noflag
    }
    if (flag == nullptr) return absl::StrCat("unknown flag --", name);
    std::string value;
    if (has_value) {
      value = std::string(body.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::StrCat("--", name, ": missing value");
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) return absl::StrCat("--", name, ": ", error);
  }
  return "";
}

// Model-load progress to the log (every shard, or every 5 s), systemd (STATUS= and
// EXTEND_TIMEOUT_USEC=, so a load that progresses does not hit TimeoutStartSec) and the
// startup gauges. Called from the engine's loading threads, one call at a time.
class LoadReporter {
 public:
  LoadReporter(verifyd::SystemdNotifier* systemd, verifyd::server::StartupMetrics* metrics)
      : systemd_(systemd), metrics_(metrics) {}

  void operator()(const verifyd::tp::LoadProgress& p) {
    const double gb = static_cast<double>(p.bytes_read) / 1e9;
    const double total_gb = static_cast<double>(p.bytes_total) / 1e9;
    const double s = p.elapsed_s;
    const double rate = s > 0 ? gb / s : 0.0;
    last_ = p;
    metrics_->SetProgress(p.bytes_read, p.bytes_total, s);
    const std::string status = absl::StrFormat("loading %d/%d shards, %.1f/%.1f GB, %.2f GB/s",
                                               p.files_done, p.files_total, gb, total_gb, rate);
    (void)systemd_->NotifyStatus(status);
    (void)systemd_->ExtendTimeout(kExtendBy);
    const absl::Time now = absl::Now();
    if (p.files_done != last_files_done_ || now - last_log_ >= absl::Seconds(5)) {
      last_files_done_ = p.files_done;
      last_log_ = now;
      spdlog::info("model load: {}/{} shards, {:.2f}/{:.2f} GB, {:.2f} GB/s, {:.1f} s",
                   p.files_done, p.files_total, gb, total_gb, rate, s);
    }
  }

  // The load is over after `elapsed`: the gauges keep the last byte counts.
  void Done(absl::Duration elapsed) {
    metrics_->SetProgress(last_.bytes_read, last_.bytes_total, absl::ToDoubleSeconds(elapsed));
  }

 private:
  // Each report extends the start-up timeout by this much: a load that stops reporting
  // progress for longer fails the unit's start (TimeoutStartSec counts again).
  static constexpr absl::Duration kExtendBy = absl::Seconds(120);
  verifyd::SystemdNotifier* systemd_;
  verifyd::server::StartupMetrics* metrics_;
  verifyd::tp::LoadProgress last_;
  int last_files_done_ = -1;
  absl::Time last_log_ = absl::InfinitePast();
};

// --print_memory_plan: the plan (tp/memory_plan.h) of the model the flags name, nothing
// loaded. 0 when it fits; 2 with the error when it does not or the input is bad.
int PrintMemoryPlan(const verifyd::tp::EngineOptions& engine, double device_memory_gb) {
  if (!(device_memory_gb > 0) || device_memory_gb > 1e6) {
    std::fprintf(stderr, "verifyd: --device_memory_gb: must be in (0, 1e6], got %g\n",
                 device_memory_gb);
    return 2;
  }
  absl::StatusOr<verifyd::tp::ModelConfig> config =
      verifyd::tp::ModelConfigOf(engine.model, engine.preset_layers);
  if (!config.ok()) {
    std::fprintf(stderr, "verifyd: --model: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  absl::StatusOr<verifyd::tp::MemoryPlan> plan = verifyd::tp::PlanRankMemory(
      *config,
      verifyd::tp::MemoryPlanOptionsOf(engine, static_cast<int64_t>(device_memory_gb * 1e9)));
  if (!plan.ok()) {
    std::fprintf(stderr, "verifyd: %s\n", std::string(plan.status().message()).c_str());
    return 2;
  }
  std::cout << verifyd::tp::FormatMemoryPlan(*plan) << std::flush;
  if (!plan->fit.ok()) {
    std::fprintf(stderr, "verifyd: %s\n", std::string(plan->fit.message()).c_str());
    return 2;
  }
  return 0;
}

// Usage, flag parsing, --help and the log level. Returns the exit code when verifyd is to stop
// here (help: 0; a usage error: 2), else -1.
int ParseCommandLine(int argc, char** argv) {
  // --help lists every verifyd flag (Abseil's default lists only flags of source files named
  // like the program: "No flags matched"), file names without the build machine's directories;
  // help exits 0 (Abseil's internal parse entry point: its public one exits 1 after help).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  usage.normalize_filename = [](absl::string_view file) {
    const size_t at = file.rfind("server/");
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "speculative-decoding tree verification service\n"
      "  verifyd --model=PRESET|CHECKPOINT_DIR [--backend=auto|cuda|cpu] [--tp=N] [flags]\n"
      "(README: \"Run the server\"; every flag below, with its default)");
  if (const std::string error = UsageError(argc, argv); !error.empty()) {
    std::fprintf(stderr, "verifyd: %s (verifyd --help lists every flag)\n", error.c_str());
    return 2;
  }
  absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  if (absl::flags_internal::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) >= 0) {
    return 0;
  }
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%fZ level=%l %v", spdlog::pattern_time_type::utc);
  const std::string level = absl::GetFlag(FLAGS_log_level);
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    spdlog::critical("--log_level: '{}' is not one of trace, debug, info, warn, error", level);
    return 2;
  }
  spdlog::set_level(parsed);

  return -1;
}

// The engine to load, from the flags; InvalidArgument with the message for a bad value.
absl::StatusOr<verifyd::server::EngineSpec> EngineSpecFromFlags() {
  verifyd::server::EngineSpec spec;
  spec.backend = absl::GetFlag(FLAGS_backend);
  spec.engine.model = absl::GetFlag(FLAGS_model);
  spec.engine.seed = absl::GetFlag(FLAGS_seed);
  spec.engine.preset_layers = absl::GetFlag(FLAGS_preset_layers);
  spec.engine.tp = absl::GetFlag(FLAGS_tp);
  spec.engine.kv_slots = absl::GetFlag(FLAGS_kv_slots);
  {
    absl::StatusOr<verifyd::tp::KvDtype> kv =
        verifyd::tp::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
    if (!kv.ok()) return absl::InvalidArgumentError(absl::StrCat("--", kv.status().message()));
    spec.engine.kv_dtype = *kv;
  }
  spec.engine.limits.max_batch = absl::GetFlag(FLAGS_max_batch);
  for (absl::string_view d :
       absl::StrSplit(absl::GetFlag(FLAGS_cuda_devices), ',', absl::SkipEmpty())) {
    int dev = -1;
    if (!absl::SimpleAtoi(d, &dev) || dev < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--cuda_devices: '", d, "' is not a device number"));
    }
    spec.engine.cuda.devices.push_back(dev);
  }
  spec.engine.cuda.fp8_experts = absl::GetFlag(FLAGS_fp8_experts);
  spec.engine.cuda.fp8_staging_keys = absl::GetFlag(FLAGS_fp8_staging_keys);
  spec.engine.cuda.expert_parallel = absl::GetFlag(FLAGS_expert_parallel);
  spec.engine.cuda.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  {
    absl::StatusOr<verifyd::kernels::cuda::VerifyKernelConfig> vk =
        verifyd::kernels::cuda::ParseVerifyKernelConfig(absl::GetFlag(FLAGS_verify_config),
                                                        "--verify_config");
    if (!vk.ok()) return vk.status();
    spec.engine.cuda.verify_config = *vk;
  }
  spec.engine.cuda.slice_rank = absl::GetFlag(FLAGS_slice_rank);
  spec.testing_fault = absl::GetFlag(FLAGS_testing_fault);
  return spec;
}

// The server's options from the flags; an engine failure asks `stop` to stop with exit code 1.
verifyd::server::ServerOptions ServerOptionsFromFlags(StopState* stop) {
  verifyd::server::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.served_model_name = absl::GetFlag(FLAGS_served_model_name).empty()
                                  ? absl::GetFlag(FLAGS_model)
                                  : absl::GetFlag(FLAGS_served_model_name);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.max_batch = absl::GetFlag(FLAGS_max_batch);
  options.max_queue = absl::GetFlag(FLAGS_max_queue);
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  options.session_ttl = absl::Seconds(absl::GetFlag(FLAGS_session_ttl_s));
  options.reflection = absl::GetFlag(FLAGS_reflection);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.security.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.security.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  options.security.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  options.security.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  options.max_call_deadline = absl::Seconds(absl::GetFlag(FLAGS_max_call_deadline_s));
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.max_threads = absl::GetFlag(FLAGS_max_threads);
  options.max_metadata_bytes = absl::GetFlag(FLAGS_max_metadata_bytes);
  options.on_engine_failure = [stop] { RequestStop(stop, 1, "engine failed"); };
  return options;
}

// The systemd watchdog (pings while the engine makes progress) and the --stall_timeout_s
// monitor (health NOT_SERVING while a step runs longer than it).
void StartMonitors(verifyd::server::Server* srv, int stall_timeout_s,
                   verifyd::SystemdNotifier& systemd, verifyd::SystemdNotifier& stall_monitor) {
  // systemd (Type=notify): STATUS and EXTEND_TIMEOUT_USEC while loading, READY once serving;
  // the watchdog pings while the engine makes progress (a load counts as progress; no step
  // running longer than WatchdogSec, engine not failed).
  if (systemd.watchdog_timeout() > absl::ZeroDuration()) {
    spdlog::info("systemd watchdog: interval {} ms",
                 absl::ToInt64Milliseconds(systemd.watchdog_timeout()));
  }
  if (auto st = systemd.StartWatchdogOnHealth(
          [srv, limit = systemd.watchdog_timeout()] { return srv->engine_progressing(limit); });
      !st.ok()) {
    spdlog::warn("systemd watchdog: {}", st.ToString());
  }
  // --stall_timeout_s: health NOT_SERVING while a step runs longer (a monitor of its own: it
  // sends no watchdog pings).
  if (stall_timeout_s > 0) {
    const absl::Duration bound = absl::Seconds(stall_timeout_s);
    verifyd::SystemdNotifier::WatchdogOptions wo;
    wo.stall_after = bound;
    wo.ping_interval = std::min(bound / 4, absl::Seconds(1));
    wo.send_pings = false;
    wo.on_stall_change = [srv](bool stalled) { srv->SetStalled(stalled); };
    if (auto st = stall_monitor.StartWatchdogOnHealth(
            [srv, bound] { return srv->engine_progressing(bound); }, std::move(wo));
        !st.ok()) {
      spdlog::warn("--stall_timeout_s: {}", st.ToString());
    }
  }
}

// Waits for a stop request, then drains and returns the exit code (after an engine failure:
// answers UNAVAILABLE for the linger and exits at once).
int WaitAndStop(StopState& stop, verifyd::server::Server* srv,
                const verifyd::server::ServerOptions& options, verifyd::SystemdNotifier& systemd,
                verifyd::SystemdNotifier& stall_monitor) {
  int code = 0;
  {
    absl::MutexLock lock(&stop.mu);
    stop.mu.Await(absl::Condition(&stop.stop));
    code = stop.exit_code;
    spdlog::info("stopping: {}", stop.reason);
  }
  if (code != 0 && srv->engine_failed()) {
    // Nothing left to drain: every call is answered UNAVAILABLE (the gate refuses them). Keep
    // answering for the linger, then exit without gRPC's shutdown, which would answer calls
    // arriving during it CANCELLED; the closed connections read as UNAVAILABLE to clients.
    (void)systemd.NotifyStopping("engine failed");
    spdlog::info("engine failed: answering UNAVAILABLE for {} ms, then exit code={}",
                 absl::ToInt64Milliseconds(options.failure_linger), code);
    absl::SleepFor(options.failure_linger);
    spdlog::default_logger()->flush();
    std::_Exit(code);
  }
  (void)systemd.NotifyStopping("draining");
  srv->Shutdown(absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s)));
  stall_monitor.StopWatchdog();
  systemd.StopWatchdog();
  spdlog::info("exit code={}", code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  if (const int code = ParseCommandLine(argc, argv); code >= 0) return code;

  // Every thread inherits this mask; one thread takes the signals with sigwait.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  absl::StatusOr<verifyd::server::EngineSpec> spec_or = EngineSpecFromFlags();
  if (!spec_or.ok()) {
    std::fprintf(stderr, "verifyd: %s\n", std::string(spec_or.status().message()).c_str());
    return 2;
  }
  verifyd::server::EngineSpec& spec = *spec_or;
  if (absl::GetFlag(FLAGS_print_memory_plan)) {
    return PrintMemoryPlan(spec.engine, absl::GetFlag(FLAGS_device_memory_gb));
  }
  StopState stop;
  const verifyd::server::ServerOptions options = ServerOptionsFromFlags(&stop);
  const int stall_timeout_s = absl::GetFlag(FLAGS_stall_timeout_s);
  if (stall_timeout_s < 0) {
    std::fprintf(stderr, "verifyd: --stall_timeout_s: must be >= 0 (0 disables)\n");
    return 2;
  }
  // Listeners first: probes, scrapes and clients get answers (NOT_SERVING, the load gauges,
  // UNAVAILABLE "model loading") while the model loads.
  auto server = verifyd::server::Server::Start(options);
  if (!server.ok()) {
    spdlog::critical("server: {}", server.status().ToString());
    return 2;
  }
  verifyd::server::Server* srv = server->get();

  verifyd::SystemdNotifier systemd;  // no-op outside systemd
  verifyd::SystemdNotifier stall_monitor;
  StartMonitors(srv, stall_timeout_s, systemd, stall_monitor);

  // A signal during the load stops verifyd at once (nothing is served yet, nothing to drain).
  static std::atomic<bool> loading{true};
  std::thread signals([&stop, sigs] {
    int sig = 0;
    if (sigwait(&sigs, &sig) == 0) {
      if (loading.load()) {
        spdlog::info("stopping: {} during the model load; exit code=0",
                     sig == SIGTERM ? "SIGTERM" : "SIGINT");
        spdlog::default_logger()->flush();
        std::_Exit(0);
      }
      RequestStop(&stop, 0, sig == SIGTERM ? "SIGTERM" : "SIGINT");
    }
  });
  signals.detach();  // stays blocked in sigwait if the engine fails first

  spdlog::info("loading model={} backend={} tp={} kv_slots={} kv_dtype={}", spec.engine.model,
               spec.backend, spec.engine.tp, spec.engine.kv_slots,
               verifyd::tp::KvDtypeName(spec.engine.kv_dtype));
  (void)systemd.NotifyStatus(absl::StrCat("loading model ", spec.engine.model));
  const absl::Time load_start = absl::Now();
  LoadReporter reporter(&systemd, srv->startup_metrics());
  spec.on_load_progress = [&reporter](const verifyd::tp::LoadProgress& p) { reporter(p); };
  auto engine = verifyd::server::CreateEngine(spec);
  if (!engine.ok()) {
    spdlog::critical("engine: {}", engine.status().ToString());
    loading = false;
    return 2;
  }
  reporter.Done(absl::Now() - load_start);
  if (const verifyd::tp::EngineMemory m = (*engine)->memory(); m.device_bytes > 0) {
    spdlog::info(
        "memory (first GPU, GB): device {:.2f}, weights {:.2f} + workspaces {:.2f} planned, "
        "{:.2f} in use before the KV pool (measured); KV pool {:.2f} = {} tokens x {} bytes",
        m.device_bytes / 1e9, m.weight_bytes / 1e9, m.workspace_bytes / 1e9,
        m.used_before_kv_bytes / 1e9, m.kv_cache_bytes / 1e9, m.kv_tokens, m.kv_bytes_per_token);
  }
  if (spec.engine.cuda.slice_rank >= 0) {
    spdlog::warn("--slice_rank={}: rank {} of tp {} runs alone; answers are NOT the model's",
                 spec.engine.cuda.slice_rank, spec.engine.cuda.slice_rank, spec.engine.tp);
  }
  if (auto st = srv->AttachEngine(*std::move(engine)); !st.ok()) {
    spdlog::critical("engine: {}", st.ToString());
    loading = false;
    return 2;
  }
  loading = false;
  spdlog::info("model loaded in {:.2f} s", absl::ToDoubleSeconds(absl::Now() - load_start));
  if (auto st = systemd.NotifyReady(absl::StrCat("serving port=", srv->port())); !st.ok()) {
    spdlog::warn("systemd: {}", st.ToString());
  }

  return WaitAndStop(stop, srv, options, systemd, stall_monitor);
}
