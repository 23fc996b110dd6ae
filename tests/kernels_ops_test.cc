// Tests of the dense reference ops (kernels/reference/ops.h): hand-computed cases, a
// float64 comparison on random inputs, the documented summation order, batch invariance.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/reference/dot.h"
#include "kernels/reference/ops.h"

namespace verifyd::kernels::ref {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> RandomVec(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Bitwise float equality (distinguishes -0/+0 and compares NaN payload-free as equal).
bool SameBits(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  uint32_t ua, ub;
  std::memcpy(&ua, &a, 4);
  std::memcpy(&ub, &b, 4);
  return ua == ub;
}

// The blocked-8 order documented in kernels/reference/dot.h, written out independently here
// so a change of the order in the library shows up as a test failure.
float DocumentedOrderDot(const float* a, const float* b, int64_t k) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t k8 = k / 8 * 8;
  for (int64_t blk = 0; blk < k8; blk += 8)
    for (int lane = 0; lane < 8; ++lane) {
      const float prod = a[blk + lane] * b[blk + lane];  // rounded product, then the add
      l[lane] = l[lane] + prod;
    }
  const float left = (l[0] + l[4]) + (l[2] + l[6]);
  const float right = (l[1] + l[5]) + (l[3] + l[7]);
  float s = left + right;
  for (int64_t i = k8; i < k; ++i) {
    const float prod = a[i] * b[i];
    s = s + prod;
  }
  return s;
}

TEST(Linear, HandComputed2x3) {
  // x [2, 3], w [2, 3] (two output features): small integers, so every sum is exact.
  const std::vector<float> x = {1, 2, 3, 4, 5, 6};
  const std::vector<float> w = {1, 0, -1, 2, 1, 0.5f};
  std::vector<float> y(4, kNaN);
  Linear(x.data(), 2, 3, 3, w.data(), 2, y.data(), 2);
  EXPECT_EQ(y[0], 1 * 1 + 2 * 0 + 3 * -1);    // -2
  EXPECT_EQ(y[1], 1 * 2 + 2 * 1 + 3 * 0.5f);  // 5.5
  EXPECT_EQ(y[2], 4 * 1 + 5 * 0 + 6 * -1);    // -2
  EXPECT_EQ(y[3], 4 * 2 + 5 * 1 + 6 * 0.5f);  // 16
}

TEST(Linear, StridesReadAndWriteOnlyTheirColumns) {
  // x rows padded with NaN (must not be read), y padding pre-filled with a sentinel (must not
  // be written).
  std::mt19937 rng(11);
  const int64_t m = 5, k = 19, n = 7, ldx = 24, ldy = 10;
  std::vector<float> x(m * ldx, kNaN);
  const std::vector<float> xv = RandomVec(m * k, rng);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < k; ++j) x[i * ldx + j] = xv[i * k + j];
  const std::vector<float> w = RandomVec(n * k, rng);
  std::vector<float> y(m * ldy, 1234.5f);
  Linear(x.data(), m, k, ldx, w.data(), n, y.data(), ldy);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldy; ++j) {
      if (j < n) {
        EXPECT_FALSE(std::isnan(y[i * ldy + j])) << i << "," << j;
      } else {
        EXPECT_EQ(y[i * ldy + j], 1234.5f) << "padding written at " << i << "," << j;
      }
    }
  }
}

