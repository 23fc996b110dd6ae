// Faults: a CPU rank failure through the engine's fault hook (in process: health
// NOT_SERVING on both ports, in-flight calls UNAVAILABLE; and the real verifyd binary: exit
// non-zero), SIGTERM with calls in flight (the real binary drains them and exits 0), and a
// client killed mid-call whose abandoned sessions the TTL reaps, leaving every slot free.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/verify_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server.h"
#include "tests/rel_util.h"
#include "tp/cpu/cpu_engine.h"

namespace verifyd::server {
namespace {

using client::DraftTree;
using client::HealthStatus;
using client::VerifyClient;
using rel::Metric;

template <typename Pred>
bool WaitFor(Pred pred, absl::Duration timeout) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return pred();
}

bool WaitServing(VerifyClient& c, absl::Duration timeout) {
  return WaitFor(
      [&] {
        auto h = c.Health();
        return h.ok() && *h == HealthStatus::kServing;
      },
      timeout);
}

std::string Log(const std::string& path) { return rel::ReadFile(path).value_or("(no log)"); }

// The real verifyd binary on the tiny CPU model with 4,096 KV slots, listening on a free
// loopback port, logging to verifyd.log in a temporary directory; `flags` add the rest. With a
// client of it (30 s deadlines).
struct Verifyd {
  rel::TempDir dir;
  const int port = rel::FreePort();
  const std::string target = absl::StrCat("127.0.0.1:", port);
  const std::string log = dir.File("verifyd.log");
  pid_t pid = -1;
  VerifyClient client{target, absl::Seconds(30)};

  explicit Verifyd(const std::vector<std::string>& flags) {
    std::vector<std::string> args = {VERIFYD_BINARY, "--backend=cpu", "--model=tiny",
                                     "--kv_slots=4096", "--listen=" + target};
    args.insert(args.end(), flags.begin(), flags.end());
    pid = rel::Spawn(args, log);
  }

  // Whether it reports SERVING within 60 s.
  bool Serving() { return WaitServing(client, absl::Seconds(60)); }
};

TEST(RelFaults, RankFailureMakesHealthNotServingAndInFlightCallsUnavailable) {
  tp::FaultInjector faults;
  tp::EngineOptions eo;
  eo.model = "tiny";
  eo.tp = 2;
  eo.kv_slots = 4096;
  eo.fault_hook = faults.Hook();
  auto engine = tp::CreateCpuEngine(eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::atomic<int> failures{0};
  ServerOptions so;
  so.health_listen = "127.0.0.1:0";
  so.on_engine_failure = [&] { ++failures; };
  auto t = testing::StartTestServer(so, *std::move(engine), /*metrics=*/false);
  ASSERT_TRUE(t.ok()) << t.status();
  VerifyClient probe(absl::StrCat("127.0.0.1:", t->server->health_port()), absl::Seconds(5));
  ASSERT_EQ(probe.Health().value_or(HealthStatus::kUnknown), HealthStatus::kServing);

  constexpr int kClients = 4;
  std::vector<std::string> ids;
  for (int i = 0; i < kClients; ++i) {
    auto s = t->client->Open({1 + i, 2, 3, 4, 5});
    ASSERT_TRUE(s.ok()) << s.status();
    ids.push_back(s->session_id);
  }
  // Clients verify continuously; then rank 1 fails at its next step.
  std::atomic<bool> stop{false};
  std::atomic<int> ok_rounds{0}, unavailable{0}, other{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      while (!stop) {
        auto r = t->client->Verify(ids[i], DraftTree{{7, 8}, {-1, 0}});
        if (r.ok()) {
          ++ok_rounds;
        } else if (r.status().code() == absl::StatusCode::kUnavailable) {
          ++unavailable;
          return;
        } else {
          ++other;
          return;
        }
      }
    });
  }
  ASSERT_TRUE(WaitFor([&] { return ok_rounds >= 8; }, absl::Seconds(30)));
  faults.FailRankOnNextStep(1);
  EXPECT_TRUE(WaitFor([&] { return unavailable == kClients; }, absl::Seconds(30)));
  stop = true;
  for (auto& c : clients) c.join();
  EXPECT_EQ(unavailable.load(), kClients);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(failures.load(), 1);
  EXPECT_TRUE(t->server->engine_failed());
  EXPECT_EQ(probe.Health().value_or(HealthStatus::kUnknown), HealthStatus::kNotServing);
  EXPECT_EQ(t->client->Health().value_or(HealthStatus::kUnknown), HealthStatus::kNotServing);
  EXPECT_EQ(t->client->Open({1}).status().code(), absl::StatusCode::kUnavailable);
  faults.Release();
}

