// The demo drafter: trees are well formed and bounded, the n-gram guess follows the latest
// earlier occurrence, and RunDemo / RunLoad against an in-process server report lossless
// output, consistent counts and vLLM's mean acceptance length (the server's own counters
// give the same number).
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "client/demo_drafter.h"
#include "gtest/gtest.h"
#include "server/server.h"
#include "server/testing/test_server.h"
#include "server/toy_engine.h"

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
  EXPECT_GT(rep->mean_acceptance_length, 1.5);  // 90 % accurate chains are mostly accepted
  EXPECT_EQ(rep->tokens_per_round, static_cast<double>(rep->tokens) / rep->rounds);

  // Load with the oracle drafter (the default, as the demo): every session is checked
  // against its shadow session, and 90 % accurate chains are mostly accepted.
  auto load = RunLoad(*t->client, d, 4);
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->calls, 80);
  EXPECT_EQ(load->errors, 0);
  EXPECT_EQ(load->lossless_mismatches, 0);
  EXPECT_GT(load->shadow_calls, 80);  // at least one plain step per emitted token
  EXPECT_GT(load->mean_acceptance_length, 1.5);
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

// A counter of the in-process server's /metrics (-1 when missing).
double Counter(int port, const std::string& name) {
  auto body = server::testing::HttpGet(port, "/metrics");
  if (!body.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*body, '\n')) {
    if (absl::StartsWith(line, name + " ")) return std::stod(std::string(line.substr(name.size())));
  }
  return -1;
}

// Mean acceptance length, vLLM's definition: 1 + accepted draft tokens / drafts, drafts being
// the rounds whose tree had a node (the oracle's shadow sessions send empty trees: plain
// decode steps, no drafts). The server's counters (verifyd_drafts_total counts only trees
// with a node) give exactly the client's figure.
TEST(DemoDrafter, MeanAcceptanceLengthIsVllmsDefinition) {
  server::testing::ToyEngineOptions o;
  auto t = server::testing::StartTestServer(server::ServerOptions{},
                                            std::make_unique<server::testing::ToyEngine>(o));
  ASSERT_TRUE(t.ok()) << t.status();
  const int port = t->server->metrics_port();
  DemoOptions d;
  d.rounds = 15;
  d.accuracy = 0.7;
  d.depth = 4;
  auto rep = RunDemo(*t->client, d);
  ASSERT_TRUE(rep.ok()) << rep.status();
  const double accepted = Counter(port, "verifyd_accepted_tokens_total");
  const double drafts = Counter(port, "verifyd_drafts_total");
  EXPECT_EQ(drafts, 15);  // the demo's trees, not the shadow's empty ones
  EXPECT_DOUBLE_EQ(rep->mean_acceptance_length, 1 + accepted / drafts);
  // tokens per round = accepted per round + the bonus = the mean acceptance length here
  // (every round drafted).
  EXPECT_DOUBLE_EQ(rep->mean_acceptance_length, rep->tokens_per_round);

  auto load = RunLoad(*t->client, d, 3);
  ASSERT_TRUE(load.ok()) << load.status();
  const double accepted2 = Counter(port, "verifyd_accepted_tokens_total") - accepted;
  const double drafts2 = Counter(port, "verifyd_drafts_total") - drafts;
  EXPECT_EQ(drafts2, 45);
  EXPECT_DOUBLE_EQ(load->mean_acceptance_length, 1 + accepted2 / drafts2);

  // Depth 0: plain decode steps only, no drafts, no acceptance length.
  d.depth = 0;
  auto plain = RunDemo(*t->client, d);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->mean_acceptance_length, 0);
  EXPECT_EQ(Counter(port, "verifyd_drafts_total"), drafts + drafts2);
}

}  // namespace
}  // namespace verifyd::client
