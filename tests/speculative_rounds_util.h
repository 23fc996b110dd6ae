// Test helpers shared by the CPU and CUDA engine tests' lossless speculative decoding: a random
// draft tree that partly follows the true continuation, and the batched round loop.
#pragma once

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "tp/engine.h"

namespace verifyd::test_util {

// Appends `nodes` draft rows to `q`, whose row 0 is the session's pending token, each under a
// uniformly drawn earlier row. truth[k] is the true token after the pending one; row 0 is on
// the true path when `root_on_truth`. A row under a row on the true path proposes the true
// token at its depth when there is one and `follow()` says so, else a token drawn below `vocab`.
template <typename Rng, typename Follow>
void AddDraftRows(Rng& rng, const std::vector<int32_t>& truth, size_t k, bool root_on_truth,
                  int nodes, int64_t vocab, Follow follow, tp::StepRequest* q) {
  std::vector<int> depth = {0};
  std::vector<bool> on_truth = {root_on_truth};
  for (int i = 0; i < nodes; ++i) {
    const int parent = static_cast<int>(rng() % (i + 1));  // row 0..i
    const int d = depth[parent] + 1;
    const bool can = on_truth[parent] && k + d - 1 < truth.size();
    const int32_t tok = can && follow() ? truth[k + d - 1] : static_cast<int32_t>(rng() % vocab);
    q->tokens.push_back(tok);
    q->parents.push_back(parent);
    depth.push_back(d);
    on_truth.push_back(can && tok == truth[k + d - 1]);
  }
}

// Speculative rounds over `sessions` sessions until `done()` after a round: each round
// `draft(s, &request)` makes session s's request, one engine Step runs them all, and
// `apply(s, request, result)` takes session s's result. `rounds` counts the rounds run. Stops at
// the first fatal failure (a failed Step, or an ASSERT in draft / apply): call it inside
// ASSERT_NO_FATAL_FAILURE.
template <typename Engine, typename Draft, typename Apply, typename Done>
void RunSpeculativeRounds(Engine& e, int sessions, Draft draft, Apply apply, Done done,
                          int64_t* rounds) {
  do {
    std::vector<tp::StepRequest> batch(sessions);
    for (int s = 0; s < sessions; ++s) {
      draft(s, &batch[s]);
      if (::testing::Test::HasFatalFailure()) return;
    }
    auto r = e.Step(batch);
    ASSERT_TRUE(r.ok()) << r.status();
    ++*rounds;
    for (int s = 0; s < sessions; ++s) {
      apply(s, batch[s], (*r)[s]);
      if (::testing::Test::HasFatalFailure()) return;
    }
  } while (!done());
}

}  // namespace verifyd::test_util
