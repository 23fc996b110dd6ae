// Child processes for tests that run the real verifyd / verifyctl binaries: a free loopback
// port, spawning with output to a log file, and waiting with a timeout.
// Thread-safety: reentrant free functions.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

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

}  // namespace verifyd::test
