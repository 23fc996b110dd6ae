// The verifyctl binary: usage errors exit 2 with one line, --help lists every flag and exits
// 0, `verifyctl info` prints the device memory a server reports, and `verifyctl bench` against
// a live CPU verifyd (tiny preset) writes its JSON and sends the server exactly the Verify
// rounds it reports (plus its untimed setup, reported apart).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/verify_client.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/testing/test_server.h"
#include "server/toy_engine.h"
#include "tests/process_util.h"
#include "tests/toy_server_fixture.h"

namespace {

using ::testing::HasSubstr;

using ::verifyd::test::ReadFile;

std::string TempPath(const std::string& name) {
  return verifyd::test::TempPath("verifyctl_test", name);
}

// Runs verifyctl with `args`; (exit code, stdout, stderr).
struct CtlRun {
  int code;
  std::string out, err;
};
CtlRun Verifyctl(const std::string& args) {
  const std::string out = TempPath("out"), err = TempPath("err");
  const int status =
      std::system(absl::StrCat(VERIFYCTL_BINARY, " ", args, " >", out, " 2>", err).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFile(out), ReadFile(err)};
}

TEST(VerifyctlUsage, UsageErrorsExitTwoWithOneLine) {
  // Nothing listens on port 1: every case must fail before any call.
  for (const char* args :
       {"frobnicate", "", "info health", "--no_such_flag info", "info --bogus=3",
        "bench --concurrency=abc", "bench --concurrency=0", "bench --concurrency",
        "bench --request_rate=-1", "bench --duration_s=2 --num_rounds=5", "bench --drafter=ngram",
        "demo --drafter=random", "demo --depth=-1", "load --accuracy=1.5", "open --prompt=1,x",
        "verify --session=s --tokens=5 --parents=z", "--timeout_s=soon info"}) {
    const CtlRun r = Verifyctl(absl::StrCat("--target=127.0.0.1:1 ", args));
    EXPECT_EQ(r.code, 2) << args << ": " << r.err;
    EXPECT_THAT(r.err, ::testing::StartsWith("verifyctl: ")) << args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << ": " << r.err;
  }
  EXPECT_THAT(Verifyctl("frobnicate").err, HasSubstr("unknown subcommand 'frobnicate'"));
  EXPECT_THAT(Verifyctl("--no_such_flag info").err, HasSubstr("unknown flag --no_such_flag"));
  EXPECT_THAT(Verifyctl("bench --concurrency=abc").err, HasSubstr("--concurrency"));
  EXPECT_THAT(Verifyctl("bench --concurrency=0").err, HasSubstr("--concurrency: must be >= 1"));
}

TEST(VerifyctlUsage, HelpListsEveryFlagAndExitsZero) {
  const CtlRun r = Verifyctl("--help");
  EXPECT_EQ(r.code, 0) << r.err;
  // Every ABSL_FLAG of verifyctl.cc.
  const std::string source = ReadFile(absl::StrCat(VERIFYD_SOURCE_ROOT, "/client/verifyctl.cc"));
  const std::regex flag_re(R"(ABSL_FLAG\([^,]+,\s*(\w+),)");
  int flags = 0;
  for (std::sregex_iterator it(source.begin(), source.end(), flag_re), end; it != end; ++it) {
    ++flags;
    EXPECT_THAT(r.out, HasSubstr(absl::StrCat("--", (*it)[1].str(), " "))) << (*it)[1];
  }
  EXPECT_GT(flags, 30);
  for (const char* cmd : {"info", "open", "verify", "truncate", "fork", "demo", "load", "bench"}) {
    EXPECT_THAT(r.out, HasSubstr(cmd));
  }
}

// Parses `text` of /metrics into {series: value} (labels as printed).
std::map<std::string, double> Scrape(int port) {
  std::map<std::string, double> out;
  auto body = verifyd::server::testing::HttpGet(port, "/metrics");
  if (!body.ok()) return out;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    out[std::string(line.substr(0, sp))] = std::stod(std::string(line.substr(sp + 1)));
  }
  return out;
}

