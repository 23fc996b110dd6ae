// Shared vocabulary of the compute ops: element types and the host-side bf16 helpers.
//
// Plain C++ (no CUDA): included by the reference ops, the CUDA launchers' headers, tp/ and
// tests. Thread-safe: only pure functions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace verifyd::kernels {

// Element type of a tensor an op reads or writes.
enum class DType : int {
  kFloat32 = 0,
  kBFloat16 = 1,
};

inline std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kBFloat16:
      return "bfloat16";
  }
  return "unknown";
}

inline size_t DTypeSize(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// bf16 bit pattern on the host (same bits as __nv_bfloat16 on the device).
using bf16_bits = uint16_t;

// Round-to-nearest-even float -> bf16; NaN stays NaN (quiet).
inline bf16_bits FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_bits>((u >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<bf16_bits>((u + rounding) >> 16);
}

inline float Bf16ToFloat(bf16_bits b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rounds a float to the nearest bf16 value and back (what storing in bf16 does).
inline float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

// float8_e4m3fn (the "F8_E4M3" safetensors dtype of FP8 checkpoints) -> float, exactly:
// 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 = subnormal
// (mantissa * 2^-9); no infinities; 0x7f / 0xff are NaN (so the largest finite is 448).
inline float Fp8E4m3ToFloat(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu;
  const uint32_t mant = b & 0x7u;
  uint32_t bits;
  if (exp == 0xfu && mant == 0x7u) {
    bits = sign | 0x7fc00000u;  // NaN
  } else if (exp == 0) {
    // Subnormal or zero: mant * 2^-9, exact in float (mant < 8).
    const float f = static_cast<float>(mant) * (1.0f / 512.0f);
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else {
    bits = sign | ((exp - 7u + 127u) << 23) | (mant << 20);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

}  // namespace verifyd::kernels
