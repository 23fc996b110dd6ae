// Elementwise dense ops of the MLA decoder on the GPU: embedding gather, SwiGLU, residual add,
// dtype conversion. fp32 math, as the reference ops (kernels/reference/ops.h).
// Host header (no CUDA code). Thread-safety: launchers are reentrant.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common.h"

namespace verifyd::kernels::cuda {

// out[r, :] = float(table[tokens[r] - vocab_begin, :]) when tokens[r] lies in the table's rows
// [vocab_begin, vocab_begin + vocab_rows), else 0 (a vocab-parallel embedding: each rank holds a
// slice and the ranks' outputs are summed); tokens are trusted (validated on the host).
struct EmbeddingGatherParams {
  int rows = 0;
  int64_t hidden = 0;
  const int32_t* tokens = nullptr;   // [rows], device
  const bf16_bits* table = nullptr;  // [vocab_rows, hidden] bf16, device
  int64_t vocab_begin = 0;
  int64_t vocab_rows = -1;  // < 0: the whole vocabulary (every token is in the table)
  float* out = nullptr;     // [rows, hidden] fp32, device
  void* stream = nullptr;
};
absl::Status EmbeddingGatherCuda(const EmbeddingGatherParams& p);

// out[r, j] = silu(gate[r, j]) * up[r, j], silu(g) = g / (1 + exp(-g)).
//   gate_up [rows, ld_in] fp32: gate at columns [0, n), up at columns [up_offset, up_offset+n)
//   out     [rows, ld_out] bf16
struct SwiGluParams {
  int rows = 0;
  int64_t n = 0;
  const float* gate_up = nullptr;
  int64_t ld_in = 0;
  int64_t up_offset = 0;
  bf16_bits* out = nullptr;
  int64_t ld_out = 0;
  // Optional device ints: only rows [*row_begin, *row_end) (the MoE pairs of this GPU's
  // experts under expert parallelism).
  const int32_t* row_begin = nullptr;
  const int32_t* row_end = nullptr;
  void* stream = nullptr;
};
absl::Status SwiGluCuda(const SwiGluParams& p);

// The fields SwiGluParams and SwiGluQuantFp8Params (moe/moe.h) share for a packed gate_up
// [rows, 2 inter] ([gate | up]) into a packed out [rows, inter] (rows [*row_begin, *row_end)
// only, when given).
template <class Params, class Out>
void SetPackedSwiGlu(Params& p, int64_t rows, int64_t inter, const float* gate_up, Out* out,
                     void* stream, const int32_t* row_begin = nullptr,
                     const int32_t* row_end = nullptr) {
  p.rows = static_cast<decltype(p.rows)>(rows);
  p.gate_up = gate_up;
  p.ld_in = 2 * inter;
  p.up_offset = inter;
  p.out = out;
  p.row_begin = row_begin;
  p.row_end = row_end;
  p.stream = stream;
}

// SwiGluCuda over a packed gate_up [rows, 2 inter] into a packed out [rows, inter] bf16.
inline absl::Status SwiGluPackedCuda(int64_t rows, int64_t inter, const float* gate_up,
                                     bf16_bits* out, void* stream,
                                     const int32_t* row_begin = nullptr,
                                     const int32_t* row_end = nullptr) {
  SwiGluParams p;
  SetPackedSwiGlu(p, rows, inter, gate_up, out, stream, row_begin, row_end);
  p.n = inter;
  p.ld_out = inter;
  return SwiGluCuda(p);
}

// y[i] += x[i], count fp32 elements.
absl::Status AddInPlaceCuda(float* y, const float* x, int64_t count, void* stream);

}  // namespace verifyd::kernels::cuda
