// Tests of greedy tree acceptance and KV commit (kernels/tree_accept.h): hand-built trees
// with known answers, several requests in one batch, a random comparison with an
// independent path-enumeration oracle, and the InvalidArgument cases.
#include "kernels/tree_accept.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace verifyd::kernels {
namespace {

using Vec = std::vector<int32_t>;

// One request: local row 0 is the root (pending token; its token is not compared).
struct Tree {
  Vec tokens, parents, predictions;
};

TEST(AcceptTreeGreedy, ChainFullyAccepted) {
  // root -> 10 -> 11 -> 12; the target predicts exactly the chain, then 13.
  const Tree t{{5, 10, 11, 12}, {-1, 0, 1, 2}, {10, 11, 12, 13}};
  const TreeAcceptResult r = AcceptTreeGreedy(t.tokens, t.parents, t.predictions);
  EXPECT_EQ(r.accepted_rows, (Vec{1, 2, 3}));
  EXPECT_EQ(r.bonus, 13);
}

TEST(AcceptTreeGreedy, ChainRejectedMidway) {
  const Tree t{{5, 10, 11, 12}, {-1, 0, 1, 2}, {10, 99, 12, 13}};
  const TreeAcceptResult r = AcceptTreeGreedy(t.tokens, t.parents, t.predictions);
  EXPECT_EQ(r.accepted_rows, (Vec{1}));
  EXPECT_EQ(r.bonus, 99);  // the target's token after the last accepted row
}

TEST(AcceptTreeGreedy, BranchingSecondChildMatches) {
  // root has children 1 (token 7) and 2 (token 8); target predicts 8 -> row 2, then its
  // child 3 (token 4) matches prediction 4; row 3's prediction is the bonus.
  const Tree t{{0, 7, 8, 4}, {-1, 0, 0, 2}, {8, 1, 4, 42}};
  const TreeAcceptResult r = AcceptTreeGreedy(t.tokens, t.parents, t.predictions);
  EXPECT_EQ(r.accepted_rows, (Vec{2, 3}));
  EXPECT_EQ(r.bonus, 42);
}

TEST(AcceptTreeGreedy, NoMatchBonusIsRootPrediction) {
  const Tree t{{0, 7, 8, 9}, {-1, 0, 0, 1}, {3, 9, 9, 9}};
  const TreeAcceptResult r = AcceptTreeGreedy(t.tokens, t.parents, t.predictions);
  EXPECT_TRUE(r.accepted_rows.empty());
  EXPECT_EQ(r.bonus, 3);
}

TEST(AcceptTreeGreedy, RootOnlyIsADecodeStep) {
  const TreeAcceptResult r = AcceptTreeGreedy({5}, {-1}, {17});
  EXPECT_TRUE(r.accepted_rows.empty());
  EXPECT_EQ(r.bonus, 17);
}

TEST(AcceptTreeGreedy, MatchAtDepthFollowsOnlyChildrenOfCurrentRow) {
  // Row 4 (token 6) is a child of row 1, not of row 2: after accepting 2 (token 5), token 6
  // at row 4 must not be taken although it equals row 2's prediction; row 5 (child of 2)
  // is taken instead, then row 6 (child of 5) at depth 3.
  //            row:  0   1   2   3   4   5   6
  const Tree t{{0, 4, 5, 9, 6, 6, 1}, {-1, 0, 0, 1, 1, 2, 5}, {5, 0, 6, 0, 0, 1, 77}};
  const TreeAcceptResult r = AcceptTreeGreedy(t.tokens, t.parents, t.predictions);
  EXPECT_EQ(r.accepted_rows, (Vec{2, 5, 6}));
  EXPECT_EQ(r.bonus, 77);
}

TEST(AcceptTreeGreedy, DuplicateTokenSiblingsLowestIndexWins) {
  // Rows 1, 2, 3 are all children of the root with token 8; row 2 has a child that would
  // also match, but the walk must take row 1 (lowest index) and stop below it.
  const Tree t{{0, 8, 8, 8, 3}, {-1, 0, 0, 0, 2}, {8, 55, 3, 66, 88}};
  const TreeAcceptResult r = AcceptTreeGreedy(t.tokens, t.parents, t.predictions);
  EXPECT_EQ(r.accepted_rows, (Vec{1}));
  EXPECT_EQ(r.bonus, 55);
}

TEST(AcceptTreeGreedy, InvalidInputGivesNoResult) {
  EXPECT_EQ(AcceptTreeGreedy({}, {}, {}).bonus, -1);
  EXPECT_EQ(AcceptTreeGreedy({1, 2}, {-1}, {1, 2}).bonus, -1);     // sizes differ
  EXPECT_EQ(AcceptTreeGreedy({1, 2}, {-1, 1}, {2, 3}).bonus, -1);  // parent not < row
  EXPECT_EQ(AcceptTreeGreedy({1, 2}, {0, 0}, {2, 3}).bonus, -1);   // root parent not -1
}

// Runs TreeAcceptReference over several requests, with output buffers pre-filled with a
// sentinel so unwritten entries are visible.
struct BatchOut {
  absl::Status status;
  Vec accepted, num_accepted, bonus, kept, freed;
};

constexpr int32_t kUnwritten = -7777;

BatchOut RunBatch(const std::vector<Tree>& trees, const Vec* slots_in = nullptr,
                  Vec* indptr_override = nullptr) {
  Vec indptr = {0}, tokens, parents, predictions;
  for (const Tree& t : trees) {
    indptr.push_back(indptr.back() + static_cast<int32_t>(t.tokens.size()));
    tokens.insert(tokens.end(), t.tokens.begin(), t.tokens.end());
    parents.insert(parents.end(), t.parents.begin(), t.parents.end());
    predictions.insert(predictions.end(), t.predictions.begin(), t.predictions.end());
  }
  if (indptr_override) indptr = *indptr_override;
  const size_t rows = tokens.size();
  BatchOut o;
  o.accepted.assign(rows, kUnwritten);
  o.kept.assign(rows, kUnwritten);
  o.freed.assign(rows, kUnwritten);
  o.num_accepted.assign(trees.size(), kUnwritten);
  o.bonus.assign(trees.size(), kUnwritten);
  TreeAcceptParams p;
  p.batch = static_cast<int>(trees.size());
  p.row_indptr = indptr.data();
  p.tokens = tokens.data();
  p.parents = parents.data();
  p.predictions = predictions.data();
  p.tail_slots = slots_in ? slots_in->data() : nullptr;
  p.accepted = o.accepted.data();
  p.num_accepted = o.num_accepted.data();
  p.bonus = o.bonus.data();
  p.kept_slots = o.kept.data();
  p.freed_slots = o.freed.data();
  o.status = TreeAcceptReference(p);
  return o;
}

TEST(TreeAcceptReference, SeveralRequestsWithKeptAndFreedSlots) {
  const std::vector<Tree> trees = {
      {{5, 10, 11, 12}, {-1, 0, 1, 2}, {10, 11, 12, 13}},  // chain fully accepted
      {{0, 7, 8, 4}, {-1, 0, 0, 2}, {8, 1, 4, 42}},        // rows 2, 3 accepted
      {{3}, {-1}, {9}},                                    // decode step
      {{0, 7, 8, 9}, {-1, 0, 0, 1}, {3, 9, 9, 9}},         // nothing accepted
  };
  // Slot of each row: 100 + global row, so every expected slot is easy to read.
  Vec slots(4 + 4 + 1 + 4);
  for (size_t i = 0; i < slots.size(); ++i) slots[i] = 100 + static_cast<int32_t>(i);
  const BatchOut o = RunBatch(trees, &slots);
  ASSERT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.num_accepted, (Vec{3, 2, 0, 0}));
  EXPECT_EQ(o.bonus, (Vec{13, 42, 9, 3}));
  // Request 0 (rows 0..3): accepted local 1,2,3; kept root + path; nothing freed.
  EXPECT_EQ(Vec(o.accepted.begin(), o.accepted.begin() + 3), (Vec{1, 2, 3}));
  EXPECT_EQ(Vec(o.kept.begin(), o.kept.begin() + 4), (Vec{100, 101, 102, 103}));
  // Request 1 (rows 4..7): accepted 2, 3; kept 104, 106, 107; freed 105.
  EXPECT_EQ(Vec(o.accepted.begin() + 4, o.accepted.begin() + 6), (Vec{2, 3}));
  EXPECT_EQ(Vec(o.kept.begin() + 4, o.kept.begin() + 7), (Vec{104, 106, 107}));
  EXPECT_EQ(o.freed[4], 105);
  // Request 2 (row 8): kept its root slot only.
  EXPECT_EQ(o.kept[8], 108);
  // Request 3 (rows 9..12): kept the root; freed all three drafts in row order.
  EXPECT_EQ(o.kept[9], 109);
  EXPECT_EQ(Vec(o.freed.begin() + 9, o.freed.begin() + 12), (Vec{110, 111, 112}));
  // Entries beyond each request's counts are not written.
  EXPECT_EQ(o.accepted[3], kUnwritten);
  EXPECT_EQ(o.freed[0], kUnwritten);
  EXPECT_EQ(o.kept[7], kUnwritten);
  EXPECT_EQ(o.freed[12], kUnwritten);
}

