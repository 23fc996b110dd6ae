// Child processes for tests that run the real verifyd / verifyctl binaries: a free loopback
// port, spawning with output to a log file, waiting with a timeout, their files (temporary
// paths, whole-file reads) and their Prometheus pages.
// Thread-safety: reentrant free functions.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace verifyd::test {

// A free TCP port on 127.0.0.1 (bound and released; racy but fine on a test machine).
int FreePort();

// Starts `args` (args[0] = executable) with `env` added to the environment and
// stdout+stderr appended to `log_path`; returns the pid.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path,
            const std::vector<std::pair<std::string, std::string>>& env = {});

// Waits up to `timeout`; the exit code, or -1 on timeout (then SIGKILLed) or a signal.
int WaitExit(pid_t pid, absl::Duration timeout);

// The whole file ("" when unreadable).
std::string ReadFile(const std::string& path);

// $TEST_TMPDIR (or /tmp) / <prefix>_<pid>_<name>: per process, so parallel tests do not meet.
std::string TempPath(const std::string& prefix, const std::string& name);

// A series name without its model_name label (verifyd labels every series with the served
// model name): `a{model_name="m",b="c"}` -> `a{b="c"}`, `a{model_name="m"}` -> `a`.
std::string WithoutModelName(absl::string_view series);

// The value of the sample `series value` in a Prometheus text page, the series' model_name
// label ignored (`series` is written without it); -1 if absent.
double MetricValue(const std::string& page, const std::string& series);

}  // namespace verifyd::test
