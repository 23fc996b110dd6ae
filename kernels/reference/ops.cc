// Plain C++ dense ops (see ops.h). Every op computes an output row from its own input row,
// with a fixed arithmetic order per output element, so results are batch-invariant.
//
// Summation orders:
//   Linear   - the blocked-8 dot order of dot.h for every y[i, j] (over k).
//   RmsNorm  - sum of squares in ascending index order, one float accumulator.
//   others   - elementwise, no reductions (ArgmaxRows scans in ascending index order).
// Linear is the CPU backend's GEMM: 2x4 / 1x4 / 1x1 register tiles of 8-float vectors, and
// above ~2M multiply-adds up to MaxOpThreads() std::threads over output columns (or rows when
// there are few columns). Tiles and threads only decide which elements are computed
// together, never the order inside one element, so every path gives the same bits (tested
// against an independent scalar copy of the order in tests/kernels_ops_test.cc).
#include "kernels/reference/ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/reference/dot.h"
#include "kernels/reference/parallel.h"

namespace verifyd::kernels::ref {
namespace {

using internal::FoldLanes;
using internal::kDotLanes;

// Eight floats as one GCC/Clang vector value: elementwise +,* map onto SSE/AVX/NEON, and the
// eight elements are exactly the eight lanes of the blocked-8 order.
typedef float V8 __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VERIFYD_LINEAR_CLONES __attribute__((target_clones("avx", "default")))
#else
#define VERIFYD_LINEAR_CLONES
#endif

// Linear work below this many multiply-adds runs on the calling thread only (starting a
// thread costs tens of microseconds).
constexpr int64_t kLinearParallelMacs = int64_t{1} << 21;

// Output columns computed together: one x row against kTileN w rows shares each x load.
constexpr int64_t kTileN = 4;

// Steps 2-3 of the blocked-8 order for one output element: fold the lanes, add the tail.
inline float FinishDot(const V8& acc, const float* x, const float* w, int64_t k8, int64_t k) {
  float lanes[kDotLanes];
  std::memcpy(lanes, &acc, sizeof(lanes));
  float s = FoldLanes(lanes);
  for (int64_t i = k8; i < k; ++i) s += x[i] * w[i];
  return s;
}

// y[0..3] = dot(x, w rows 0..3), w rows k apart. Step 1 for four outputs at once.
inline void DotTile1x4(const float* x, const float* w, int64_t k, float* y) {
  const int64_t k8 = k - k % kDotLanes;
  const float* w0 = w;
  const float* w1 = w + k;
  const float* w2 = w + 2 * k;
  const float* w3 = w + 3 * k;
  V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  for (int64_t i = 0; i < k8; i += kDotLanes) {
    V8 xv, b0, b1, b2, b3;
    std::memcpy(&xv, x + i, sizeof(V8));
    std::memcpy(&b0, w0 + i, sizeof(V8));
    std::memcpy(&b1, w1 + i, sizeof(V8));
    std::memcpy(&b2, w2 + i, sizeof(V8));
    std::memcpy(&b3, w3 + i, sizeof(V8));
    a0 += xv * b0;
    a1 += xv * b1;
    a2 += xv * b2;
    a3 += xv * b3;
  }
  y[0] = FinishDot(a0, x, w0, k8, k);
  y[1] = FinishDot(a1, x, w1, k8, k);
  y[2] = FinishDot(a2, x, w2, k8, k);
  y[3] = FinishDot(a3, x, w3, k8, k);
}

// Two x rows against four w rows: y0[0..3] from x0, y1[0..3] from x1. Each w load serves
// two rows (halves the w traffic from cache); per element the same order as DotTile1x4.
inline void DotTile2x4(const float* x0, const float* x1, const float* w, int64_t k, float* y0,
                       float* y1) {
  const int64_t k8 = k - k % kDotLanes;
  const float* wr[kTileN] = {w, w + k, w + 2 * k, w + 3 * k};
  V8 a[2][kTileN] = {};
  for (int64_t i = 0; i < k8; i += kDotLanes) {
    V8 xv0, xv1;
    std::memcpy(&xv0, x0 + i, sizeof(V8));
    std::memcpy(&xv1, x1 + i, sizeof(V8));
    for (int64_t t = 0; t < kTileN; ++t) {
      V8 b;
      std::memcpy(&b, wr[t] + i, sizeof(V8));
      a[0][t] += xv0 * b;
      a[1][t] += xv1 * b;
    }
  }
  for (int64_t t = 0; t < kTileN; ++t) {
    y0[t] = FinishDot(a[0][t], x0, wr[t], k8, k);
    y1[t] = FinishDot(a[1][t], x1, wr[t], k8, k);
  }
}

// One output element, same order (used for the n % 4 last columns).
inline float DotTile1x1(const float* x, const float* w, int64_t k) {
  const int64_t k8 = k - k % kDotLanes;
  V8 a = {};
  for (int64_t i = 0; i < k8; i += kDotLanes) {
    V8 xv, b;
    std::memcpy(&xv, x + i, sizeof(V8));
    std::memcpy(&b, w + i, sizeof(V8));
    a += xv * b;
  }
  return FinishDot(a, x, w, k8, k);
}

// y[m0:m1, n0:n1] of Linear. Column blocks outside, rows inside, so a block of kTileN
// w rows stays in cache while every x row passes over it (w is the large operand in decode).
// Built twice (ifunc dispatch on x86-64 GCC): an AVX version, where each V8 is one 256-bit
// register, and the baseline (SSE2: two 128-bit halves). Both do the same elementwise float
// operations in the same order (no FMA: -ffp-contract=off), so results are identical.
VERIFYD_LINEAR_CLONES
void LinearBlock(const float* x, int64_t m0, int64_t m1, int64_t k, int64_t ldx, const float* w,
                 int64_t n0, int64_t n1, float* y, int64_t ldy) {
  int64_t j = n0;
  for (; j + kTileN <= n1; j += kTileN) {
    const float* wj = w + j * k;
    int64_t i = m0;
    for (; i + 2 <= m1; i += 2) {
      float out0[kTileN], out1[kTileN];
      DotTile2x4(x + i * ldx, x + (i + 1) * ldx, wj, k, out0, out1);
      for (int64_t t = 0; t < kTileN; ++t) {
        y[i * ldy + j + t] = out0[t];
        y[(i + 1) * ldy + j + t] = out1[t];
      }
    }
    for (; i < m1; ++i) {
      float out[kTileN];
      DotTile1x4(x + i * ldx, wj, k, out);
      for (int64_t t = 0; t < kTileN; ++t) y[i * ldy + j + t] = out[t];
    }
  }
  for (; j < n1; ++j) {
    for (int64_t i = m0; i < m1; ++i) y[i * ldy + j] = DotTile1x1(x + i * ldx, w + j * k, k);
  }
}

}  // namespace

void Linear(const float* x, int64_t m, int64_t k, int64_t ldx, const float* w, int64_t n, float* y,
            int64_t ldy) {
  if (m <= 0 || n <= 0) return;
  const int threads = (m * n * k >= kLinearParallelMacs) ? internal::MaxOpThreads() : 1;
  if (n >= kTileN * threads) {
    // Split the output columns (the w rows): each thread streams its own part of w.
    internal::ParallelChunks(n, kTileN, threads, [&](int64_t n0, int64_t n1) {
      LinearBlock(x, 0, m, k, ldx, w, n0, n1, y, ldy);
    });
  } else {
    // Few columns, many rows: split the rows.
    internal::ParallelChunks(m, 1, threads, [&](int64_t m0, int64_t m1) {
      LinearBlock(x, m0, m1, k, ldx, w, 0, n, y, ldy);
    });
  }
}

void RmsNorm(const float* x, int64_t m, int64_t n, int64_t ld, const float* weight, float eps,
             float* y) {
  if (n <= 0) return;
  for (int64_t i = 0; i < m; ++i) {
    const float* xr = x + i * ld;
    float* yr = y + i * ld;
    float sum_sq = 0.f;
    for (int64_t j = 0; j < n; ++j) sum_sq += xr[j] * xr[j];
    // As Hugging Face DeepseekV3RMSNorm: (x * rsqrt(mean(x^2) + eps)) * weight, in float.
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
    for (int64_t j = 0; j < n; ++j) yr[j] = (xr[j] * inv_rms) * weight[j];
  }
}

void ApplyRope(float* x, int64_t m, int64_t heads, int64_t head_stride, int64_t offset,
               int64_t rope_dim, const int32_t* positions, float theta) {
  if (rope_dim <= 0 || rope_dim % 2 != 0) return;
  const int64_t half = rope_dim / 2;
  // inv_freq[i] = theta^(-2i/rope_dim), rounded to float once (HF computes it in float32);
  // cos / sin times 1.0f are exact, so this is the table form with factor 1.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = static_cast<float>(
        1.0 / std::pow(static_cast<double>(theta), static_cast<double>(2 * i) / rope_dim));
  }
  ApplyRopeTable(x, m, heads, head_stride, offset, rope_dim, positions, inv_freq.data(), 1.0f);
}