TEST(TreeAcceptReference, WithoutSlotsLeavesKeptAndFreedAlone) {
  const BatchOut o = RunBatch({{{0, 7, 8}, {-1, 0, 0}, {8, 1, 2}}});
  ASSERT_TRUE(o.status.ok());
  EXPECT_EQ(o.num_accepted[0], 1);
  EXPECT_EQ(o.bonus[0], 2);
  for (int32_t v : o.kept) EXPECT_EQ(v, kUnwritten);
  for (int32_t v : o.freed) EXPECT_EQ(v, kUnwritten);
}

// Independent oracle: enumerate every root-to-row path; a row is reachable by the greedy
// walk iff each step on its path matches the parent's prediction and no lower-index sibling
// matched at that step. The deepest such row is where the walk ends.
Vec OracleAccepted(const Tree& t) {
  const int n = static_cast<int>(t.tokens.size());
  std::vector<char> reached(n, 0);
  reached[0] = 1;
  for (int r = 1; r < n; ++r) {
    const int par = t.parents[r];
    if (!reached[par] || t.tokens[r] != t.predictions[par]) continue;
    bool lower_sibling_matches = false;
    for (int s = 1; s < r; ++s)
      if (t.parents[s] == par && t.tokens[s] == t.predictions[par]) lower_sibling_matches = true;
    reached[r] = !lower_sibling_matches;
  }
  int end = 0;
  for (int r = 1; r < n; ++r)
    if (reached[r]) end = r;  // reached rows form one path; the last is the deepest
  Vec path;
  for (int r = end; r != 0; r = t.parents[r]) path.push_back(r);
  std::reverse(path.begin(), path.end());
  return path;
}

