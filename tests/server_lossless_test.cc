// Lossless over loopback gRPC with the real CPU engine (tiny preset) at TP 1, 2 and 4:
// several concurrent sessions with random prompts (some longer than one 64-row prefill
// chunk) send random draft trees that sometimes contain the true continuation; the tokens
// each collects (next_token, then accepted + bonus per round) must equal plain greedy
// decoding run straight through Engine::Step on a second engine with the same weights.
#include <random>
#include <thread>

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

class LosslessTest : public ::testing::TestWithParam<int> {};

TEST_P(LosslessTest, CollectedTokensEqualPlainGreedy) {
  const int tp_size = GetParam();
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
    auto g = testing::GreedyViaEngine(reference->get(), prompts[i], kTokens + 16);
    ASSERT_TRUE(g.ok()) << g.status();
    truths[i] = *g;
  }

  auto t = testing::StartTestServer(ServerOptions{}, *std::move(engine), /*metrics=*/false);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::string> errors(kSessions);
  std::vector<int> accepted_total(kSessions, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      std::mt19937_64 r(100 * tp_size + i);
      auto s = t->client->Open(prompts[i]);
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
                                  std::to_string(got[k]) + ", greedy " +
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

INSTANTIATE_TEST_SUITE_P(Tp, LosslessTest, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

}  // namespace
}  // namespace verifyd::server
