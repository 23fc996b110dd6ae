// Greedy token selection on the GPU, vocab-parallel.
//
// ArgmaxRowsCuda: per row, the largest logit of this rank's vocab shard and its global index
// (lowest index on ties, NaN never wins; a row with no non-NaN value gives value NaN, index
// -1), as kernels::ref::ArgmaxRows. Written as packed (value, index) pairs so that one
// all-gather of rows * 8 bytes moves every rank's candidates.
// ArgmaxCombineCuda: from the gathered [world, rows] pairs, every rank picks the same winner:
// ranks in order, strict '>' (shards are in ascending vocab order, so the lowest index wins
// ties), NaN / -1 skipped.
// Host header (no CUDA code). Thread-safety: launchers are reentrant.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace verifyd::kernels::cuda {

struct ArgmaxPair {
  float value;
  int32_t index;
};
static_assert(sizeof(ArgmaxPair) == 8, "ArgmaxPair is gathered as 8 bytes");

struct ArgmaxRowsParams {
  int rows = 0;
  int64_t n = 0;                  // columns of this shard (may be 0: empty shard)
  const float* logits = nullptr;  // [rows, ld] fp32, device
  int64_t ld = 0;
  int64_t index_offset = 0;   // global index of column 0 (the shard's first vocab row)
  ArgmaxPair* out = nullptr;  // [rows], device
  void* stream = nullptr;
};
absl::Status ArgmaxRowsCuda(const ArgmaxRowsParams& p);

struct ArgmaxCombineParams {
  int rows = 0;
  int world = 1;
  const ArgmaxPair* gathered = nullptr;  // [world, rows], device
  int32_t* predictions = nullptr;        // [rows], device
  void* stream = nullptr;
};
absl::Status ArgmaxCombineCuda(const ArgmaxCombineParams& p);

}  // namespace verifyd::kernels::cuda