TEST(TreeAcceptReference, RandomTreesMatchOracle) {
  // Tokens from a tiny vocabulary so matches, duplicate siblings and deep paths are common.
  std::mt19937 rng(4242);
  std::vector<Tree> trees;
  for (int i = 0; i < 200; ++i) {
    const int n = std::uniform_int_distribution<int>(1, 65)(rng);
    Tree t;
    for (int r = 0; r < n; ++r) {
      t.parents.push_back(r == 0 ? -1 : std::uniform_int_distribution<int>(0, r - 1)(rng));
      t.tokens.push_back(std::uniform_int_distribution<int>(0, 2)(rng));
      t.predictions.push_back(std::uniform_int_distribution<int>(0, 2)(rng));
    }
    trees.push_back(std::move(t));
  }
  Vec slots;
  int total = 0;
  for (const Tree& t : trees) total += static_cast<int>(t.tokens.size());
  for (int i = 0; i < total; ++i) slots.push_back(1000 + i);
  const BatchOut o = RunBatch(trees, &slots);
  ASSERT_TRUE(o.status.ok()) << o.status;
  int row0 = 0, deep = 0;
  for (size_t b = 0; b < trees.size(); ++b) {
    const Tree& t = trees[b];
    const int n = static_cast<int>(t.tokens.size());
    const Vec want = OracleAccepted(t);
    deep = std::max(deep, static_cast<int>(want.size()));
    ASSERT_EQ(o.num_accepted[b], static_cast<int32_t>(want.size())) << "request " << b;
    EXPECT_EQ(Vec(o.accepted.begin() + row0, o.accepted.begin() + row0 + want.size()), want);
    const int last = want.empty() ? 0 : want.back();
    EXPECT_EQ(o.bonus[b], t.predictions[last]);
    // Kept ∪ freed = every row's slot exactly once.
    Vec all(o.kept.begin() + row0, o.kept.begin() + row0 + 1 + want.size());
    all.insert(all.end(), o.freed.begin() + row0, o.freed.begin() + row0 + n - 1 - want.size());
    std::sort(all.begin(), all.end());
    Vec expect(slots.begin() + row0, slots.begin() + row0 + n);
    EXPECT_EQ(all, expect) << "request " << b;
    // The single-request form agrees.
    const TreeAcceptResult single = AcceptTreeGreedy(t.tokens, t.parents, t.predictions);
    EXPECT_EQ(single.accepted_rows, want);
    EXPECT_EQ(single.bonus, o.bonus[b]);
    row0 += n;
  }
  EXPECT_GE(deep, 3) << "random trees too shallow to test depth";
}

