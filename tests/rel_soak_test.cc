// Soak: the real verifyd binary (CPU backend, tiny model, TP 2) under many
// concurrent sessions for a bounded time (VERIFYD_SOAK_SECONDS, default 30): unary Verify,
// VerifyStream and two-session Verify calls with n-gram draft trees, sessions opened and
// closed continuously, some abandoned for the TTL to reap. Checks:
//   - zero unexpected errors (every call OK);
//   - lossless: every finished session's collected tokens equal plain greedy decoding by a
//     reference engine in this process (same preset, same TP);
//   - at the end every session is closed or reaped and every KV slot is free (metrics);
//   - verifyd's resident memory (VmRSS of /proc/<pid>/status) after the warm-up and at the
//     end: growth bounded by kMaxRssGrowthKib.
// Prints one line with the figures (rounds, sessions, calls, tokens, RSS) for the docs.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/demo_drafter.h"
#include "client/verify_client.h"
#include "gtest/gtest.h"
#include "server/testing/test_server.h"
#include "tests/rel_util.h"
#include "tp/cpu/cpu_engine.h"

namespace verifyd::server {
namespace {

using client::DraftTree;
using client::VerifyClient;
using rel::Metric;

// Under AddressSanitizer (quarantine of freed memory) or ThreadSanitizer (shadow memory) the
// resident size is not the program's: the figure is printed but not bounded there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

constexpr int kClients = 24;  // concurrent client threads (sessions in flight)
constexpr int kTp = 2;
constexpr int64_t kMaxRssGrowthKib = 32 * 1024;

struct Finished {
  std::vector<int32_t> prompt;
  std::vector<int32_t> collected;  // next_token, accepted + bonus per round
};

struct Totals {
  std::atomic<int64_t> rounds{0}, calls{0}, sessions{0}, abandoned{0}, tokens{0};
  std::atomic<int64_t> errors{0};
  std::mutex mu;
  std::vector<std::string> error_samples;
  std::vector<Finished> finished;  // lossless check sample
  void Error(const std::string& what) {
    ++errors;
    std::lock_guard<std::mutex> lock(mu);
    if (error_samples.size() < 10) error_samples.push_back(what);
  }
};

// One client thread: sessions back to back until `end`.
void ClientLoop(const std::string& target, int index, absl::Time end, int64_t vocab,
                Totals* totals) {
  std::mt19937_64 rng(1000 + index);
  VerifyClient c(target, absl::Seconds(60));
  while (absl::Now() < end) {
    const int prompt_len = 4 + static_cast<int>(rng() % 24);
    std::vector<int32_t> prompt(prompt_len);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % vocab);
    auto open = c.Open(prompt);
    ++totals->calls;
    if (!open.ok()) {
      totals->Error(open.status().ToString());
      continue;
    }
    ++totals->sessions;
    Finished f{prompt, {open->next_token}};
    std::vector<int32_t> history = prompt;
    history.push_back(open->next_token);
    const int rounds = 8 + static_cast<int>(rng() % 24);
    const int mode = static_cast<int>(rng() % 10);  // 0-1 stream, 2 two-item calls, else unary
    std::unique_ptr<client::VerifyStreamClient> stream;
    if (mode <= 1) stream = c.OpenStream();
    bool ok = true;
    for (int r = 0; r < rounds && ok && absl::Now() < end; ++r) {
      const DraftTree tree =
          client::BuildDraftTree(client::NgramGuess(history, 4), 4, 2, vocab, 16, rng);
      client::VerifyOutcome out;
      absl::Status st;
      if (stream) {
        verify::v1::VerifyRequest req;
        auto* item = req.add_items();
        item->set_session_id(open->session_id);
        item->mutable_tree()->mutable_tokens()->Add(tree.tokens.begin(), tree.tokens.end());
        item->mutable_tree()->mutable_parents()->Add(tree.parents.begin(), tree.parents.end());
        auto resp = stream->RoundTrip(req);
        st = resp.status();
        if (st.ok()) {
          const auto& res = resp->results(0);
          out.accepted_tokens.assign(res.accepted_tokens().begin(), res.accepted_tokens().end());
          out.bonus_token = res.bonus_token();
        }
      } else {
        auto res = c.Verify(open->session_id, tree);
        st = res.status();
        if (st.ok()) out = *std::move(res);
      }
      ++totals->calls;
      if (!st.ok()) {
        totals->Error(st.ToString());
        ok = false;
        break;
      }
      ++totals->rounds;
      totals->tokens += static_cast<int64_t>(out.accepted_tokens.size()) + 1;
      for (int32_t t : out.accepted_tokens) {
        f.collected.push_back(t);
        history.push_back(t);
      }
      f.collected.push_back(out.bonus_token);
      history.push_back(out.bonus_token);
    }
    if (stream) {
      if (absl::Status st = stream->Finish(); !st.ok()) totals->Error(st.ToString());
    }
    if (mode == 9) {
      ++totals->abandoned;  // left for the TTL
    } else {
      ++totals->calls;
      if (absl::Status st = c.Close(open->session_id); !st.ok()) totals->Error(st.ToString());
    }
    std::lock_guard<std::mutex> lock(totals->mu);
    if (ok && totals->finished.size() < 16 && index % 3 == 0) totals->finished.push_back(f);
  }
}

TEST(RelSoak, ManySessionsThousandsOfRoundsNoErrorsNoLeakBoundedMemory) {
  int seconds = 30;
  if (const char* s = std::getenv("VERIFYD_SOAK_SECONDS")) seconds = std::max(5, std::atoi(s));
  rel::TempDir dir;
  const int port = rel::FreePort(), metrics_port = rel::FreePort();
  const std::string log = dir.File("verifyd.log");
  const pid_t pid =
      rel::Spawn({VERIFYD_BINARY, "--backend=cpu", "--model=tiny", absl::StrCat("--tp=", kTp),
                  "--kv_slots=32768", absl::StrCat("--listen=127.0.0.1:", port),
                  absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port), "--session_ttl_s=2",
                  "--log_level=warn"},
                 log);
  const std::string target = absl::StrCat("127.0.0.1:", port);
  VerifyClient c(target, absl::Seconds(30));
  bool serving = false;
  for (int i = 0; i < 600 && !serving; ++i) {
    auto h = c.Health();
    serving = h.ok() && *h == client::HealthStatus::kServing;
    if (!serving) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(serving) << rel::ReadFile(log).value_or("");
  auto info = c.GetInfo();
  ASSERT_TRUE(info.ok());
  const int64_t vocab = info->model().vocab_size();

  Totals totals;
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(seconds);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back(ClientLoop, target, i, end, vocab, &totals);
  }
  // Warm-up: allocator pools, gRPC threads and buffers reach their working size.
  absl::SleepFor(absl::Seconds(seconds) / 4);
  const int64_t rss_warm = rel::RssKib(pid);
  const int64_t rounds_warm = totals.rounds.load();
  for (auto& t : clients) t.join();
  const double wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  // Abandoned sessions: reaped by the 2 s TTL (1 s housekeeping).
  auto page = [&] { return testing::HttpGet(metrics_port, "/metrics").value_or(""); };
  bool drained = false;
  for (int i = 0; i < 100 && !drained; ++i) {
    const std::string p = page();
    drained = Metric(p, "verifyd_active_sessions") == 0 && Metric(p, "verifyd_kv_slots_used") == 0;
    if (!drained) absl::SleepFor(absl::Milliseconds(100));
  }
  const int64_t rss_end = rel::RssKib(pid);
  std::printf(
      "soak: seconds=%.1f clients=%d tp=%d sessions=%lld abandoned=%lld rounds=%lld calls=%lld "
      "tokens=%lld errors=%lld rounds_per_s=%.0f rss_kib warm=%lld (after %lld rounds) "
      "end=%lld growth=%lld\n",
      wall_s, kClients, kTp, static_cast<long long>(totals.sessions.load()),
      static_cast<long long>(totals.abandoned.load()), static_cast<long long>(totals.rounds.load()),
      static_cast<long long>(totals.calls.load()), static_cast<long long>(totals.tokens.load()),
      static_cast<long long>(totals.errors.load()), totals.rounds.load() / wall_s,
      static_cast<long long>(rss_warm), static_cast<long long>(rounds_warm),
      static_cast<long long>(rss_end), static_cast<long long>(rss_end - rss_warm));
  EXPECT_EQ(totals.errors.load(), 0);
  for (const auto& e : totals.error_samples) ADD_FAILURE() << e;
  EXPECT_GE(totals.rounds.load(), 1000) << "soak too short to mean anything";
  EXPECT_TRUE(drained) << page();
  ASSERT_GT(rss_warm, 0);
  if (!kSanitized) EXPECT_LT(rss_end - rss_warm, kMaxRssGrowthKib);

  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  EXPECT_EQ(rel::WaitExit(pid, absl::Seconds(30)), 0) << rel::ReadFile(log).value_or("");

  // Lossless: a sample of finished sessions against plain greedy decoding.
  tp::EngineOptions eo;
  eo.model = "tiny";
  eo.tp = kTp;
  eo.kv_slots = 4096;
  auto ref = tp::CreateCpuEngine(eo);
  ASSERT_TRUE(ref.ok()) << ref.status();
  ASSERT_FALSE(totals.finished.empty());
  for (const Finished& f : totals.finished) {
    auto truth =
        testing::GreedyViaEngine(ref->get(), f.prompt, static_cast<int>(f.collected.size()));
    ASSERT_TRUE(truth.ok()) << truth.status();
    EXPECT_EQ(*truth, f.collected);
  }
}

}  // namespace
}  // namespace verifyd::server