// After a rank failure verifyd exits 1: calls that arrive meanwhile are UNAVAILABLE, as
// docs/RELIABILITY.md promises, never CANCELLED (what gRPC's own shutdown answers calls that
// arrive during it): verifyd answers UNAVAILABLE for a second, then exits without gRPC's
// shutdown (the closed connections are UNAVAILABLE to the clients).
TEST(RelFaults, CallsAfterAFailureAreUnavailableUntilVerifydExits) {
  Verifyd v({"--tp=2", "--metrics_listen=", "--testing_fault=fail:1@40"});
  ASSERT_TRUE(v.Serving()) << Log(v.log);
  auto s = v.client.Open({1, 2, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  // Clients start new calls back to back, each on its own channel, until verifyd is gone.
  constexpr int kClients = 4;
  std::atomic<bool> stop{false};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::map<absl::StatusCode, int> codes;  // once a call has seen the failure
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      VerifyClient own(v.target, absl::Seconds(10));
      while (!stop) {
        const absl::Status st =
            i % 2 == 0 ? own.GetInfo().status() : own.Verify(s->session_id, DraftTree{}).status();
        if (!st.ok()) failed = true;
        if (!failed) continue;
        std::lock_guard<std::mutex> lock(mu);
        ++codes[st.code()];
      }
    });
  }
  const int code = rel::WaitExit(v.pid, absl::Seconds(60));
  absl::SleepFor(absl::Milliseconds(300));  // calls against the closed port
  stop = true;
  for (auto& t : clients) t.join();
  EXPECT_EQ(code, 1) << Log(v.log);
  std::string seen;
  int total = 0;
  for (const auto& [k, n] : codes) {
    seen += absl::StrCat(absl::StatusCodeToString(k), "=", n, " ");
    total += n;
  }
  EXPECT_GT(codes[absl::StatusCode::kUnavailable], 0) << seen;
  // GetInfo calls already past the gate when the engine failed may still answer OK.
  EXPECT_EQ(codes[absl::StatusCode::kUnavailable] + codes[absl::StatusCode::kOk], total) << seen;
  EXPECT_THAT(Log(v.log), ::testing::HasSubstr("answering UNAVAILABLE for 1000 ms, then exit"));
}

TEST(RelFaults, VerifydExitsNonZeroWhenARankFails) {
  // Step 0 is the prefill below; rank 1 fails at step 4 (the fourth Verify).
  Verifyd v({"--tp=2", "--metrics_listen=", "--testing_fault=fail:1@4"});
  ASSERT_TRUE(v.Serving()) << Log(v.log);
  auto s = v.client.Open({1, 2, 3});
  ASSERT_TRUE(s.ok()) << s.status();
  int ok_rounds = 0;
  absl::Status last;
  for (int i = 0; i < 10 && last.ok(); ++i) {
    auto r = v.client.Verify(s->session_id, DraftTree{});
    if (r.ok()) ++ok_rounds;
    last = r.status();
  }
  EXPECT_EQ(ok_rounds, 3);
  EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable) << last;
  const int code = rel::WaitExit(v.pid, absl::Seconds(60));
  EXPECT_NE(code, 0) << Log(v.log);
  EXPECT_NE(code, -1) << "verifyd did not exit by itself\n" << Log(v.log);
  EXPECT_THAT(Log(v.log), ::testing::HasSubstr("engine failed"));
}

