// The demo drafter: trees are well formed and bounded, the n-gram guess follows the latest
// earlier occurrence, and RunDemo / RunLoad against an in-process server report lossless
// output and consistent counts.
#include <random>

#include "client/demo_drafter.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server.h"
#include "server/testing/toy_engine.h"

namespace verifyd::client {
namespace {

TEST(DemoDrafter, TreesAreTopologicalBoundedAndCarryTheGuess) {
  std::mt19937_64 rng(3);
  for (int it = 0; it < 200; ++it) {
    const int depth = 1 + static_cast<int>(rng() % 8);
    const int branches = 1 + static_cast<int>(rng() % 4);
    const int max_nodes = 1 + static_cast<int>(rng() % 20);
    std::vector<int32_t> guess;
    for (int d = 0; d < depth; ++d) guess.push_back(static_cast<int32_t>(rng() % 50));
    DraftTree t = BuildDraftTree(guess, depth, branches, 50, max_nodes, rng);
    ASSERT_EQ(t.tokens.size(), t.parents.size());
    ASSERT_LE(static_cast<int>(t.tokens.size()), max_nodes);
    ASSERT_EQ(static_cast<int>(t.tokens.size()), std::min(max_nodes, depth * branches));
    for (size_t i = 0; i < t.tokens.size(); ++i) {
      ASSERT_GE(t.parents[i], -1);
      ASSERT_LT(t.parents[i], static_cast<int>(i));
      ASSERT_GE(t.tokens[i], 0);
      ASSERT_LT(t.tokens[i], 50);
    }
    // The guess is the chain: node 0, then each depth's first node under the previous one.
    int node = 0;
    for (int d = 0; d < depth && node < static_cast<int>(t.tokens.size()); ++d) {
      ASSERT_EQ(t.tokens[node], guess[d]);
      node += branches;
    }
  }
}

TEST(DemoDrafter, NgramGuessFollowsLatestEarlierOccurrence) {
  // ... 1 2 3 [9 8] ... 1 2 3 [7 6] ... 2 3 -> latest earlier "2 3" is followed by 7 6.
  std::vector<int32_t> h = {1, 2, 3, 9, 8, 1, 2, 3, 7, 6, 5, 2, 3};
  EXPECT_EQ(NgramGuess(h, 2), (std::vector<int32_t>{7, 6}));
  EXPECT_EQ(NgramGuess({4, 5, 6}, 3), std::vector<int32_t>{});
  EXPECT_EQ(NgramGuess({4, 5, 4}, 3), (std::vector<int32_t>{5, 4}));
}

TEST(DemoDrafter, DemoAndLoadAgainstInProcessServer) {
  server::testing::ToyEngineOptions o;
  auto t = server::testing::StartTestServer(server::ServerOptions{},
                                            std::make_unique<server::testing::ToyEngine>(o),
                                            /*metrics=*/false);
  ASSERT_TRUE(t.ok()) << t.status();
  DemoOptions d;
  d.rounds = 20;
  d.accuracy = 0.9;
  int rounds_seen = 0;
  d.on_round = [&](const RoundReport&) { ++rounds_seen; };
  auto rep = RunDemo(*t->client, d);
  ASSERT_TRUE(rep.ok()) << rep.status();
  EXPECT_TRUE(rep->lossless);
  EXPECT_EQ(rep->rounds, 20);
  EXPECT_EQ(rounds_seen, 20);
  EXPECT_EQ(rep->tokens + 1, static_cast<int64_t>(rep->collected.size()));
  EXPECT_GT(rep->mean_accepted, 0.5);  // 90 % accurate chains are mostly accepted
  EXPECT_EQ(rep->tokens_per_round, static_cast<double>(rep->tokens) / rep->rounds);

  // Load with the oracle drafter (the default, as the demo): every session is checked
  // against its shadow session, and 90 % accurate chains are mostly accepted.
  auto load = RunLoad(*t->client, d, 4);
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->calls, 80);
  EXPECT_EQ(load->errors, 0);
  EXPECT_EQ(load->lossless_mismatches, 0);
  EXPECT_GT(load->shadow_calls, 80);  // at least one plain step per emitted token
  EXPECT_GT(load->mean_accepted, 0.5);
  EXPECT_LE(load->p50_ms, load->p99_ms);
  EXPECT_EQ(t->server->kv_slots_used(), 0);

  // The n-gram drafter: no shadow sessions.
  d.oracle = false;
  auto ngram = RunLoad(*t->client, d, 2);
  ASSERT_TRUE(ngram.ok()) << ngram.status();
  EXPECT_EQ(ngram->calls, 40);
  EXPECT_EQ(ngram->errors, 0);
  EXPECT_EQ(ngram->shadow_calls, 0);
  EXPECT_EQ(t->server->kv_slots_used(), 0);
}

}  // namespace
}  // namespace verifyd::client
