// The FP8 latent KV format (kernels/kv_fp8.h): the e4m3 encoder against an exhaustive nearest
// search, every finite code round-tripping, and a latent row's round trip within the format's
// error bound (c_kv: half an e4m3 step of its group's scale; k_pe: bf16 rounding).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/kv_fp8.h"

namespace verifyd::kernels {
namespace {

// The nearest finite e4m3 code by search (ties to the even code), saturating at 448.
uint8_t NearestE4m3(float x) {
  const float a = std::fabs(x);
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const float d = std::fabs(Fp8E4m3ToFloat(static_cast<uint8_t>(c)) - a);
    const float db = std::fabs(Fp8E4m3ToFloat(static_cast<uint8_t>(best)) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

constexpr int kRope = 64;  // k_pe values of a latent row

// A latent row: kv_lora c_kv values, then kRope k_pe values, normal with deviation `sd`.
std::vector<float> RandomRow(int kv_lora, float sd, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> row(kv_lora + kRope);
  for (auto& v : row) v = nd(rng) * sd;
  return row;
}

// `row` through the FP8 format and back.
std::vector<float> RoundTripped(std::vector<float> row, int kv_lora) {
  KvFp8RoundTrip(row.data(), kv_lora, kRope, kKvFp8Group);
  return row;
}

TEST(KvFp8, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN codes
    const float v = Fp8E4m3ToFloat(static_cast<uint8_t>(c));
    EXPECT_EQ(Fp8E4m3FromFloat(v), c == 0x80 ? 0x80 : c) << "code " << c << " value " << v;
  }
  EXPECT_EQ(Fp8E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4m3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8E4m3ToFloat(0x08), std::ldexp(1.0f, -6));
}

TEST(KvFp8, EncoderIsTheNearestCodeTiesToEven) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(-1.f, 1.f);
  std::uniform_int_distribution<int> ex(-14, 10);
  std::vector<float> xs = {0.f,
                           -0.f,
                           448.f,
                           -448.f,
                           460.f,
                           464.f,
                           470.f,
                           1e9f,
                           -1e9f,
                           std::ldexp(1.f, -10),
                           std::ldexp(3.f, -10),
                           std::ldexp(1.f, -12)};
  // Midpoints between neighbouring codes (exact ties) and random values of every binade.
  for (int c = 0; c < 0x7e; ++c) {
    xs.push_back(0.5f * (Fp8E4m3ToFloat(static_cast<uint8_t>(c)) +
                         Fp8E4m3ToFloat(static_cast<uint8_t>(c + 1))));
  }
  for (int i = 0; i < 20000; ++i) xs.push_back(std::ldexp(mant(rng), ex(rng)));
  for (const float x : xs) {
    EXPECT_EQ(Fp8E4m3FromFloat(x), NearestE4m3(x)) << "x = " << x;
  }
  EXPECT_EQ(Fp8E4m3FromFloat(NAN) & 0x7f, 0x7f);
}

TEST(KvFp8, RowRoundTripWithinTheFormatsError) {
  EXPECT_EQ(KvFp8RowBytes(512, 64, kKvFp8Group), 656);
  EXPECT_EQ(KvFp8RowBytes(32, 16, kKvFp8Group), 32 + 4 + 32);  // one partial group
  std::mt19937 rng(11);
  for (const int kv_lora : {512, 32, 200}) {
    std::vector<float> row = RandomRow(kv_lora, 2.f, rng);
    row[3] = 0.f;
    const std::vector<float> rt = RoundTripped(row, kv_lora);
    for (int g0 = 0; g0 < kv_lora; g0 += kKvFp8Group) {
      const int g1 = std::min(g0 + kKvFp8Group, kv_lora);
      float amax = 0.f;
      for (int j = g0; j < g1; ++j) amax = std::max(amax, std::fabs(row[j]));
      const float s = amax / kE4m3Max;
      for (int j = g0; j < g1; ++j) {
        // Half a step: 1/16 of the value's binade when normal, s * 2^-10 when subnormal.
        const float bound = std::max(std::fabs(row[j]) / 16.f, s * std::ldexp(1.f, -10));
        EXPECT_LE(std::fabs(rt[j] - row[j]), bound * 1.0001f)
            << "kv_lora " << kv_lora << " j " << j;
      }
      // The group's largest value is exact (it maps to 448).
      for (int j = g0; j < g1; ++j) {
        if (std::fabs(row[j]) == amax) EXPECT_FLOAT_EQ(rt[j], row[j]);
      }
    }
    EXPECT_EQ(rt[3], 0.f);
    for (int j = kv_lora; j < kv_lora + kRope; ++j) {
      EXPECT_EQ(rt[j], RoundToBf16(row[j]));
      EXPECT_LE(std::fabs(rt[j] - row[j]), std::fabs(row[j]) * std::ldexp(1.f, -8));
    }
  }
  // An all-zero group stays zero (the scale floor keeps the division finite).
  std::vector<float> zero(128 + 64, 0.f);
  KvFp8RoundTrip(zero.data(), 128, 64, kKvFp8Group);
  for (const float v : zero) EXPECT_EQ(v, 0.f);
}

// The stored bytes decode to exactly the round trip's values (the CPU backend computes with
// the round trip, the GPU kernels with the bytes), at the documented offsets.
TEST(KvFp8, EncodedBytesDecodeToTheRoundTrip) {
  std::mt19937 rng(13);
  for (const int kv_lora : {512, 64, 200}) {
    const std::vector<float> row = RandomRow(kv_lora, 3.f, rng);
    std::vector<uint8_t> bytes(KvFp8RowBytes(kv_lora, kRope, kKvFp8Group), 0xAB);
    KvFp8EncodeRow(row.data(), kv_lora, kRope, kKvFp8Group, bytes.data());
    std::vector<float> decoded(row.size(), NAN);
    KvFp8DecodeRow(bytes.data(), kv_lora, kRope, kKvFp8Group, decoded.data());
    const std::vector<float> rt = RoundTripped(row, kv_lora);
    for (size_t j = 0; j < row.size(); ++j) EXPECT_EQ(decoded[j], rt[j]) << kv_lora << " " << j;
    // The first scale sits right after the codes; the rope part after the last scale.
    float s0 = 0.f;
    std::memcpy(&s0, bytes.data() + kv_lora, 4);
    EXPECT_EQ(s0, KvFp8Scale(row.data(), 0, std::min(kv_lora, kKvFp8Group)));
    bf16_bits r0 = 0;
    std::memcpy(&r0, bytes.data() + KvFp8RopeOffset(kv_lora, kKvFp8Group), 2);
    EXPECT_EQ(r0, FloatToBf16(row[kv_lora]));
  }
}

}  // namespace
}  // namespace verifyd::kernels
