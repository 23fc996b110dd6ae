// The FP8 latent KV format (`--kv_dtype=fp8`): its one definition. The C++ reference (the CPU
// backend) rounds every latent row it writes through it and computes with the dequantized
// values; GPU kernels must store and read exactly these bytes.
//
// A latent row [kv_lora + rope] (the normed c_kv, then the roped k_pe) is stored as
//   codes   kv_lora bytes: e4m3 (float8_e4m3fn) of c_kv[j] / scale[j / group]
//   scales  ceil(kv_lora / group) float32: scale[g] = max(amax(c_kv over group g), 1e-10) / 448
//   rope    rope bf16 values of k_pe (round to nearest even)
// i.e. 512 + 4 x 4 + 64 x 2 = 656 bytes for DeepSeek-V3 / Kimi-K2 (kv_lora 512, rope 64,
// group 128) against 1,152 in bf16: 1.76x less to read per key. This is the layout FlashMLA
// uses for its FP8 cache; verifyd keeps its scales per token (page size 1: a token's bytes
// never change once written, so a row's keys are the same whatever shares its page).
// Dequantized: c_kv[j] = float(e4m3) * scale[j / group], k_pe = float(bf16).
// The group is kKvFp8Group columns (the last group of a kv_lora that is not a multiple holds
// the rest): measured against one scale per row on the reference checkpoints (docs/PERF.md).
//
// e4m3 encoding (Fp8E4m3FromFloat; decoding: kernels/common.h Fp8E4m3ToFloat): the nearest
// finite e4m3 value, ties to the even code, saturating at +-448: the device's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) for finite x.
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common.h"  // Fp8E4m3ToFloat, RoundToBf16

namespace verifyd::kernels {

inline constexpr int kKvFp8Group = 128;    // c_kv columns per scale
inline constexpr float kE4m3Max = 448.0f;  // largest finite e4m3
inline constexpr float kKvFp8MinAmax = 1e-10f;

// The layout helpers below are constexpr host and device functions (the CUDA KV write uses
// them; the attention kernels' row constants are computed from them).
#if defined(__CUDACC__)
#define VERIFYD_KV_FP8_HD __host__ __device__
#else
#define VERIFYD_KV_FP8_HD
#endif

// Bytes of one latent row in the FP8 format.
VERIFYD_KV_FP8_HD constexpr int64_t KvFp8RowBytes(int64_t kv_lora, int64_t rope, int64_t group) {
  return kv_lora + 4 * ((kv_lora + group - 1) / group) + 2 * rope;
}

// The nearest finite e4m3 code (ties to even: std::nearbyint in the default rounding mode;
// the scaled values are exact), saturating; NaN input -> 0x7f.
inline uint8_t Fp8E4m3FromFloat(float x) {
  if (x != x) return 0x7f;
  const uint8_t sign = std::copysign(1.0f, x) < 0.0f ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return sign | 0x7e;
  if (a < 0.015625f) {  // below 2^-6: subnormals m * 2^-9 (code m; 8 is the first normal)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int e2 = 0;
  const float f = std::frexp(a, &e2);  // a = f * 2^e2, f in [0.5, 1)
  int u = e2 - 1;                      // a = (2 f) * 2^u, u in [-6, 8]
  int m = static_cast<int>(std::nearbyint((2.0f * f - 1.0f) * 8.0f));
  if (m == 8) {
    m = 0;
    ++u;
  }
  if (u > 8 || (u == 8 && m == 7)) return sign | 0x7e;  // above 448 rounds to 448
  return sign | static_cast<uint8_t>(((u + 7) << 3) | m);
}

// The scale of c_kv columns [begin, end) of a row.
inline float KvFp8Scale(const float* c_kv, int64_t begin, int64_t end) {
  float amax = 0.0f;
  for (int64_t j = begin; j < end; ++j) amax = std::fmax(amax, std::fabs(c_kv[j]));
  return std::fmax(amax, kKvFp8MinAmax) / kE4m3Max;
}

// Rounds a latent row [kv_lora + rope] to what the FP8 format stores, in place: c_kv through
// e4m3 with its group scales, k_pe through bf16. (The value the kernels dequantize.)
inline void KvFp8RoundTrip(float* row, int64_t kv_lora, int64_t rope, int64_t group) {
  for (int64_t g0 = 0; g0 < kv_lora; g0 += group) {
    const int64_t g1 = g0 + group < kv_lora ? g0 + group : kv_lora;
    const float s = KvFp8Scale(row, g0, g1);
    for (int64_t j = g0; j < g1; ++j) row[j] = Fp8E4m3ToFloat(Fp8E4m3FromFloat(row[j] / s)) * s;
  }
  for (int64_t j = kv_lora; j < kv_lora + rope; ++j) row[j] = RoundToBf16(row[j]);
}

// Byte offsets within a stored row: the scales after the codes, the bf16 rope part after them.
VERIFYD_KV_FP8_HD constexpr int64_t KvFp8ScaleOffset(int64_t kv_lora) { return kv_lora; }
VERIFYD_KV_FP8_HD constexpr int64_t KvFp8RopeOffset(int64_t kv_lora, int64_t group) {
  return kv_lora + 4 * ((kv_lora + group - 1) / group);
}

// Stores a latent row [kv_lora + rope] (float) as the format's KvFp8RowBytes bytes at `out`
// (the bytes the GPU's KV write produces for the same float row).
inline void KvFp8EncodeRow(const float* row, int64_t kv_lora, int64_t rope, int64_t group,
                           uint8_t* out) {
  for (int64_t g0 = 0; g0 < kv_lora; g0 += group) {
    const int64_t g1 = g0 + group < kv_lora ? g0 + group : kv_lora;
    const float s = KvFp8Scale(row, g0, g1);
    std::memcpy(out + KvFp8ScaleOffset(kv_lora) + 4 * (g0 / group), &s, 4);
    for (int64_t j = g0; j < g1; ++j) out[j] = Fp8E4m3FromFloat(row[j] / s);
  }
  uint8_t* rope_out = out + KvFp8RopeOffset(kv_lora, group);
  for (int64_t j = 0; j < rope; ++j) {
    const bf16_bits b = FloatToBf16(row[kv_lora + j]);
    std::memcpy(rope_out + 2 * j, &b, 2);
  }
}

// The dequantized row [kv_lora + rope] (float) of a stored row (what every kernel computes
// with, up to its own rounding of the products).
inline void KvFp8DecodeRow(const uint8_t* in, int64_t kv_lora, int64_t rope, int64_t group,
                           float* row) {
  for (int64_t j = 0; j < kv_lora; ++j) {
    float s = 0.0f;
    std::memcpy(&s, in + KvFp8ScaleOffset(kv_lora) + 4 * (j / group), 4);
    row[j] = Fp8E4m3ToFloat(in[j]) * s;
  }
  const uint8_t* rope_in = in + KvFp8RopeOffset(kv_lora, group);
  for (int64_t j = 0; j < rope; ++j) {
    bf16_bits b = 0;
    std::memcpy(&b, rope_in + 2 * j, 2);
    row[kv_lora + j] = Bf16ToFloat(b);
  }
}

}  // namespace verifyd::kernels
