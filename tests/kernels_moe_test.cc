// The DeepSeek-V3 reference ops beyond the dense MLA: MoE routing (kernels/reference/moe.h)
// on hand-worked examples, YaRN RoPE (kernels/yarn.h) against hand-computed values
// and transformers' float32 table, and the exact float8_e4m3fn decoding (kernels/common.h).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common.h"
#include "kernels/reference/moe.h"
#include "kernels/reference/ops.h"
#include "kernels/yarn.h"

namespace verifyd::kernels::ref {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// 8 experts in 4 groups of 2 ({0,1} {2,3} {4,5} {6,7}), keep 2 groups, top-2 experts.
MoeRouting Routing8() {
  MoeRouting p;
  p.num_experts = 8;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 2;
  p.norm_topk_prob = true;
  p.routed_scaling_factor = 2.0f;
  return p;
}

// scores ~ [.953 .047 .881 .870 .924 .018 .269 .269]; group scores (top-2 sums):
// g0 = 1.000, g1 = 1.751, g2 = 0.942, g3 = 0.538 -> groups 1 and 0 are kept, so experts
// 0 and 2 are chosen; without the group mask the top-2 would be 0 and 4.
const float kLogits[8] = {3.0f, -3.0f, 2.0f, 1.9f, 2.5f, -4.0f, -1.0f, -1.0f};

TEST(MoeRoute, GroupMaskChangesTheChoice) {
  const MoeRouting p = Routing8();
  const std::vector<float> bias(8, 0.0f);
  int32_t experts[2];
  float weights[2];
  MoeRoute(kLogits, 1, bias.data(), p, experts, weights);
  EXPECT_EQ(experts[0], 0);
  EXPECT_EQ(experts[1], 2);  // not 4: expert 4's group (g2) is masked
  const float s0 = Sigmoid(3.0f), s2 = Sigmoid(2.0f);
  const float denom = (s0 + s2) + 1e-20f;
  EXPECT_EQ(weights[0], (s0 / denom) * 2.0f);
  EXPECT_EQ(weights[1], (s2 / denom) * 2.0f);
  // Keeping every group: the plain top-2 (experts 0 and 4).
  MoeRouting all = p;
  all.topk_group = 4;
  MoeRoute(kLogits, 1, bias.data(), all, experts, weights);
  EXPECT_EQ(experts[0], 0);
  EXPECT_EQ(experts[1], 4);
}

TEST(MoeRoute, BiasChangesTheChoiceButNotTheWeight) {
  const MoeRouting p = Routing8();
  std::vector<float> bias(8, 0.0f);
  bias[3] = 0.2f;  // choice[3] = .870 + .2 = 1.070 > choice[0] = .953
  int32_t experts[2];
  float weights[2];
  MoeRoute(kLogits, 1, bias.data(), p, experts, weights);
  EXPECT_EQ(experts[0], 3);
  EXPECT_EQ(experts[1], 0);
  // The weights are the un-biased sigmoid scores, normalised and scaled.
  const float s3 = Sigmoid(1.9f), s0 = Sigmoid(3.0f);
  const float denom = (s3 + s0) + 1e-20f;
  EXPECT_EQ(weights[0], (s3 / denom) * 2.0f);
  EXPECT_EQ(weights[1], (s0 / denom) * 2.0f);
  // A bias can also move a group: a large bias on expert 6 brings group 3 in.
  bias.assign(8, 0.0f);
  bias[6] = 1.0f;  // g3 = 1.269 + .269 = 1.538: groups 1 and 3 kept
  MoeRoute(kLogits, 1, bias.data(), p, experts, weights);
  EXPECT_EQ(experts[0], 6);
  EXPECT_EQ(experts[1], 2);
  EXPECT_EQ(weights[0], (Sigmoid(-1.0f) / ((Sigmoid(-1.0f) + Sigmoid(2.0f)) + 1e-20f)) * 2.0f);
}

TEST(MoeRoute, NoNormalisationAndTies) {
  MoeRouting p = Routing8();
  p.norm_topk_prob = false;
  const std::vector<float> bias(8, 0.0f);
  int32_t experts[2];
  float weights[2];
  MoeRoute(kLogits, 1, bias.data(), p, experts, weights);
  EXPECT_EQ(weights[0], Sigmoid(3.0f) * 2.0f);
  EXPECT_EQ(weights[1], Sigmoid(2.0f) * 2.0f);
  // All equal: the lowest group and expert indices win.
  const std::vector<float> flat(8, 0.5f);
  p.norm_topk_prob = true;
  MoeRoute(flat.data(), 1, bias.data(), p, experts, weights);
  EXPECT_EQ(experts[0], 0);
  EXPECT_EQ(experts[1], 1);
  EXPECT_EQ(weights[0], 1.0f);
  EXPECT_EQ(weights[1], 1.0f);
}

TEST(MoeRoute, RowsAreIndependent) {
  const MoeRouting p = Routing8();
  const std::vector<float> bias = {0.01f, -0.02f, 0.0f, 0.03f, -0.01f, 0.02f, 0.0f, 0.05f};
  std::vector<float> logits(5 * 8);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(0.7f * i) * 3.0f;
  std::vector<int32_t> experts(5 * 2);
  std::vector<float> weights(5 * 2);
  MoeRoute(logits.data(), 5, bias.data(), p, experts.data(), weights.data());
  for (int r = 0; r < 5; ++r) {
    int32_t e1[2];
    float w1[2];
    MoeRoute(logits.data() + r * 8, 1, bias.data(), p, e1, w1);
    EXPECT_EQ(e1[0], experts[r * 2]);
    EXPECT_EQ(e1[1], experts[r * 2 + 1]);
    EXPECT_EQ(w1[0], weights[r * 2]);
    EXPECT_EQ(w1[1], weights[r * 2 + 1]);
  }
}

TEST(MoeRoute, AddScaled) {
  std::vector<float> y = {1.0f, 2.0f, 3.0f};
  const std::vector<float> x = {0.5f, -1.0f, 4.0f};
  AddScaled(y.data(), x.data(), 2.0f, 3);
  EXPECT_EQ(y, (std::vector<float>{2.0f, 0.0f, 11.0f}));
}

// ---- YaRN ------------------------------------------------------------------------------------

// The tiny-moe preset's YaRN, and DeepSeek-V3's (dim 64, theta 1e4, factor 40, original 4096,
// beta 32 / 1).
// clang-format off
//                                      rope theta factor original beta_fast beta_slow mscale mscale_all_dim
constexpr YarnParams kTinyMoeYarn    = {  16,  1e4,   4.0,    1024,     32.0,      1.0,   1.0,           0.8};
constexpr YarnParams kDeepSeekV3Yarn = {  64,  1e4,  40.0,    4096,     32.0,      1.0,   1.0,           1.0};
// clang-format on

TEST(Yarn, HandComputedTable) {
  const YarnParams& p = kTinyMoeYarn;
  // find_correction_dim(32) = 16 ln(1024 / (64 pi)) / (2 ln 1e4) = 1.414 -> floor 1;
  // find_correction_dim(1)  = 16 ln(1024 / (2 pi)) / (2 ln 1e4)  = 4.424 -> ceil 5.
  double low = 0, high = 0;
  YarnCorrectionRange(p, &low, &high);
  EXPECT_EQ(low, 1.0);
  EXPECT_EQ(high, 5.0);
  const std::vector<float> f = YarnInvFreq(p);
  ASSERT_EQ(f.size(), 8u);
  // ramp(i) = clamp((i - 1) / 4): i <= 1 pure extrapolation 1e4^(-i/8); i >= 5 pure
  // interpolation 1e4^(-i/8) / 4; in between the blend.
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[1], 0.31622777, 1e-7);
  EXPECT_NEAR(f[2], 0.25 * 0.025 + 0.75 * 0.1, 1e-8);  // 0.08125
  EXPECT_NEAR(f[3], 0.5 * 0.0316227766 / 4 + 0.5 * 0.0316227766, 1e-8);
  EXPECT_NEAR(f[4], 0.75 * 0.01 / 4 + 0.25 * 0.01, 1e-9);  // 0.004375
  EXPECT_NEAR(f[5], 0.00316227766 / 4, 1e-10);
  EXPECT_NEAR(f[7], 0.000316227766 / 4, 1e-11);
  // Attention factor get_mscale(4, 1) / get_mscale(4, 0.8); softmax correction.
  const double m1 = 0.1 * std::log(4.0) + 1, m08 = 0.08 * std::log(4.0) + 1;
  EXPECT_DOUBLE_EQ(YarnAttentionFactor(p), m1 / m08);
  EXPECT_DOUBLE_EQ(YarnSoftmaxScale(p, 48), std::pow(48.0, -0.5) * m08 * m08);
  YarnParams no_all = p;
  no_all.mscale_all_dim = 0;  // transformers: `mscale and mscale_all_dim` false -> get_mscale(f)
  EXPECT_DOUBLE_EQ(YarnAttentionFactor(no_all), m1);
  EXPECT_DOUBLE_EQ(YarnSoftmaxScale(no_all, 48), std::pow(48.0, -0.5));
  EXPECT_EQ(YarnGetMscale(1.0, 5.0), 1.0);
}

