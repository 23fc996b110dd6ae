// Greedy tree acceptance and KV commit for a batch of verify requests.
//
// Rows of request b are r in [row_indptr[b], row_indptr[b+1]); local row 0 is the root (the
// pending token), local row t >= 1 has parent row parents[r] (local index in [0, t)).
// predictions[r] is the target's greedy token after row r.
//
// Acceptance walks from the root: at the current row c, among c's children pick the one with
// the lowest local index whose token equals predictions[c]; accept it and continue from it.
// When no child matches, stop: bonus = predictions[c]. accepted[] lists the accepted local
// rows root side first (the root itself is never listed: it is always kept).
//
// KV commit: the tail slots of the root and of the accepted rows are kept (in path order),
// the other tail slots are freed.
//
// Reference (host pointers) here; the CUDA version in kernels/cuda/tree_accept_cuda.h takes
// the same struct with device pointers. Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace verifyd::kernels {

struct TreeAcceptParams {
  int batch = 0;
  const int32_t* row_indptr = nullptr;   // [batch + 1]
  const int32_t* tokens = nullptr;       // [total_rows] token of each row
  const int32_t* parents = nullptr;      // [total_rows] local parent row, -1 for local row 0
  const int32_t* predictions = nullptr;  // [total_rows] target argmax after each row
  const int32_t* tail_slots = nullptr;   // [total_rows] KV slot of each row (may be null:
                                         // then kept/freed are not written)

  int32_t* accepted = nullptr;      // [total_rows]: request b's accepted local rows at
                                    // accepted[row_indptr[b] ...], num_accepted[b] of them
  int32_t* num_accepted = nullptr;  // [batch]
  int32_t* bonus = nullptr;         // [batch]
  int32_t* kept_slots = nullptr;    // [total_rows]: at kept_slots[row_indptr[b] ...],
                                    // 1 + num_accepted[b] slots (root first)
  int32_t* freed_slots = nullptr;   // [total_rows]: at freed_slots[row_indptr[b] ...],
                                    // n_b - 1 - num_accepted[b] slots, ascending row order
  void* stream = nullptr;           // cudaStream_t for the CUDA path
};

// Validates indptr and parents (InvalidArgument naming the field), then accepts.
absl::Status TreeAcceptReference(const TreeAcceptParams& p);

// Single-request convenience form over the same rule.
struct TreeAcceptResult {
  std::vector<int32_t> accepted_rows;  // local rows >= 1, root side first
  int32_t bonus = -1;
};
TreeAcceptResult AcceptTreeGreedy(const std::vector<int32_t>& tokens,
                                  const std::vector<int32_t>& parents,
                                  const std::vector<int32_t>& predictions);

}  // namespace verifyd::kernels