void SwiGlu(const float* gate, const float* up, int64_t m, int64_t n, int64_t ld, float* out) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float g = gate[i * ld + j];
      const float silu = g / (1.0f + std::exp(-g));
      out[i * ld + j] = silu * up[i * ld + j];
    }
  }
}

void AddInPlace(float* y, const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) y[i] += x[i];
}

void ArgmaxRows(const float* logits, int64_t m, int64_t n, int64_t ld, int64_t index_offset,
                float* max_value, int32_t* max_index) {
  for (int64_t i = 0; i < m; ++i) {
    const float* row = logits + i * ld;
    int64_t best = -1;
    float best_v = std::numeric_limits<float>::quiet_NaN();
    for (int64_t j = 0; j < n; ++j) {
      const float v = row[j];
      if (std::isnan(v)) continue;   // NaN never wins
      if (best < 0 || v > best_v) {  // strict '>': the lowest index wins ties
        best = j;
        best_v = v;
      }
    }
    // A row with no non-NaN value (or n == 0) reports value NaN and index -1, so callers
    // can detect it instead of emitting a made-up token.
    max_value[i] = best_v;
    max_index[i] = best < 0 ? -1 : static_cast<int32_t>(best + index_offset);
  }
}

void ApplyRopeTable(float* x, int64_t m, int64_t heads, int64_t head_stride, int64_t offset,
                    int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                    float attention_factor) {
  if (rope_dim <= 0 || rope_dim % 2 != 0) return;
  const int64_t half = rope_dim / 2;
  std::vector<float> cos_t(static_cast<size_t>(half)), sin_t(static_cast<size_t>(half));
  std::vector<float> deint(static_cast<size_t>(rope_dim));
  for (int64_t r = 0; r < m; ++r) {
    // angle = float(position) * inv_freq (a float32 product, as HF's outer(t, inv_freq));
    // cos/sin of that float angle, correctly rounded via double.
    const float pos = static_cast<float>(positions[r]);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos * inv_freq[i]);
      cos_t[i] = static_cast<float>(std::cos(angle)) * attention_factor;
      sin_t[i] = static_cast<float>(std::sin(angle)) * attention_factor;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_stride + offset;
      // De-interleave [x0 x1 x2 x3 ...] -> [x0 x2 x4 ... | x1 x3 x5 ...] (HF's
      // view(d/2, 2).transpose), then out = v * cos + rotate_half(v) * sin, where
      // rotate_half([a | b]) = [-b | a]. The result stays in the de-interleaved layout.
      for (int64_t i = 0; i < half; ++i) {
        deint[i] = v[2 * i];
        deint[half + i] = v[2 * i + 1];
      }
      for (int64_t i = 0; i < half; ++i) {
        const float a = deint[i], b = deint[half + i];
        v[i] = a * cos_t[i] - b * sin_t[i];
        v[half + i] = b * cos_t[i] + a * sin_t[i];
      }
    }
  }
}

}  // namespace verifyd::kernels::ref