TEST(Linear, MatchesFloat64AndDocumentedOrder) {
  // Shapes around the 8-lane block and the 4-column tile edges, and one large enough to run
  // on several threads. Checks (a) closeness to a float64 dot, (b) bit-identity with the
  // documented blocked-8 order (and the library's scalar BlockedDot, used by attention).
  std::mt19937 rng(7);
  struct Shape {
    int64_t m, k, n;
  };
  const Shape shapes[] = {{1, 1, 1},   {3, 7, 5},     {2, 8, 4},      {4, 9, 9},
                          {6, 33, 13}, {1, 576, 130}, {9, 1000, 257}, {20, 700, 301}};
  for (const Shape& s : shapes) {
    const std::vector<float> x = RandomVec(s.m * s.k, rng);
    const std::vector<float> w = RandomVec(s.n * s.k, rng);
    std::vector<float> y(s.m * s.n, kNaN);
    Linear(x.data(), s.m, s.k, s.k, w.data(), s.n, y.data(), s.n);
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        double ref = 0, mag = 0;
        for (int64_t t = 0; t < s.k; ++t) {
          ref += double{x[i * s.k + t]} * w[j * s.k + t];
          mag += std::abs(double{x[i * s.k + t]} * w[j * s.k + t]);
        }
        const float got = y[i * s.n + j];
        // float32 accumulation: error bounded by ~k * eps * sum|products|.
        EXPECT_NEAR(got, ref, 1e-6 * s.k * mag + 1e-30)
            << "m=" << s.m << " k=" << s.k << " n=" << s.n << " at " << i << "," << j;
        const float order = DocumentedOrderDot(x.data() + i * s.k, w.data() + j * s.k, s.k);
        EXPECT_TRUE(
            SameBits(internal::BlockedDot(x.data() + i * s.k, w.data() + j * s.k, s.k), order))
            << "BlockedDot is not the documented order (k=" << s.k << ")";
        EXPECT_TRUE(SameBits(got, order))
            << "not the blocked-8 order: " << got << " vs " << order << " (m=" << s.m
            << " k=" << s.k << " n=" << s.n << " at " << i << "," << j << ")";
      }
    }
  }
}

TEST(Linear, BatchInvariant) {
  // Each row of a batch is bit-identical to the same row computed alone, whether the batch
  // runs on one thread (small) or several (large: m*n*k above the threading threshold), and
  // whatever its position in the batch.
  std::mt19937 rng(2024);
  struct Shape {
    int64_t m, k, n;
  };
  for (const Shape s : {Shape{13, 100, 37}, Shape{33, 1031, 259}, Shape{70, 512, 3}}) {
    const std::vector<float> x = RandomVec(s.m * s.k, rng, -3.f, 3.f);
    const std::vector<float> w = RandomVec(s.n * s.k, rng);
    std::vector<float> batch(s.m * s.n, kNaN);
    Linear(x.data(), s.m, s.k, s.k, w.data(), s.n, batch.data(), s.n);
    for (int64_t i = 0; i < s.m; ++i) {
      std::vector<float> alone(s.n, kNaN);
      Linear(x.data() + i * s.k, 1, s.k, s.k, w.data(), s.n, alone.data(), s.n);
      for (int64_t j = 0; j < s.n; ++j) {
        ASSERT_TRUE(SameBits(alone[j], batch[i * s.n + j]))
            << "row " << i << " col " << j << " m=" << s.m << " k=" << s.k << " n=" << s.n;
      }
    }
    // The same rows in a different batch: rows 1..m-1 only (shifted positions).
    if (s.m > 1) {
      std::vector<float> shifted((s.m - 1) * s.n, kNaN);
      Linear(x.data() + s.k, s.m - 1, s.k, s.k, w.data(), s.n, shifted.data(), s.n);
      for (int64_t i = 1; i < s.m; ++i)
        for (int64_t j = 0; j < s.n; ++j)
          ASSERT_TRUE(SameBits(shifted[(i - 1) * s.n + j], batch[i * s.n + j]));
    }
  }
}

TEST(RmsNorm, KnownVector) {
  // x = [1, 2, 3, 4]: mean(x^2) = 30 / 4 = 7.5; y = x / sqrt(7.5 + eps) * w.
  const std::vector<float> x = {1, 2, 3, 4};
  const std::vector<float> w = {1, 0.5f, 2, -1};
  const float eps = 1e-6f;
  std::vector<float> y(4, kNaN);
  RmsNorm(x.data(), 1, 4, 4, w.data(), eps, y.data());
  const double inv = 1.0 / std::sqrt(7.5 + 1e-6);
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(y[j], x[j] * inv * w[j], 2e-7 * 4) << j;
}

