// Sampled token selection and logprobs on the GPU: the definition of kernels/sampling.h (the
// C++ reference is kernels/reference/sampling_ref.h), over full-vocabulary logits that may be
// laid out in vocab shards (the CUDA engine's all-gathered [world, rows, vmax] buffer; one
// shard at TP 1).
//
// One thread block per selected row, a fixed number of threads and fixed reduction orders, so a
// row's result depends only on its logits and parameters (batch-invariant, deterministic).
// Top-k is a radix select over the float order (4 passes of 256-bin integer histograms), top-p
// a bisection over it (32 passes of block-wide probability masses in double; exp only for the
// top-k survivors when top-k is set), no sort; the draw is a Gumbel-max
// with the counter-based noise of kernels/sampling.h; the top logprobs are found by repeated
// block argmax.
//
// Host header (no CUDA code). Thread-safety: the launcher is reentrant.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/sampling.h"

namespace verifyd::kernels::cuda {

// What to do for one row (device array).
struct SampleRowSpec {
  int32_t row = 0;            // logits row (and predictions index)
  int32_t draw = 0;           // 1: replace predictions[row] by the draw (params sampled)
  int32_t top_logprobs = -1;  // >= 0: write the logprobs of predictions[row] (after the draw)
  int32_t top_k = 0;
  float temperature = 0;
  float top_p = 1;
  uint64_t seed = 0;
  int64_t position = 0;  // absolute position of the drawn token (the row's position + 1)
};

// Logprobs of one row's prediction (device array, one per spec).
struct SampledLogprobs {
  int32_t token;
  float logprob;
  int32_t top_tokens[kMaxTopLogprobs];
  float top_logprobs[kMaxTopLogprobs];
};

struct SampleRowsParams {
  int rows = 0;                          // specs
  const SampleRowSpec* specs = nullptr;  // [rows], device
  // Token t of logits row r: logits[(t / vmax) * shard_stride + r * vmax + t % vmax].
  const float* logits = nullptr;
  int64_t vocab = 0;
  int64_t vmax = 0;  // shard width (= vocab at TP 1)
  int64_t shard_stride = 0;
  int32_t* predictions = nullptr;  // [logits rows], device: read (greedy), written (draws)
  SampledLogprobs* out = nullptr;  // [rows], device (written where top_logprobs >= 0)
  void* stream = nullptr;
};

absl::Status SampleRowsCuda(const SampleRowsParams& p);

}  // namespace verifyd::kernels::cuda
