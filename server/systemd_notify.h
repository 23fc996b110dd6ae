// SystemdNotifier: tells systemd (Type=notify units) when verifyd is ready, what it is doing,
// when it is stopping, and — through a watchdog thread — that the engine still makes progress.
//
// Protocol: sd_notify(3) datagrams to $NOTIFY_SOCKET ("READY=1", "STATUS=...",
// "STOPPING=1", "EXTEND_TIMEOUT_USEC=...", "WATCHDOG=1"). Everything is a no-op when
// $NOTIFY_SOCKET is unset (not under systemd), so main() can call it unconditionally.
//
// Watchdog semantics (systemd WatchdogSec=): the thread pings every watchdog_timeout/3 *only
// while the engine is healthy*. Two ways to say "healthy": StartWatchdog() takes a progress
// probe (a monotonically increasing count of finished engine steps and whether work is
// waiting; stalled = work waiting and the count unchanged for `stall_after`);
// StartWatchdogOnHealth() takes a bool check the caller computes itself. While stalled the
// pings stop (and a STATUS line says why), so systemd kills and restarts the unit once
// WatchdogSec passes without a ping. Pings resume by themselves if the engine recovers before
// that. An idle engine (no work waiting) is healthy. An optional callback hears about stalls
// and recoveries (e.g. to turn gRPC health NOT_SERVING, which a Kubernetes liveness probe
// sees); with it, the same monitor runs without systemd too.
//
// Thread-safety: all public methods may be called from any thread. One StartWatchdog*() per
// object; the destructor stops the watchdog thread. The probe / check is called from the
// watchdog thread and must be thread-safe and cheap (read a few atomics).
//
// Dependencies: libsystemd, Abseil and spdlog only (no other verifyd code), so it can be
// tested alone.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace verifyd {

// What the watchdog thread asks the engine each tick.
struct EngineProgress {
  uint64_t steps_completed = 0;  // monotonically increasing count of finished engine steps
  bool work_pending = false;     // true when requests are queued or a step is running
};

class SystemdNotifier {
 public:
  using ProgressProbe = std::function<EngineProgress()>;

  struct WatchdogOptions {
    // Work pending with no finished step for this long counts as a stall. Zero means "use the
    // systemd watchdog timeout" (WatchdogSec), so a kill follows ~2 x WatchdogSec after the
    // last finished step.
    absl::Duration stall_after = absl::ZeroDuration();
    // Ping period; zero means watchdog_timeout / 3 (systemd recommends < half).
    absl::Duration ping_interval = absl::ZeroDuration();
    // Called from the watchdog thread when the engine becomes stalled (true) and when it
    // progresses again (false), e.g. to set gRPC health NOT_SERVING so a Kubernetes liveness
    // probe restarts the pod. With this set, the progress monitor also runs without a
    // systemd watchdog (then stall_after and ping_interval must be given, and no pings are
    // sent).
    std::function<void(bool stalled)> on_stall_change;
    // False: a monitor only (on_stall_change with its own stall_after / ping_interval), never
    // WATCHDOG=1, even under a systemd watchdog; e.g. a second notifier that turns health
    // NOT_SERVING on a bound other than WatchdogSec without feeding systemd's watchdog.
    bool send_pings = true;
  };

  SystemdNotifier();
  ~SystemdNotifier();
  SystemdNotifier(const SystemdNotifier&) = delete;
  SystemdNotifier& operator=(const SystemdNotifier&) = delete;

  // True when $NOTIFY_SOCKET is set (running under a Type=notify unit).
  bool enabled() const { return enabled_; }

  // The WatchdogSec= timeout systemd asked for ($WATCHDOG_USEC for this pid), or zero when the
  // watchdog is off.
  absl::Duration watchdog_timeout() const { return watchdog_timeout_; }

  // "READY=1" plus a STATUS line. Call after the model is loaded, the communicators are up and
  // the gRPC server listens.
  absl::Status NotifyReady(std::string_view status);
  // "STATUS=<text>" (shown by `systemctl status`).
  absl::Status NotifyStatus(std::string_view status);
  // "STOPPING=1" plus a STATUS line: call when draining starts.
  absl::Status NotifyStopping(std::string_view status);
  // "EXTEND_TIMEOUT_USEC=<d>": asks for `d` more start-up (or stop) time, e.g. while a large
  // model loads. Must be repeated before it runs out.
  absl::Status ExtendTimeout(absl::Duration d);

  // Starts the watchdog thread when systemd enabled the watchdog ($WATCHDOG_USEC set for this
  // pid) or options.on_stall_change is set; otherwise returns OK and starts nothing. `probe`
  // must outlive the notifier or StopWatchdog(). Errors: already started
  // (FAILED_PRECONDITION), null probe, negative durations, or on_stall_change without systemd
  // and without explicit stall_after / ping_interval (INVALID_ARGUMENT).
  absl::Status StartWatchdog(ProgressProbe probe, WatchdogOptions options);
  absl::Status StartWatchdog(ProgressProbe probe) { return StartWatchdog(std::move(probe), {}); }
  // The same watchdog when the caller judges progress itself: pings while `healthy()` returns
  // true, e.g. [srv, t = notifier.watchdog_timeout()] { return srv->engine_progressing(t); }.
  // options.stall_after is unused here.
  using HealthCheck = std::function<bool()>;
  absl::Status StartWatchdogOnHealth(HealthCheck healthy, WatchdogOptions options);
  absl::Status StartWatchdogOnHealth(HealthCheck healthy) {
    return StartWatchdogOnHealth(std::move(healthy), {});
  }
  // Stops and joins the watchdog thread (idempotent).
  void StopWatchdog();

  // Number of WATCHDOG=1 pings sent so far (for tests and logs).
  uint64_t pings_sent() const;

 private:
  // Returns why the engine counts as stalled at `now`, or nullopt when it is healthy. Called
  // only from the watchdog thread.
  using StallCheck = std::function<std::optional<std::string>(absl::Time now)>;
  absl::Status Send(const std::string& message);
  absl::Status Start(StallCheck check, WatchdogOptions options);
  void WatchdogLoop(const StallCheck& check, absl::Duration interval,
                    const std::function<void(bool)>& on_stall_change, bool ping);

  bool enabled_ = false;
  absl::Duration watchdog_timeout_ = absl::ZeroDuration();

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t pings_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // the watchdog thread; joined by StopWatchdog()
};

}  // namespace verifyd