TEST(RelFaults, SigtermWithCallsInFlightDrainsThemAndExitsZero) {
  // Every engine step takes >= 200 ms, so calls are in flight when the signal comes.
  Verifyd v({"--metrics_listen=", "--testing_fault=slow:200", "--drain_timeout_s=30"});
  ASSERT_TRUE(v.Serving()) << Log(v.log);
  constexpr int kClients = 4;
  std::vector<std::string> ids;
  for (int i = 0; i < kClients; ++i) {
    auto s = v.client.Open({5, 6, 7 + i});
    ASSERT_TRUE(s.ok()) << s.status();
    ids.push_back(s->session_id);
  }
  // A call that started >= kAdmitted before the signal has certainly reached the server (a
  // loopback hop) and, with >= 200 ms steps, is still running: it must finish OK. Calls that
  // started just before the signal may arrive after the drain began and be refused
  // (UNAVAILABLE): correct, and not counted.
  constexpr absl::Duration kAdmitted = absl::Milliseconds(100);
  std::mutex mu;
  absl::Time sigterm_at = absl::InfiniteFuture();
  int in_flight_ok = 0, in_flight_failed = 0;
  std::atomic<int> rounds{0};
  std::vector<std::atomic<int64_t>> call_start_ns(kClients);  // 0 = no call running
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      VerifyClient own(v.target, absl::Seconds(30));
      for (;;) {
        const absl::Time start = absl::Now();
        call_start_ns[i] = absl::ToUnixNanos(start);
        auto r = own.Verify(ids[i], DraftTree{{1}, {-1}});
        call_start_ns[i] = 0;
        std::lock_guard<std::mutex> lock(mu);
        if (start + kAdmitted <= sigterm_at && absl::Now() > sigterm_at) {
          (r.ok() ? in_flight_ok : in_flight_failed)++;
        }
        if (!r.ok()) return;  // after the drain: UNAVAILABLE (or the server is gone)
        ++rounds;
      }
    });
  }
  ASSERT_TRUE(WaitFor([&] { return rounds >= 2 * kClients; }, absl::Seconds(60)));
  // Signal while some call has been running for kAdmitted .. kAdmitted + 50 ms.
  ASSERT_TRUE(WaitFor(
      [&] {
        const int64_t now = absl::GetCurrentTimeNanos();
        for (auto& t : call_start_ns) {
          const int64_t s0 = t.load();
          if (s0 != 0 && now - s0 >= absl::ToInt64Nanoseconds(kAdmitted) &&
              now - s0 < absl::ToInt64Nanoseconds(kAdmitted + absl::Milliseconds(50))) {
            return true;
          }
        }
        return false;
      },
      absl::Seconds(30)));
  {
    std::lock_guard<std::mutex> lock(mu);
    sigterm_at = absl::Now();
    ASSERT_EQ(::kill(v.pid, SIGTERM), 0);
  }
  const int code = rel::WaitExit(v.pid, absl::Seconds(60));
  for (auto& t : clients) t.join();
  EXPECT_EQ(code, 0) << Log(v.log);
  EXPECT_GE(in_flight_ok, 1) << "no call was in flight at SIGTERM";
  EXPECT_EQ(in_flight_failed, 0) << Log(v.log);
}

TEST(RelFaults, ClientKilledMidCallLeavesNothingAfterTheTtl) {
  const int metrics_port = rel::FreePort();
  Verifyd v({absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port), "--session_ttl_s=1",
             "--testing_fault=slow:50"});
  ASSERT_TRUE(v.Serving()) << Log(v.log);
  // A load generator with 4 sessions and far more rounds than it will get to run.
  const pid_t load = rel::Spawn({VERIFYCTL_BINARY, "load", absl::StrCat("--target=", v.target),
                                 "--sessions=4", "--rounds=100000", "--quiet"},
                                v.dir.File("verifyctl.log"));
  auto page = [&] { return testing::HttpGet(metrics_port, "/metrics").value_or(""); };
  ASSERT_TRUE(WaitFor(
      [&] {
        return Metric(page(), "verifyd_active_sessions") >= 4 &&
               Metric(page(), "verifyd_kv_slots_used") > 0;
      },
      absl::Seconds(30)))
      << page();
  absl::SleepFor(absl::Milliseconds(300));  // calls in flight
  ASSERT_EQ(::kill(load, SIGKILL), 0);
  EXPECT_EQ(rel::WaitExit(load, absl::Seconds(10)), -1);  // killed, no exit code
  // TTL 1 s + housekeeping period 1 s + the step in flight.
  EXPECT_TRUE(WaitFor(
      [&] {
        const std::string p = page();
        return Metric(p, "verifyd_active_sessions") == 0 && Metric(p, "verifyd_kv_slots_used") == 0;
      },
      absl::Seconds(15)))
      << page();
  // The server keeps serving.
  auto s = v.client.Open({1, 2});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(v.client.Verify(s->session_id, DraftTree{}).ok());
  ASSERT_EQ(::kill(v.pid, SIGTERM), 0);
  EXPECT_EQ(rel::WaitExit(v.pid, absl::Seconds(30)), 0) << Log(v.log);
}

}  // namespace
}  // namespace verifyd::server
