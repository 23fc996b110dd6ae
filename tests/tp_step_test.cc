// tp/step.h: the hidden-state capture plan and the per-request results both engines build a
// step's answer with (the prefill / tree branches of the lossless contract), on a hand-made
// batch whose acceptance outputs come from the reference tree acceptance.
#include <vector>

#include "gtest/gtest.h"
#include "kernels/tree_accept.h"
#include "tp/batch_plan.h"
#include "tp/presets.h"
#include "tp/step.h"

namespace verifyd::tp {
namespace {

// Requests whose contexts start at the same slot (forks) end up adjacent, requests without a
// context first, ties in their given order.
TEST(Step, SharedPrefixOrderGroupsForks) {
  std::vector<StepRequest> batch(6);
  batch[0].context_slots = {40, 41};
  batch[1].context_slots = {7, 8, 9};
  batch[2].context_slots = {};  // a first prefill chunk
  batch[3].context_slots = {40, 41, 50};
  batch[4].context_slots = {7, 8};
  batch[5].context_slots = {};
  EXPECT_EQ(SharedPrefixOrder(batch), (std::vector<size_t>{2, 5, 1, 4, 0, 3}));
  EXPECT_TRUE(SharedPrefixOrder({}).empty());
}

TEST(Step, HiddenCapturesAndResultsFollowTheContract) {
  const ModelConfig c = *PresetConfig("tiny");
  const int64_t hid = c.hidden_size;
  std::vector<StepRequest> batch(3);
  // 0: a prefill chunk of 3 rows, hidden layers {1, 0}.
  batch[0].tokens = {5, 6, 7};
  batch[0].parents = {-1, 0, 1};
  batch[0].tail_slots = {10, 11, 12};
  batch[0].accept = false;
  batch[0].hidden_layers = {1, 0};
  // 1: a tree of 4 rows without hidden states.
  batch[1].context_slots = {0, 1};
  batch[1].tokens = {8, 20, 21, 22};
  batch[1].parents = {-1, 0, 0, 1};
  batch[1].tail_slots = {20, 21, 22, 23};
  // 2: a tree of 3 rows (a chain), hidden layer {1}.
  batch[2].context_slots = {2};
  batch[2].tokens = {9, 30, 31};
  batch[2].parents = {-1, 0, 1};
  batch[2].tail_slots = {30, 31, 32};
  batch[2].hidden_layers = {1};
  EngineLimits lim;
  lim.max_batch = 4;
  lim.max_context = c.max_position_embeddings;
  auto plan = BuildBatchPlan(batch, c, lim, 64);
  ASSERT_TRUE(plan.ok()) << plan.status();

  const HiddenCapturePlan hp = PlanHiddenCaptures(batch, *plan, c);
  ASSERT_EQ(hp.by_layer.size(), static_cast<size_t>(c.num_hidden_layers));
  EXPECT_EQ(hp.base, (std::vector<int64_t>{0, 0, 3 * 2 * hid}));  // 0: no hidden layers
  EXPECT_EQ(hp.floats, 3 * 2 * hid + 3 * hid);
  ASSERT_EQ(hp.by_layer[0].size(), 1u);  // request 0's second layer
  EXPECT_EQ(hp.by_layer[0][0].row0, 0);
  EXPECT_EQ(hp.by_layer[0][0].offset, hid);
  EXPECT_EQ(hp.by_layer[0][0].stride, 2 * hid);
  ASSERT_EQ(hp.by_layer[1].size(), 2u);  // request 0's first layer, request 2's
  EXPECT_EQ(hp.by_layer[1][1].row0, 7);
  EXPECT_EQ(hp.by_layer[1][1].rows, 3);
  EXPECT_EQ(hp.by_layer[1][1].offset, 6 * hid);
  EXPECT_EQ(hp.by_layer[1][1].stride, hid);
  EXPECT_TRUE(
      PlanHiddenCaptures({batch[1]}, *BuildBatchPlan({batch[1]}, c, lim, 64), c).by_layer.empty());

  // Predictions: request 1 accepts node 1 (token 20) then node 3 (22), bonus 40; request 2
  // accepts nothing (bonus 41).
  const std::vector<int32_t> preds = {1, 2, 3, 20, 22, 0, 40, 41, 0, 0};
  const int64_t R = plan->total_rows;
  std::vector<int32_t> accepted(R), kept(R), freed(R), na(3), bonus(3);
  kernels::TreeAcceptParams ap;
  ap.batch = 3;
  ap.row_indptr = plan->q_indptr.data();
  ap.tokens = plan->tokens.data();
  ap.parents = plan->parents.data();
  ap.predictions = preds.data();
  ap.tail_slots = plan->tail_slots.data();
  ap.accepted = accepted.data();
  ap.num_accepted = na.data();
  ap.bonus = bonus.data();
  ap.kept_slots = kept.data();
  ap.freed_slots = freed.data();
  ASSERT_TRUE(kernels::TreeAcceptReference(ap).ok());
  std::vector<float> hidden(hp.floats);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = static_cast<float>(i);
  const std::vector<StepResult> res =
      AssembleStepResults(batch, *plan, preds.data(),
                          {accepted.data(), kept.data(), freed.data(), na.data(), bonus.data()},
                          hidden.data(), hp.base, hid);
  ASSERT_EQ(res.size(), 3u);
  // Prefill: every row kept, bonus = the last prediction, every row's hidden states.
  EXPECT_EQ(res[0].predictions, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(res[0].bonus, 3);
  EXPECT_EQ(res[0].kept_slots, batch[0].tail_slots);
  EXPECT_TRUE(res[0].freed_slots.empty());
  EXPECT_EQ(res[0].hidden, std::vector<float>(hidden.begin(), hidden.begin() + 6 * hid));
  // Tree: the accepted path, its slots kept, the others freed.
  EXPECT_EQ(res[1].accepted_rows, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(res[1].bonus, 40);
  EXPECT_EQ(res[1].kept_slots, (std::vector<int32_t>{20, 21, 23}));
  EXPECT_EQ(res[1].freed_slots, (std::vector<int32_t>{22}));
  EXPECT_TRUE(res[1].hidden.empty());
  // Nothing accepted: the root's slot and hidden row only.
  EXPECT_TRUE(res[2].accepted_rows.empty());
  EXPECT_EQ(res[2].bonus, 41);
  EXPECT_EQ(res[2].kept_slots, (std::vector<int32_t>{30}));
  EXPECT_EQ(res[2].freed_slots, (std::vector<int32_t>{31, 32}));
  EXPECT_EQ(res[2].hidden, std::vector<float>(hidden.begin() + 6 * hid, hidden.begin() + 7 * hid));
}

}  // namespace
}  // namespace verifyd::tp