// DeepSeek-V3's rope: the float32 bits of transformers' _compute_yarn_parameters (torch CPU).
TEST(Yarn, MatchesTransformersDeepSeekV3Table) {
  const YarnParams& p = kDeepSeekV3Yarn;
  const uint32_t want[32] = {0x3f800000, 0x3f3ff911, 0x3f0ff59a, 0x3ed7e89b, 0x3ea1e89b, 0x3e72d423,
                             0x3e361887, 0x3e088d77, 0x3dcccccd, 0x3d99940d, 0x3d6655c2, 0x3d1fc5ba,
                             0x3cdc321b, 0x3c968dc3, 0x3c4bf283, 0x3c088d77, 0x3bb43959, 0x3b697066,
                             0x3b136a16, 0x3ab3a2cd, 0x3a4f3e37, 0x39d99312, 0x393a7753, 0x380bd471,
                             0x37d1b717, 0x379d43a3, 0x376bdcf0, 0x3730df51, 0x3704a2b3, 0x36c6ecdd,
                             0x36952c42, 0x365fba4f};
  const std::vector<float> f = YarnInvFreq(p);
  ASSERT_EQ(f.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &f[i], 4);
    EXPECT_EQ(bits, want[i]) << "inv_freq[" << i << "] = " << f[i];
  }
  EXPECT_EQ(YarnAttentionFactor(p), 1.0);  // mscale == mscale_all_dim
  const double m = 0.1 * std::log(40.0) + 1;
  EXPECT_DOUBLE_EQ(YarnSoftmaxScale(p, 192), std::pow(192.0, -0.5) * m * m);
}

