// The verifyd and verifyctl executables: SIGTERM drains and exits 0, `--backend cuda`
// without CUDA fails clearly, usage errors exit 2 with one line, the listeners answer while
// the model loads (and a checkpoint load reports its progress), a stuck step turns health
// NOT_SERVING, verifyctl's subcommands and demo work against a live verifyd.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/verify_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/testing/test_server.h"
#include "tests/process_util.h"
#include "tp/presets.h"

namespace {

using ::testing::HasSubstr;

using ::verifyd::test::FreePort;
using ::verifyd::test::Spawn;
using ::verifyd::test::WaitExit;

using ::verifyd::test::MetricValue;
using ::verifyd::test::ReadFile;

std::string TempPath(const std::string& name) {
  return verifyd::test::TempPath("verifyd_main_test", name);
}

// Runs a command, returns (exit code, stdout+stderr).
std::pair<int, std::string> RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t k;
  while ((k = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, k);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Runs `cmd`, expecting exit code `rc` and each of `want` in its output.
void ExpectCommand(const std::string& cmd, int rc, const std::vector<std::string>& want = {}) {
  auto [got_rc, out] = RunCommand(cmd);
  EXPECT_EQ(got_rc, rc) << cmd << "\n" << out;
  for (const std::string& w : want) EXPECT_THAT(out, HasSubstr(w)) << cmd;
}

bool WaitServing(verifyd::client::VerifyClient& c, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    auto h = c.Health();
    if (h.ok() && *h == verifyd::client::HealthStatus::kServing) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

std::string Page(int port) {
  return verifyd::server::testing::HttpGet(port, "/metrics").value_or("");
}

// verifyd run with `flags`, listening on a free loopback port and logging to
// TempPath(log_name); `env` is added to its environment.
struct Verifyd {
  const int port = FreePort();
  const std::string target = absl::StrCat("127.0.0.1:", port);
  const std::string log;
  pid_t pid = -1;

  Verifyd(const std::string& log_name, const std::vector<std::string>& flags,
          const std::vector<std::pair<std::string, std::string>>& env = {})
      : log(TempPath(log_name)) {
    std::vector<std::string> args = {VERIFYD_BINARY, "--listen=" + target};
    args.insert(args.end(), flags.begin(), flags.end());
    pid = Spawn(args, log, env);
  }
};

#ifdef VERIFYD_WITH_SYSTEMD
// A datagram socket bound at `path` (removed first) standing in for systemd's notify socket,
// its receives timing out after 100 ms; -1 when it cannot be made.
int NotifySocket(const std::string& path) {
  ::unlink(path.c_str());
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  std::strcpy(addr.sun_path, path.c_str());
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM, 0);
  if (fd < 0) return -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int bind_errno = errno;
    ::close(fd);
    errno = bind_errno;
    return -1;
  }
  timeval tv{0, 100000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}
#endif

TEST(VerifydMain, UsageErrorsExitTwoWithOneLine) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--no_such_flag"}, "verifyd: unknown flag --no_such_flag"},
      {{"--tp=abc"}, "verifyd: --tp: "},
      {{"--tp"}, "verifyd: --tp: missing value"},
      {{"stray"}, "verifyd: unexpected argument 'stray'"},
  };
  for (const auto& [args, want] : cases) {
    std::vector<std::string> argv = {VERIFYD_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    const std::string log = TempPath("usage.log");
    ::unlink(log.c_str());
    const pid_t pid = Spawn(argv, log);
    EXPECT_EQ(WaitExit(pid, absl::Seconds(20)), 2) << args[0];
    const std::string text = ReadFile(log);
    EXPECT_THAT(text, HasSubstr(want));
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  }
  // Flags that exist keep working, --noflag for a bool included.
  const std::string log = TempPath("usage_ok.log");
  const pid_t pid = Spawn({VERIFYD_BINARY, "--nobatch_invariant", "--tp", "1", "--help"}, log);
  EXPECT_EQ(WaitExit(pid, absl::Seconds(20)), 0) << ReadFile(log);
}

// While the model loads (--testing_fault=load:<ms> makes it slow): the API port answers health
// NOT_SERVING and every call UNAVAILABLE "model loading", the health port NOT_SERVING, /metrics
// verifyd_model_loaded 0; then SERVING, and the calls work.
TEST(VerifydMain, ListenersAnswerWhileTheModelLoads) {
  const int health_port = FreePort();
  const int metrics_port = FreePort();
  const Verifyd v("loading.log", {"--backend=cpu", "--kv_slots=4096", "--testing_fault=load:4000",
                                  "--served_model_name=kimi-test",
                                  absl::StrCat("--health_listen=127.0.0.1:", health_port),
                                  absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)});
  ASSERT_GT(v.pid, 0);
  verifyd::client::VerifyClient api(v.target, absl::Seconds(2));
  verifyd::client::VerifyClient probe(absl::StrCat("127.0.0.1:", health_port), absl::Seconds(2));
  // Up within a second or so of the start, long before the 4 s load ends.
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  absl::StatusOr<verifyd::client::HealthStatus> h = absl::UnknownError("not asked");
  while (absl::Now() < deadline) {
    h = api.Health();
    if (h.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(h.ok()) << h.status() << ReadFile(v.log);
  EXPECT_EQ(*h, verifyd::client::HealthStatus::kNotServing);
  EXPECT_EQ(probe.Health().value_or(verifyd::client::HealthStatus::kUnknown),
            verifyd::client::HealthStatus::kNotServing);
  auto info = api.GetInfo();
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("model loading"));
  auto open = api.Open({1, 2, 3});
  EXPECT_EQ(open.status().code(), absl::StatusCode::kUnavailable) << open.status();
  const std::string loading_page = Page(metrics_port);
  EXPECT_EQ(MetricValue(loading_page, "verifyd_model_loaded"), 0) << loading_page;
  EXPECT_THAT(loading_page, HasSubstr("verifyd_model_loaded{model_name=\"kimi-test\"} 0"));
  EXPECT_EQ(MetricValue(loading_page, "verifyd_active_sessions"), -1) << "engine metrics later";
  EXPECT_THAT(ReadFile(v.log), ::testing::Not(HasSubstr("serving listen=")));

  ASSERT_TRUE(WaitServing(api, absl::Seconds(30))) << ReadFile(v.log);
  EXPECT_EQ(probe.Health().value_or(verifyd::client::HealthStatus::kUnknown),
            verifyd::client::HealthStatus::kServing);
  auto s = api.Open({1, 2, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  const std::string page = Page(metrics_port);
  EXPECT_EQ(MetricValue(page, "verifyd_model_loaded"), 1) << page;
  EXPECT_EQ(MetricValue(page, "verifyd_active_sessions"), 1) << page;
  EXPECT_THAT(page, HasSubstr("verifyd_active_sessions{model_name=\"kimi-test\"} 1"));
  EXPECT_GE(MetricValue(page, "verifyd_model_load_seconds"), 4.0) << page;
  ASSERT_EQ(::kill(v.pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(v.pid, absl::Seconds(30)), 0) << ReadFile(v.log);
}

// A model that fails to load: exit 2 with the critical "engine:" line, after the listeners
// were up.
TEST(VerifydMain, LoadFailureExitsTwo) {
  const std::string log = TempPath("loadfail.log");
  const pid_t pid = Spawn({VERIFYD_BINARY, "--backend=cpu", "--model=no-such-preset",
                           "--listen=127.0.0.1:0", "--metrics_listen="},
                          log);
  EXPECT_EQ(WaitExit(pid, absl::Seconds(30)), 2) << ReadFile(log);
  const std::string text = ReadFile(log);
  EXPECT_THAT(text, HasSubstr("level=critical engine: "));
  EXPECT_THAT(text, HasSubstr("no-such-preset"));
  EXPECT_THAT(text, HasSubstr("listening (not serving until the model is loaded)"));
}

// A step running longer than --stall_timeout_s turns health NOT_SERVING on both ports (no
// systemd involved), and SERVING again once it finishes.
TEST(VerifydMain, StuckStepTurnsHealthNotServing) {
  const int health_port = FreePort();
  const Verifyd v(
      "stall.log",
      {"--backend=cpu", "--kv_slots=4096", "--testing_fault=slow:3000", "--stall_timeout_s=1",
       absl::StrCat("--health_listen=127.0.0.1:", health_port), "--metrics_listen="});
  verifyd::client::VerifyClient api(v.target, absl::Seconds(30));
  verifyd::client::VerifyClient probe(absl::StrCat("127.0.0.1:", health_port), absl::Seconds(5));
  ASSERT_TRUE(WaitServing(api, absl::Seconds(30))) << ReadFile(v.log);
  std::atomic<bool> done{false};
  absl::Status opened;
  std::thread call([&] {
    opened = api.Open({1, 2, 3}).status();  // one 3 s prefill step
    done = true;
  });
  bool api_not_serving = false, probe_not_serving = false;
  while (!done) {
    using verifyd::client::HealthStatus;
    if (probe.Health().value_or(HealthStatus::kUnknown) == HealthStatus::kNotServing) {
      probe_not_serving = true;
    }
    if (api.Health().value_or(HealthStatus::kUnknown) == HealthStatus::kNotServing) {
      api_not_serving = true;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  call.join();
  EXPECT_TRUE(opened.ok()) << opened;
  EXPECT_TRUE(probe_not_serving) << ReadFile(v.log);
  EXPECT_TRUE(api_not_serving) << ReadFile(v.log);
  EXPECT_TRUE(WaitServing(probe, absl::Seconds(5))) << ReadFile(v.log);
  EXPECT_THAT(ReadFile(v.log), HasSubstr("engine stalled: health NOT_SERVING"));
  ASSERT_EQ(::kill(v.pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(v.pid, absl::Seconds(30)), 0) << ReadFile(v.log);
}

TEST(VerifydMain, SigtermDrainsAndExitsZero) {
  const Verifyd v("sigterm.log", {"--backend=toy", "--metrics_listen=", "--kv_slots=4096"});
  ASSERT_GT(v.pid, 0);
  verifyd::client::VerifyClient c(v.target, absl::Seconds(5));
  ASSERT_TRUE(WaitServing(c, absl::Seconds(20))) << ReadFile(v.log);
  auto s = c.Open({1, 2, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(c.Verify(s->session_id, {}).ok());
  ASSERT_EQ(::kill(v.pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(v.pid, absl::Seconds(20)), 0) << ReadFile(v.log);
  const std::string text = ReadFile(v.log);
  EXPECT_THAT(text, HasSubstr("draining"));
  EXPECT_THAT(text, HasSubstr("level=info"));
}

#ifdef VERIFYD_WITH_SYSTEMD
// sd_notify protocol against a datagram socket the test owns: READY=1 once serving,
// WATCHDOG=1 pings at half of WATCHDOG_USEC while the engine progresses, STOPPING=1 on
// SIGTERM.
TEST(VerifydMain, NotifiesSystemdReadyWatchdogStopping) {
  const std::string sock_path = TempPath("notify.sock");
  const int fd = NotifySocket(sock_path);
  ASSERT_GE(fd, 0) << sock_path << ": " << std::strerror(errno);

  const Verifyd v("notify.log", {"--backend=toy", "--metrics_listen="},
                  {{"NOTIFY_SOCKET", sock_path}, {"WATCHDOG_USEC", "200000"}});
  ASSERT_GT(v.pid, 0);
  std::vector<std::string> messages;
  auto receive_for = [&](absl::Duration d) {
    const absl::Time deadline = absl::Now() + d;
    char buf[512];
    while (absl::Now() < deadline) {
      const ssize_t k = ::recv(fd, buf, sizeof(buf), 0);
      if (k > 0) messages.emplace_back(buf, static_cast<size_t>(k));
    }
  };
  verifyd::client::VerifyClient c(v.target, absl::Seconds(5));
  ASSERT_TRUE(WaitServing(c, absl::Seconds(20))) << ReadFile(v.log);
  receive_for(absl::Milliseconds(600));
  ASSERT_FALSE(messages.empty());
  // Each datagram is newline-separated assignments; READY=1 / STOPPING=1 come first in theirs.
  auto starts_with = [](const std::string& m, const std::string& p) { return m.rfind(p, 0) == 0; };
  // STATUS lines while the model loads, then READY=1 (in its own datagram).
  const auto ready = std::find_if(messages.begin(), messages.end(), [&](const std::string& m) {
    return starts_with(m, "READY=1\n") || m == "READY=1";
  });
  ASSERT_NE(ready, messages.end()) << messages[0];
  EXPECT_TRUE(starts_with(messages[0], "STATUS=loading model tiny")) << messages[0];
  const auto pings = std::count(messages.begin(), messages.end(), "WATCHDOG=1");
  EXPECT_GE(pings, 3) << "100 ms pings over 600 ms";
  ::kill(v.pid, SIGTERM);
  receive_for(absl::Milliseconds(300));
  EXPECT_EQ(WaitExit(v.pid, absl::Seconds(20)), 0) << ReadFile(v.log);
  EXPECT_TRUE(std::any_of(messages.begin(), messages.end(), [&](const std::string& m) {
    return starts_with(m, "STOPPING=1\n") || m == "STOPPING=1";
  }));
  ::close(fd);
  ::unlink(sock_path.c_str());
}
// A checkpoint load reports its progress: a log line per shard, systemd STATUS=loading ... with
// EXTEND_TIMEOUT_USEC (so a long load does not hit TimeoutStartSec), and the load gauges.
TEST(VerifydMain, CheckpointLoadReportsProgress) {
  const std::string dir = TempPath("ckpt");
  ASSERT_TRUE(verifyd::tp::WritePresetToDirectory("tiny", 5, dir, /*max_shard_bytes=*/200000).ok());
  int shards = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    shards += e.path().extension() == ".safetensors" ? 1 : 0;
  }
  ASSERT_GE(shards, 2);
  const std::string sock_path = TempPath("ckpt.sock");
  const int fd = NotifySocket(sock_path);
  ASSERT_GE(fd, 0) << sock_path << ": " << std::strerror(errno);
  const int metrics_port = FreePort();
  const Verifyd v("ckpt.log",
                  {"--backend=cpu", "--model=" + dir, "--tp=2", "--kv_slots=4096",
                   absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port)},
                  {{"NOTIFY_SOCKET", sock_path}});
  std::vector<std::string> messages;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool ready = false;
  while (!ready && absl::Now() < deadline) {
    char buf[512];
    const ssize_t k = ::recv(fd, buf, sizeof(buf), 0);
    if (k <= 0) continue;
    messages.emplace_back(buf, static_cast<size_t>(k));
    ready = messages.back().rfind("READY=1", 0) == 0;
  }
  ASSERT_TRUE(ready) << ReadFile(v.log);
  const std::string all = absl::StrJoin(messages, "|");
  EXPECT_THAT(all, HasSubstr(absl::StrCat("STATUS=loading ", shards, "/", shards, " shards, ")));
  EXPECT_THAT(all, HasSubstr(" GB/s"));
  EXPECT_THAT(all, HasSubstr("EXTEND_TIMEOUT_USEC=120000000"));
  EXPECT_THAT(ReadFile(v.log),
              HasSubstr(absl::StrCat("model load: ", shards, "/", shards, " shards")));
  const std::string page = Page(metrics_port);
  const double total = MetricValue(page, "verifyd_model_load_total_bytes");
  EXPECT_GT(total, 100000) << page;
  EXPECT_EQ(MetricValue(page, "verifyd_model_load_bytes"), total) << page;
  EXPECT_EQ(MetricValue(page, "verifyd_model_loaded"), 1) << page;
  // Every series is labelled with the served model name: by default the --model value.
  EXPECT_THAT(page, HasSubstr(absl::StrCat("verifyd_model_loaded{model_name=\"", dir, "\"} 1")));
  EXPECT_THAT(page, HasSubstr(absl::StrCat("verifyd_requests_total{model_name=\"", dir, "\",")));
  ASSERT_EQ(::kill(v.pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(v.pid, absl::Seconds(30)), 0) << ReadFile(v.log);
  ::close(fd);
  ::unlink(sock_path.c_str());
  std::filesystem::remove_all(dir);
}
#endif

TEST(VerifydMain, CudaBackendWithoutCudaFailsClearly) {
  const std::string log = TempPath("cuda.log");
  const pid_t pid =
      Spawn({VERIFYD_BINARY, "--backend=cuda", "--listen=127.0.0.1:0", "--metrics_listen="}, log);
  const int code = WaitExit(pid, absl::Seconds(60));
  const std::string text = ReadFile(log);
  if (code == -1) GTEST_SKIP() << "a CUDA build with a GPU started serving";
  EXPECT_NE(code, 0);
  EXPECT_THAT(text, HasSubstr("--backend cuda"));
}

// --help lists every verifyd flag (not Abseil's "No flags matched"), with source file names
// but no build-machine directories, and exits 0.
TEST(VerifydMain, HelpListsEveryFlagAndExitsZero) {
  const std::string log = TempPath("help.log");
  const pid_t pid = Spawn({VERIFYD_BINARY, "--help"}, log);
  EXPECT_EQ(WaitExit(pid, absl::Seconds(20)), 0);
  const std::string text = ReadFile(log);
  EXPECT_THAT(text, ::testing::Not(HasSubstr("No flags matched")));
  for (const char* flag : {"--model", "--backend", "--batch_invariant", "--kv_dtype", "--tp",
                           "--listen", "--metrics_listen", "--verify_config"}) {
    EXPECT_THAT(text, HasSubstr(flag));
  }
  EXPECT_THAT(text, HasSubstr("Flags from server/main.cc"));
  // --model's help names the presets.
  for (const std::string& preset : verifyd::tp::PresetNames()) EXPECT_THAT(text, HasSubstr(preset));
  EXPECT_THAT(text, ::testing::Not(HasSubstr(std::string(VERIFYD_SOURCE_ROOT) + "/")));
}

TEST(VerifydMain, BadFlagValueFailsNamingTheFlag) {
  const std::string log = TempPath("badflag.log");
  const pid_t pid = Spawn({VERIFYD_BINARY, "--backend=quantum", "--metrics_listen="}, log);
  EXPECT_NE(WaitExit(pid, absl::Seconds(20)), 0);
  EXPECT_THAT(ReadFile(log), HasSubstr("--backend"));
  const std::string kv_log = TempPath("badkv.log");
  const pid_t kv = Spawn({VERIFYD_BINARY, "--kv_dtype=fp4", "--metrics_listen="}, kv_log);
  EXPECT_EQ(WaitExit(kv, absl::Seconds(20)), 2);
  EXPECT_THAT(ReadFile(kv_log), HasSubstr("--kv_dtype: 'fp4' is not one of auto, fp8"));
  // The kernel configurations' names come from one table (verify_attention/config.h).
  const std::string vk_log = TempPath("badvk.log");
  const pid_t vk = Spawn({VERIFYD_BINARY, "--verify_config=w64", "--metrics_listen="}, vk_log);
  EXPECT_EQ(WaitExit(vk, absl::Seconds(20)), 2);
  EXPECT_THAT(ReadFile(vk_log),
              HasSubstr("--verify_config: 'w64' is not auto, m16, s64, km16 or s64staged"));
}

// --kv_dtype=fp8 on the cpu backend: the server loads the tiny preset, serves a session (the
// format's accuracy is tested by tp_reference_checkpoint_test) and exits 0 on SIGTERM.
TEST(VerifydMain, Fp8KvCacheServes) {
  const Verifyd v("kvfp8.log",
                  {"--backend=cpu", "--kv_dtype=fp8", "--metrics_listen=", "--kv_slots=4096"});
  ASSERT_GT(v.pid, 0);
  verifyd::client::VerifyClient c(v.target, absl::Seconds(5));
  ASSERT_TRUE(WaitServing(c, absl::Seconds(60))) << ReadFile(v.log);
  auto info = c.GetInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kv_cache_dtype(), "fp8_e4m3");
  EXPECT_TRUE(info->exact_lossless());
  auto s = c.Open({1, 2, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(c.Verify(s->session_id, {}).ok());
  EXPECT_THAT(ReadFile(v.log), HasSubstr("kv_dtype=fp8"));
  ASSERT_EQ(::kill(v.pid, SIGTERM), 0);
  EXPECT_EQ(WaitExit(v.pid, absl::Seconds(30)), 0) << ReadFile(v.log);
}

TEST(Verifyctl, SubcommandsAndDemoAgainstLiveServer) {
  const Verifyd v("ctl.log", {"--backend=toy", "--metrics_listen="});
  verifyd::client::VerifyClient c(v.target, absl::Seconds(5));
  ASSERT_TRUE(WaitServing(c, absl::Seconds(20))) << ReadFile(v.log);
  const std::string ctl = absl::StrCat(VERIFYCTL_BINARY, " --target=", v.target, " ");

  ExpectCommand(ctl + "info", 0, {"backend: toy", "exact_lossless: yes  kv_cache: none"});
  ExpectCommand(ctl + "health", 0, {"SERVING"});

  auto [rc_open, open] = RunCommand(ctl + "open --prompt=1,2,3");
  ASSERT_EQ(rc_open, 0) << open;
  const size_t at = open.find("session_id: ");
  ASSERT_NE(at, std::string::npos);
  const std::string id = open.substr(at + 12, open.find('\n', at) - at - 12);
  ExpectCommand(ctl + "verify --session=" + id + " --tokens=5,6 --parents=-1,0", 0,
                {"committed_len: 4"});
  ExpectCommand(ctl + "verify --session=" + id + " --tokens=5,6 --parents=-1,3", 1,
                {"INVALID_ARGUMENT: items[0].tree.parents[1]"});
  ExpectCommand(ctl + "close --session=" + id, 0);
  ExpectCommand(ctl + "close --session=" + id, 1, {"NOT_FOUND"});

  ExpectCommand(ctl + "demo --rounds=12 --quiet", 0, {"lossless=yes", "mean_accept"});
  ExpectCommand(ctl + "load --sessions=4 --rounds=10", 0,
                {"drafter=oracle sessions=4 rounds=10 calls=40 errors=0", "lossless=yes"});
  ExpectCommand(ctl + "frobnicate", 2);

  ::kill(v.pid, SIGTERM);
  EXPECT_EQ(WaitExit(v.pid, absl::Seconds(20)), 0) << ReadFile(v.log);
}

}  // namespace
