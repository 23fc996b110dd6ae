// SystemdNotifier: sd_notify(3) readiness, status, stopping and an engine-progress watchdog.
#include "server/systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace verifyd {

SystemdNotifier::SystemdNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  enabled_ = socket != nullptr && socket[0] != '\0';
  // sd_watchdog_enabled() checks $WATCHDOG_PID against our pid, so a child process that
  // inherited the environment does not ping on our behalf.
  uint64_t usec = 0;
  if (enabled_ && sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0 && usec > 0) {
    watchdog_timeout_ = absl::Microseconds(static_cast<int64_t>(usec));
  }
}

SystemdNotifier::~SystemdNotifier() { StopWatchdog(); }

absl::Status SystemdNotifier::Send(const std::string& message) {
  if (!enabled_) return absl::OkStatus();
  const int r = sd_notify(/*unset_environment=*/0, message.c_str());
  if (r < 0) {
    const std::string first_line = message.substr(0, message.find('\n'));
    return absl::UnavailableError(absl::StrCat(
        "sd_notify(\"", first_line, "\") to $NOTIFY_SOCKET failed: ", std::strerror(-r)));
  }
  return absl::OkStatus();
}

namespace {
// A STATUS= value is one line; newlines would start a new (bogus) assignment.
std::string OneLine(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}
}  // namespace

absl::Status SystemdNotifier::NotifyReady(std::string_view status) {
  return Send(absl::StrCat("READY=1\nSTATUS=", OneLine(status)));
}

absl::Status SystemdNotifier::NotifyStatus(std::string_view status) {
  return Send(absl::StrCat("STATUS=", OneLine(status)));
}

absl::Status SystemdNotifier::NotifyStopping(std::string_view status) {
  return Send(absl::StrCat("STOPPING=1\nSTATUS=", OneLine(status)));
}

absl::Status SystemdNotifier::ExtendTimeout(absl::Duration d) {
  if (d <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ExtendTimeout: duration must be positive");
  }
  return Send(absl::StrCat("EXTEND_TIMEOUT_USEC=", absl::ToInt64Microseconds(d)));
}

absl::Status SystemdNotifier::StartWatchdog(ProgressProbe probe, WatchdogOptions options) {
  if (!probe) return absl::InvalidArgumentError("StartWatchdog: probe is empty");
  // The stall rule: work pending and no finished step for `stall_after`. State lives in the
  // closure, which only the watchdog thread calls.
  struct State {
    EngineProgress last;
    absl::Time last_change;  // last time the engine was idle or finished a step
    bool primed = false;
  };
  auto state = std::make_shared<State>();
  const absl::Duration stall_after =
      options.stall_after > absl::ZeroDuration() ? options.stall_after : watchdog_timeout_;
  StallCheck check = [probe = std::move(probe), state,
                      stall_after](absl::Time now) -> std::optional<std::string> {
    const EngineProgress p = probe();
    if (!state->primed || !p.work_pending || p.steps_completed != state->last.steps_completed) {
      state->last_change = now;
      state->primed = true;
    }
    state->last = p;
    if (now - state->last_change < stall_after) return std::nullopt;
    return absl::StrCat("engine stalled: work pending and no step finished for ",
                        absl::FormatDuration(now - state->last_change));
  };
  return Start(std::move(check), std::move(options));
}

absl::Status SystemdNotifier::StartWatchdogOnHealth(HealthCheck healthy, WatchdogOptions options) {
  if (!healthy) return absl::InvalidArgumentError("StartWatchdogOnHealth: check is empty");
  StallCheck check = [healthy = std::move(healthy)](absl::Time) -> std::optional<std::string> {
    if (healthy()) return std::nullopt;
    return std::string("engine not progressing (health check failed)");
  };
  return Start(std::move(check), std::move(options));
}

absl::Status SystemdNotifier::Start(StallCheck check, WatchdogOptions options) {
  if (options.stall_after < absl::ZeroDuration() || options.ping_interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "StartWatchdog: stall_after and ping_interval must not be negative");
  }
  const bool ping = options.send_pings && watchdog_timeout_ > absl::ZeroDuration();
  if (!ping && options.on_stall_change &&
      (options.stall_after <= absl::ZeroDuration() ||
       options.ping_interval <= absl::ZeroDuration())) {
    return absl::InvalidArgumentError(
        "StartWatchdog: without a systemd watchdog, on_stall_change needs stall_after and "
        "ping_interval");
  }
  absl::MutexLock lock(&mu_);
  if (started_) return absl::FailedPreconditionError("StartWatchdog: already started");
  if (!ping && !options.on_stall_change) return absl::OkStatus();  // nothing to do
  started_ = true;
  const absl::Duration interval =
      options.ping_interval > absl::ZeroDuration() ? options.ping_interval : watchdog_timeout_ / 3;
  thread_ = std::thread([this, check = std::move(check), interval,
                         cb = std::move(options.on_stall_change),
                         ping] { WatchdogLoop(check, interval, cb, ping); });
  return absl::OkStatus();
}

void SystemdNotifier::StopWatchdog() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

uint64_t SystemdNotifier::pings_sent() const {
  absl::MutexLock lock(&mu_);
  return pings_;
}

void SystemdNotifier::WatchdogLoop(const StallCheck& check, absl::Duration interval,
                                   const std::function<void(bool)>& on_stall_change, bool ping) {
  (void)check(absl::Now());  // prime the check's state
  bool stalled = false;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), interval)) return;
    }
    if (const std::optional<std::string> reason = check(absl::Now())) {
      if (!stalled) {
        stalled = true;
        const std::string why = absl::StrCat(*reason, "; watchdog pings stopped");
        spdlog::error("watchdog: {}", why);
        (void)NotifyStatus(why);
        if (on_stall_change) on_stall_change(true);
      }
      continue;  // no ping: systemd restarts us after WatchdogSec
    }
    if (stalled) {
      stalled = false;
      spdlog::warn("watchdog: engine progressing again; pings resumed");
      (void)NotifyStatus("engine progressing again");
      if (on_stall_change) on_stall_change(false);
    }
    if (!ping) continue;
    const absl::Status s = Send("WATCHDOG=1");
    if (!s.ok()) {
      spdlog::warn("watchdog: {}", s.ToString());
      continue;
    }
    absl::MutexLock lock(&mu_);
    ++pings_;
  }
}

}  // namespace verifyd
