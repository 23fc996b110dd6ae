#include "tests/process_util.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace verifyd::test {

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path,
            const std::vector<std::pair<std::string, std::string>>& env) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

int WaitExit(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TempPath(const std::string& prefix, const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", prefix, "_", ::getpid(), "_", name);
}

std::string WithoutModelName(absl::string_view series) {
  std::string s(series);
  const size_t at = s.find("model_name=\"");
  if (at == std::string::npos) return s;
  const size_t close = s.find('"', at + 12);
  if (close == std::string::npos) return s;
  size_t end = close + 1;
  if (end < s.size() && s[end] == ',') ++end;
  s.erase(at, end - at);
  if (at > 0 && s[at - 1] == ',' && at < s.size() && s[at] == '}') s.erase(at - 1, 1);
  const size_t empty = s.find("{}");
  if (empty != std::string::npos) s.erase(empty, 2);
  return s;
}

double MetricValue(const std::string& page, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ');
    double v = 0;
    if (f.size() == 2 && WithoutModelName(f[0]) == series && absl::SimpleAtod(f[1], &v)) return v;
  }
  return -1;
}

}  // namespace verifyd::test