TEST(RmsNorm, RowsIndependentAndInPlace) {
  std::mt19937 rng(3);
  const int64_t m = 6, n = 50, ld = 53;
  std::vector<float> x(m * ld, kNaN);  // padding columns must not be read
  for (int64_t i = 0; i < m; ++i) {
    const std::vector<float> r = RandomVec(n, rng, -4.f, 4.f);
    std::copy(r.begin(), r.end(), x.begin() + i * ld);
  }
  const std::vector<float> w = RandomVec(n, rng);
  std::vector<float> y(m * ld, 7.f);
  RmsNorm(x.data(), m, n, ld, w.data(), 1e-5f, y.data());
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < n; ++j) ss += double{x[i * ld + j]} * x[i * ld + j];
    const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
    for (int64_t j = 0; j < n; ++j)
      EXPECT_NEAR(y[i * ld + j], x[i * ld + j] * inv * w[j], 1e-5) << i << "," << j;
    for (int64_t j = n; j < ld; ++j) EXPECT_EQ(y[i * ld + j], 7.f);
    // Alone == in batch, bitwise.
    std::vector<float> alone(n);
    RmsNorm(x.data() + i * ld, 1, n, n, w.data(), 1e-5f, alone.data());
    for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(SameBits(alone[j], y[i * ld + j]));
  }
  // In place (x aliases y) gives the same values.
  std::vector<float> inplace = x;
  RmsNorm(inplace.data(), m, n, ld, w.data(), 1e-5f, inplace.data());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(SameBits(inplace[i * ld + j], y[i * ld + j]));
}

TEST(ApplyRope, PositionZeroIsTheDeinterleavePermutation) {
  // At position 0 every angle is 0, so rope only applies HF DeepSeek-V3's de-interleave:
  // [x0 x1 x2 x3 x4 x5] -> [x0 x2 x4 | x1 x3 x5]. Columns outside the rope part untouched.
  std::mt19937 rng(5);
  const int64_t heads = 3, stride = 10, offset = 4, rope = 6;
  std::vector<float> x = RandomVec(heads * stride, rng);
  const std::vector<float> before = x;
  const int32_t pos = 0;
  ApplyRope(x.data(), 1, heads, stride, offset, rope, &pos, 10000.f);
  for (int64_t h = 0; h < heads; ++h) {
    const float* in = before.data() + h * stride;
    const float* out = x.data() + h * stride;
    for (int64_t c = 0; c < offset; ++c) EXPECT_EQ(out[c], in[c]);
    for (int64_t i = 0; i < rope / 2; ++i) {
      EXPECT_EQ(out[offset + i], in[offset + 2 * i]);
      EXPECT_EQ(out[offset + rope / 2 + i], in[offset + 2 * i + 1]);
    }
  }
}

TEST(ApplyRope, KnownAngleMatchesHandRotation) {
  // rope_dim 4, theta 100: inv_freq = [1, 100^(-1/2) = 0.1]. At position 3 the angles are
  // [3, 0.3]. Pair i = (x[2i], x[2i+1]) is rotated by angle i and written to (out[i],
  // out[i + 2]):  out[i] = a cos - b sin,  out[i + 2] = b cos + a sin.
  std::vector<float> x = {0.5f, -1.0f, 2.0f, 0.25f};
  const std::vector<float> in = x;
  const int32_t pos = 3;
  ApplyRope(x.data(), 1, 1, 4, 0, 4, &pos, 100.f);
  const double ang[2] = {3.0, 0.3};
  for (int i = 0; i < 2; ++i) {
    const double a = in[2 * i], b = in[2 * i + 1];
    EXPECT_NEAR(x[i], a * std::cos(ang[i]) - b * std::sin(ang[i]), 1e-6) << i;
    EXPECT_NEAR(x[i + 2], b * std::cos(ang[i]) + a * std::sin(ang[i]), 1e-6) << i;
  }
}

TEST(ApplyRope, PerRowPositionsAndNormPreserved) {
  // Rows at different positions: each row equals itself rotated alone; each pair's norm kept.
  std::mt19937 rng(9);
  const int64_t m = 4, heads = 2, stride = 70, offset = 6, rope = 64;
  std::vector<float> x = RandomVec(m * heads * stride, rng);
  const std::vector<float> in = x;
  const std::vector<int32_t> pos = {0, 17, 4095, 185000};
  ApplyRope(x.data(), m, heads, stride, offset, rope, pos.data(), 10000.f);
  for (int64_t r = 0; r < m; ++r) {
    std::vector<float> alone(in.begin() + r * heads * stride,
                             in.begin() + (r + 1) * heads * stride);
    ApplyRope(alone.data(), 1, heads, stride, offset, rope, &pos[r], 10000.f);
    for (int64_t c = 0; c < heads * stride; ++c)
      EXPECT_TRUE(SameBits(alone[c], x[r * heads * stride + c]));
    for (int64_t h = 0; h < heads; ++h) {
      const float* a = in.data() + (r * heads + h) * stride + offset;
      const float* b = x.data() + (r * heads + h) * stride + offset;
      for (int64_t i = 0; i < rope / 2; ++i) {
        const double n0 = std::hypot(a[2 * i], a[2 * i + 1]);
        const double n1 = std::hypot(b[i], b[i + rope / 2]);
        EXPECT_NEAR(n0, n1, 1e-5) << r << "," << h << "," << i;
      }
    }
  }
}