void ExpectInvalid(const BatchOut& o, const std::string& field) {
  EXPECT_EQ(o.status.code(), absl::StatusCode::kInvalidArgument) << o.status;
  EXPECT_NE(std::string(o.status.message()).find(field), std::string::npos)
      << "message does not name " << field << ": " << o.status.message();
  for (int32_t v : o.bonus) EXPECT_EQ(v, kUnwritten) << "written on error";
}

TEST(TreeAcceptReference, RejectsBadParents) {
  const Tree good{{0, 1, 2}, {-1, 0, 1}, {1, 2, 3}};
  ASSERT_TRUE(RunBatch({good, good}).status.ok());
  Tree forward = good;
  forward.parents = {-1, 2, 0};  // row 1's parent is after it
  ExpectInvalid(RunBatch({good, forward}), "parents[4]");
  Tree self = good;
  self.parents = {-1, 0, 2};  // row 2 is its own parent
  ExpectInvalid(RunBatch({self}), "parents[2]");
  Tree negative = good;
  negative.parents = {-1, -1, 0};  // only the root may have -1
  ExpectInvalid(RunBatch({negative}), "parents[1]");
  Tree rooted = good;
  rooted.parents = {0, 0, 1};  // the root must have -1
  ExpectInvalid(RunBatch({good, rooted}), "parents[3]");
}

TEST(TreeAcceptReference, RejectsBadIndptr) {
  const Tree good{{0, 1, 2}, {-1, 0, 1}, {1, 2, 3}};
  Vec empty_request = {0, 3, 3};  // request 1 has no root row
  ExpectInvalid(RunBatch({good, good}, nullptr, &empty_request), "row_indptr");
  Vec shifted = {1, 3, 6};
  ExpectInvalid(RunBatch({good, good}, nullptr, &shifted), "row_indptr[0]");
  Vec decreasing = {0, 4, 3};
  ExpectInvalid(RunBatch({good, good}, nullptr, &decreasing), "row_indptr");
}

TEST(TreeAcceptReference, RejectsMissingSlotOutputs) {
  const Tree good{{0, 1}, {-1, 0}, {1, 2}};
  Vec indptr = {0, 2}, slots = {5, 6};
  Vec acc(2), num(1), bonus(1);
  TreeAcceptParams p;
  p.batch = 1;
  p.row_indptr = indptr.data();
  p.tokens = good.tokens.data();
  p.parents = good.parents.data();
  p.predictions = good.predictions.data();
  p.tail_slots = slots.data();
  p.accepted = acc.data();
  p.num_accepted = num.data();
  p.bonus = bonus.data();
  const absl::Status s = TreeAcceptReference(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("kept_slots"), std::string::npos) << s.message();
  p.tail_slots = nullptr;
  p.bonus = nullptr;
  EXPECT_NE(std::string(TreeAcceptReference(p).message()).find("bonus"), std::string::npos);
}

}  // namespace
}  // namespace verifyd::kernels
