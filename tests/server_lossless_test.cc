// Lossless over loopback gRPC with the real CPU engine (tiny preset) at TP 1, 2 and 4 (and
// sampled sessions against plain seeded decoding at TP 1 and 2):
// several concurrent sessions with random prompts (some longer than one 64-row prefill
// chunk) send random draft trees that sometimes contain the true continuation; the tokens
// each collects (next_token, then accepted + bonus per round) must equal plain greedy
// decoding run straight through Engine::Step on a second engine with the same weights.
#include <random>
#include <thread>
#include <tuple>

#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server.h"
#include "tp/cpu/cpu_engine.h"

namespace verifyd::server {
namespace {

constexpr uint64_t kSeed = 1234;
constexpr int kSessions = 3;
constexpr int kTokens = 40;  // collected per session (>= 32)

absl::StatusOr<std::unique_ptr<tp::Engine>> TinyEngine(int tp_size) {
  tp::EngineOptions o;
  o.model = "tiny";
  o.seed = kSeed;
  o.tp = tp_size;
  o.kv_slots = 2048;
  o.limits.max_batch = 16;
  return tp::CreateCpuEngine(o);
}

// Sessions decode with `sampling` (greedy by default); the reference is plain decoding with
// the same parameters and seed through Engine::Step.
void RunLossless(int tp_size, const client::SessionOptions& options) {
  kernels::SamplingParams sampling;
  sampling.temperature = options.temperature;
  sampling.top_p = options.top_p.value_or(1.0f);
  sampling.top_k = options.top_k;
  sampling.seed = options.seed;
  auto reference = TinyEngine(tp_size);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto engine = TinyEngine(tp_size);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int64_t vocab = (*engine)->config().vocab_size;
  const int max_nodes = (*engine)->limits().max_tail_rows - 1;

  // Prompts and their greedy continuations (the oracle), computed before serving.
  std::mt19937_64 rng(kSeed + tp_size);
  std::vector<std::vector<int32_t>> prompts(kSessions), truths(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    const int len = i == 0 ? 70 : 1 + static_cast<int>(rng() % 30);  // one spans 2 chunks
    for (int k = 0; k < len; ++k) prompts[i].push_back(static_cast<int32_t>(rng() % vocab));
    auto g = testing::GreedyViaEngine(reference->get(), prompts[i], kTokens + 16, sampling);
    ASSERT_TRUE(g.ok()) << g.status();
    truths[i] = *g;
  }
  if (options.sampled()) {  // the sampled continuation really is not the greedy one
    auto g = testing::GreedyViaEngine(reference->get(), prompts[0], kTokens + 16);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_NE(*g, truths[0]);
  }

  auto t = testing::StartTestServer(ServerOptions{}, *std::move(engine), /*metrics=*/false);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::string> errors(kSessions);
  std::vector<int> accepted_total(kSessions, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 r(100 * tp_size + i);
      auto s = t->client->Open(prompts[i], "", options);
      if (!s.ok()) return void(errors[i] = s.status().ToString());
      std::vector<int32_t> got = {s->next_token};
      while (static_cast<int>(got.size()) < kTokens) {
        std::vector<int32_t> ahead(truths[i].begin() + got.size(), truths[i].end());
        auto tree = testing::RandomTree(ahead, vocab, max_nodes, 0.75, r);
        auto res = t->client->Verify(s->session_id, tree);
        if (!res.ok()) return void(errors[i] = res.status().ToString());
        // Exactly the path greedy acceptance must take in the client's tree.
        if (res->accepted_nodes != testing::ExpectedAcceptedNodes(tree, ahead)) {
          return void(errors[i] = "accepted nodes differ from the greedy walk");
        }
        accepted_total[i] += static_cast<int>(res->accepted_tokens.size());
        got.insert(got.end(), res->accepted_tokens.begin(), res->accepted_tokens.end());
        got.push_back(res->bonus_token);
      }
      got.resize(kTokens);
      for (int k = 0; k < kTokens; ++k) {
        if (got[k] != truths[i][k]) {
          return void(errors[i] = "token " + std::to_string(k) + " differs: got " +
                                  std::to_string(got[k]) + ", plain decoding " +
                                  std::to_string(truths[i][k]));
        }
      }
      if (auto st = t->client->Close(s->session_id); !st.ok()) errors[i] = st.ToString();
    });
  }
  for (auto& th : threads) th.join();
  int accepted = 0;
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_EQ(errors[i], "") << "session " << i;
    accepted += accepted_total[i];
  }
  // The drafts contained the truth often enough that speculation really happened.
  EXPECT_GT(accepted, kSessions * 4);
  EXPECT_EQ(t->server->kv_slots_used(), 0);
}

class LosslessTest : public ::testing::TestWithParam<int> {};

TEST_P(LosslessTest, CollectedTokensEqualPlainGreedy) { RunLossless(GetParam(), {}); }

INSTANTIATE_TEST_SUITE_P(Tp, LosslessTest, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

// Coupled sampled verification: a seeded session emits exactly the tokens of plain seeded
// decoding, bit for bit, whatever the drafts (random trees, often holding the true sampled
// continuation), at TP 1 and TP 2, with and without top-k / top-p.
class SampledLosslessTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(SampledLosslessTest, CollectedTokensEqualSeededPlainDecoding) {
  client::SessionOptions o;
  o.seed = 77 + std::get<1>(GetParam());
  if (std::get<1>(GetParam()) == 0) {
    o.temperature = 1.0f;
  } else {
    o.temperature = 0.7f;
    o.top_k = 20;
    o.top_p = 0.9f;
  }
  RunLossless(std::get<0>(GetParam()), o);
}

INSTANTIATE_TEST_SUITE_P(TpAndParams, SampledLosslessTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(0, 1)),
                         [](const auto& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_topk_topp" : "_plain");
                         });

}  // namespace
}  // namespace verifyd::server