TEST(SwiGlu, KnownValues) {
  // silu(g) = g / (1 + e^-g); out = silu(gate) * up. Row stride 3 with 2 used columns.
  const std::vector<float> gate = {0.f, 1.f, kNaN, -2.f, 3.f, kNaN};
  const std::vector<float> up = {5.f, 2.f, kNaN, 1.f, -1.f, kNaN};
  std::vector<float> out(6, 99.f);
  SwiGlu(gate.data(), up.data(), 2, 2, 3, out.data());
  EXPECT_EQ(out[0], 0.f);
  EXPECT_NEAR(out[1], 2.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_NEAR(out[3], -2.0 / (1.0 + std::exp(2.0)), 1e-6);
  EXPECT_NEAR(out[4], -3.0 / (1.0 + std::exp(-3.0)), 1e-6);
  EXPECT_EQ(out[2], 99.f);
  EXPECT_EQ(out[5], 99.f);
}

TEST(AddInPlace, Adds) {
  std::vector<float> y = {1.f, -2.f, 0.5f};
  const std::vector<float> x = {0.25f, 2.f, -1.f};
  AddInPlace(y.data(), x.data(), 3);
  EXPECT_EQ(y, (std::vector<float>{1.25f, 0.f, -0.5f}));
}

TEST(ArgmaxRows, TiesNaNAndOffset) {
  // Row stride 6, 5 used columns; column 5 is padding holding the largest value (not read).
  const float big = 1e30f;
  const std::vector<float> logits = {
      1.f,   3.f,   3.f,   2.f,   3.f,   big,  // tie at 1, 2, 4 -> 1
      kNaN,  -1.f,  kNaN,  -0.5f, -7.f,  big,  // NaN first and in the middle -> 3
      kNaN,  kNaN,  kNaN,  kNaN,  kNaN,  big,  // all NaN -> index -1, value NaN
      -kInf, -kInf, -kInf, -kInf, -kInf, big,  // all -inf -> index 0
      0.f,   kInf,  kNaN,  kInf,  5.f,   big,  // +inf tie -> 1
  };
  std::vector<float> value(5, 0.f);
  std::vector<int32_t> index(5, 77);
  ArgmaxRows(logits.data(), 5, 5, 6, 1000, value.data(), index.data());
  EXPECT_EQ(index[0], 1001);
  EXPECT_EQ(value[0], 3.f);
  EXPECT_EQ(index[1], 1003);
  EXPECT_EQ(value[1], -0.5f);
  EXPECT_EQ(index[2], -1);
  EXPECT_TRUE(std::isnan(value[2]));
  EXPECT_EQ(index[3], 1000);
  EXPECT_EQ(value[3], -kInf);
  EXPECT_EQ(index[4], 1001);
  EXPECT_EQ(value[4], kInf);
}

TEST(ArgmaxRows, MatchesScanOnRandomRows) {
  // Values drawn from a small set so ties are common; the lowest index must win.
  std::mt19937 rng(31);
  std::uniform_int_distribution<int> dist(0, 9);
  const int64_t m = 40, n = 257;
  std::vector<float> logits(m * n);
  for (auto& v : logits) v = static_cast<float>(dist(rng));
  std::vector<float> value(m);
  std::vector<int32_t> index(m);
  ArgmaxRows(logits.data(), m, n, n, 0, value.data(), index.data());
  for (int64_t i = 0; i < m; ++i) {
    float best = -1;
    int32_t at = -1;
    for (int64_t j = 0; j < n; ++j)
      if (logits[i * n + j] > best) best = logits[i * n + j], at = static_cast<int32_t>(j);
    EXPECT_EQ(index[i], at) << i;
    EXPECT_EQ(value[i], best) << i;
  }
}

}  // namespace
}  // namespace verifyd::kernels::ref
