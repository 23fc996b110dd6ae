// Plain C++ dense ops of the MLA decoder, float32 in and out, float32 accumulation.
//
// They are the CPU backend's ops and the oracle for the CUDA ops. Every op computes each
// output row from its own input row only, with a fixed summation order (index order), so the
// result for a row does not depend on how many rows are in the batch ("batch-invariant").
// Row loops may run on several threads; the per-row arithmetic never changes.
// Thread-safe: pure functions over caller-owned buffers.
#pragma once

#include <cstdint>

namespace verifyd::kernels::ref {

// y[m, n] = x[m, k] · w[n, k]^T  (w row-major [out, in], the Hugging Face Linear layout).
// x row stride ldx, y row stride ldy (elements).
void Linear(const float* x, int64_t m, int64_t k, int64_t ldx, const float* w, int64_t n, float* y,
            int64_t ldy);

// y[m, n] = x * rsqrt(mean(x^2) + eps) * weight[n]; x, y row stride ld (may alias).
void RmsNorm(const float* x, int64_t m, int64_t n, int64_t ld, const float* weight, float eps,
             float* y);

// Rotary embedding in place on the rope part of each head, Hugging Face DeepSeek-V3 style
// (the rope_dim values are first de-interleaved [x0 x2 x4 ... | x1 x3 ...], then rotated by
// rotate_half with inv_freq[i] = theta^(-2i/rope_dim)).
// x: [m, heads, head_stride]; the rope part is columns [offset, offset + rope_dim) of each
// head. positions[m].
void ApplyRope(float* x, int64_t m, int64_t heads, int64_t head_stride, int64_t offset,
               int64_t rope_dim, const int32_t* positions, float theta);

// out[m, n] = silu(gate) * up; gate/up/out row stride ld.
void SwiGlu(const float* gate, const float* up, int64_t m, int64_t n, int64_t ld, float* out);

// y += x, both [count].
void AddInPlace(float* y, const float* x, int64_t count);

// Per row: the largest value and its index, the lowest index on ties; NaN never wins.
// logits [m, n] row stride ld; index_offset is added to the index (vocab shards).
void ArgmaxRows(const float* logits, int64_t m, int64_t n, int64_t ld, int64_t index_offset,
                float* max_value, int32_t* max_index);

// Rotary embedding in place with a given inv_freq table (rope_dim / 2 floats) and cos / sin
// factor; the same layout and rotation as ApplyRope (ops.h): the rope part of each head is
// de-interleaved, then rotated.
void ApplyRopeTable(float* x, int64_t m, int64_t heads, int64_t head_stride, int64_t offset,
                    int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                    float attention_factor);

}  // namespace verifyd::kernels::ref