// The sum of the series of `family` whose labels contain every one of `labels`.
double Sum(const std::map<std::string, double>& m, const std::string& family,
           const std::vector<std::string>& labels = {}) {
  double sum = 0;
  for (const auto& [series, v] : m) {
    if (series != family && !absl::StartsWith(series, family + "{")) continue;
    bool all = true;
    for (const auto& l : labels) all = all && absl::StrContains(series, l);
    if (all) sum += v;
  }
  return sum;
}

double Field(const google::protobuf::Struct& s, const std::string& path) {
  const google::protobuf::Struct* at = &s;
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) at = &at->fields().at(parts[i]).struct_value();
  return at->fields().at(parts.back()).number_value();
}

class BenchAgainstCpuServer : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = verifyd::test::FreePort();
    metrics_port_ = verifyd::test::FreePort();
    log_ = TempPath("verifyd.log");
    pid_ = verifyd::test::Spawn(
        {VERIFYD_BINARY, "--backend=cpu", "--model=tiny",
         absl::StrCat("--listen=127.0.0.1:", port_),
         absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port_), "--kv_slots=16384"},
        log_);
    verifyd::client::VerifyClient c(absl::StrCat("127.0.0.1:", port_), absl::Seconds(5));
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      auto h = c.Health();
      if (h.ok() && *h == verifyd::client::HealthStatus::kServing) return;
      absl::SleepFor(absl::Milliseconds(50));
    }
    FAIL() << "verifyd did not serve: " << ReadFile(log_);
  }
  void TearDown() override {
    ::kill(pid_, SIGTERM);
    EXPECT_EQ(verifyd::test::WaitExit(pid_, absl::Seconds(30)), 0) << ReadFile(log_);
  }

  // Runs a bench with `args`, returns its JSON; checks the server's counters rose by exactly
  // the calls it reports.
  google::protobuf::Struct Bench(const std::string& args) {
    const auto before = Scrape(metrics_port_);
    const std::string json_path = TempPath("bench.json");
    const CtlRun r = Verifyctl(
        absl::StrCat("--target=127.0.0.1:", port_, " bench ", args, " --json=", json_path));
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("Mean acceptance length:"));
    google::protobuf::Struct j;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(json_path), &j).ok())
        << ReadFile(json_path);
    const auto after = Scrape(metrics_port_);
    auto delta = [&](const std::string& family, const std::vector<std::string>& labels = {}) {
      return Sum(after, family, labels) - Sum(before, family, labels);
    };
    EXPECT_EQ(delta("verifyd_requests_total", {"method=\"Verify\"", "code=\"OK\""}),
              Field(j, "completed") + Field(j, "setup.verify_calls"));
    EXPECT_EQ(delta("verifyd_requests_total", {"method=\"Verify\""}),
              Field(j, "completed") + Field(j, "setup.verify_calls"));  // no failed ones
    EXPECT_EQ(delta("verifyd_requests_total", {"method=\"OpenSession\""}),
              Field(j, "settings.concurrency"));
    EXPECT_EQ(delta("verifyd_requests_total", {"method=\"TruncateSession\""}),
              Field(j, "setup.truncate_calls"));
    EXPECT_EQ(delta("verifyd_requests_total", {"method=\"VerifyStream\""}), 0);
    EXPECT_EQ(delta("verifyd_requests_total", {"method=\"ForkSession\""}), 0);
    // Setup's empty trees are no drafts: the server's drafts and accepted tokens are the
    // timed rounds', and its mean acceptance length is the bench's.
    EXPECT_EQ(delta("verifyd_drafts_total"), Field(j, "drafts"));
    EXPECT_EQ(delta("verifyd_accepted_tokens_total"), Field(j, "accepted_tokens"));
    EXPECT_EQ(delta("verifyd_draft_tokens_total"), Field(j, "draft_tokens"));
    EXPECT_NEAR(1 + delta("verifyd_accepted_tokens_total") / delta("verifyd_drafts_total"),
                Field(j, "mean_acceptance_length"), 1e-5);
    EXPECT_EQ(Sum(after, "verifyd_active_sessions"), 0);  // closed again
    for (const char* f : {"latency_ms.mean", "latency_ms.p50", "latency_ms.p90", "latency_ms.p99",
                          "verify_rounds_per_s", "tokens_per_s", "request_throughput",
                          "output_throughput", "median_itl_ms", "p99_ttft_ms", "duration_s"}) {
      EXPECT_GT(Field(j, f), 0) << f;
    }
    EXPECT_LE(Field(j, "latency_ms.p50"), Field(j, "latency_ms.p90"));
    EXPECT_LE(Field(j, "latency_ms.p90"), Field(j, "latency_ms.p99"));
    EXPECT_EQ(Field(j, "errors"), 0);
    return j;
  }

  int port_ = 0, metrics_port_ = 0;
  pid_t pid_ = -1;
  std::string log_;
};