TEST(Yarn, RopeTableMatchesPlainRopeForTheSameFrequencies) {
  // With the plain inv_freq table and factor 1, ApplyRopeTable is ApplyRope bit for bit.
  const int64_t rope = 16, heads = 3, stride = 24, offset = 8, m = 4;
  std::vector<float> inv(rope / 2);
  for (int64_t i = 0; i < rope / 2; ++i) {
    inv[i] = static_cast<float>(1.0 / std::pow(10000.0, static_cast<double>(2 * i) / rope));
  }
  std::vector<float> a(m * heads * stride), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::cos(0.37f * i);
  b = a;
  const int32_t pos[4] = {0, 7, 300, 4000};
  ApplyRope(a.data(), m, heads, stride, offset, rope, pos, 10000.0f);
  ApplyRopeTable(b.data(), m, heads, stride, offset, rope, pos, inv.data(), 1.0f);
  EXPECT_EQ(a, b);
  // The attention factor scales the rotated part only.
  std::vector<float> c(m * heads * stride);
  for (size_t i = 0; i < c.size(); ++i) c[i] = std::cos(0.37f * i);
  std::vector<float> d = c;
  ApplyRopeTable(d.data(), m, heads, stride, offset, rope, pos, inv.data(), 2.0f);
  for (int64_t r = 0; r < m * heads; ++r) {
    for (int64_t j = 0; j < stride; ++j) {
      const float got = d[r * stride + j];
      if (j < offset) {
        EXPECT_EQ(got, c[r * stride + j]);
      } else {
        EXPECT_NEAR(got, 2.0f * a[r * stride + j], 1e-5f);
      }
    }
  }
}

// ---- float8_e4m3fn ---------------------------------------------------------------------------

TEST(Fp8E4m3, EveryCodeMatchesTheFormat) {
  for (int code = 0; code < 256; ++code) {
    const int sign = code >> 7, e = (code >> 3) & 15, mant = code & 7;
    const float got = Fp8E4m3ToFloat(static_cast<uint8_t>(code));
    if (e == 15 && mant == 7) {
      EXPECT_TRUE(std::isnan(got)) << code;
      continue;
    }
    // Subnormal: 0.mant * 2^(1 - 7); normal: 1.mant * 2^(e - 7).
    const double mag = e == 0 ? std::ldexp(mant / 8.0, -6) : std::ldexp(1.0 + mant / 8.0, e - 7);
    const double want = sign ? -mag : mag;
    EXPECT_EQ(static_cast<double>(got), want) << "code " << code;
    EXPECT_EQ(std::signbit(got), sign == 1) << "code " << code;
  }
  EXPECT_EQ(Fp8E4m3ToFloat(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(Fp8E4m3ToFloat(0xfe), -448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_EQ(Fp8E4m3ToFloat(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(Fp8E4m3ToFloat(0x38), 1.0f);
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4m3ToFloat(0xff)));
}

}  // namespace
}  // namespace verifyd::kernels::ref