TEST_F(BenchAgainstCpuServer, ClosedLoopOracleCountsOnlyItsRounds) {
  const auto j = Bench("--concurrency=3 --num_rounds=30 --depth=4 --branches=2 --accuracy=0.9");
  EXPECT_EQ(Field(j, "completed"), 30);
  EXPECT_EQ(j.fields().at("settings").struct_value().fields().at("mode").string_value(), "closed");
  EXPECT_GT(Field(j, "setup.verify_calls"), 0);  // the oracle decoded ahead, untimed
  EXPECT_EQ(Field(j, "oracle_exhausted_rounds"), 0);
  // 90 % accurate chains of 4: well above one token a draft.
  EXPECT_GT(Field(j, "mean_acceptance_length"), 2.0);
  EXPECT_EQ(Field(j, "request_throughput"), Field(j, "verify_rounds_per_s"));
}

TEST_F(BenchAgainstCpuServer, OpenLoopRandomDrafterSendsNothingElse) {
  const auto j = Bench("--drafter=random --request_rate=100 --duration_s=1 --concurrency=4");
  EXPECT_EQ(j.fields().at("settings").struct_value().fields().at("mode").string_value(), "open");
  EXPECT_EQ(Field(j, "setup.verify_calls"), 0);
  EXPECT_EQ(Field(j, "setup.truncate_calls"), 0);
  // ~100 Poisson arrivals in 1 s.
  EXPECT_GT(Field(j, "completed"), 50);
  EXPECT_LT(Field(j, "completed"), 170);
}

CtlRun InfoAgainst(std::unique_ptr<verifyd::tp::Engine> engine) {
  auto t = verifyd::server::testing::StartTestServer({}, std::move(engine), /*metrics=*/false);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {-1, "", ""};
  return Verifyctl(absl::StrCat("--target=", t->target, " info"));
}

// `verifyctl info` prints the server's device memory in GB (10^9 bytes) when GetInfo carries
// it, and no memory line when it does not.
TEST(VerifyctlInfo, PrintsDeviceMemoryInGigabytesWhenReported) {
  const CtlRun r = InfoAgainst(
      std::make_unique<verifyd::server::ToyEngineWithMemory>(verifyd::server::ExampleMemory()));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("memory (GB per GPU, first rank): device=150.02 weights=130.20 "
                               "workspace=8.50 kv_cache=4.61\n"));
  EXPECT_THAT(r.out, HasSubstr("  kv: tokens=65536 bytes_per_token=70272\n"));
  EXPECT_THAT(
      r.out, HasSubstr("  before kv: used=139.91 (measured) planned=138.70 (weights + workspace)"));

  const CtlRun none = InfoAgainst(std::make_unique<verifyd::server::testing::ToyEngine>(
      verifyd::server::testing::ToyEngineOptions{}));
  EXPECT_EQ(none.code, 0) << none.err;
  EXPECT_THAT(none.out, HasSubstr("kv_cache: none"));
  EXPECT_THAT(none.out, ::testing::Not(HasSubstr("memory")));
}

}  // namespace
