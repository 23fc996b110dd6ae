// Deterministic, counter-based weight values for the preset models.
//
// A preset weight is a pure function of (seed, tensor name, flat element index): no generator
// state, so any element can be produced independently, in any order, on the host or on a GPU
// (a CUDA kernel includes this header and calls the same functions; the arithmetic is plain
// 64-bit integer mixing, one float multiply and one add, then bf16 rounding, so host and device
// produce bit-identical bf16 weights).
//
//   value = RoundToBf16(offset + scale * u),  u uniform in [-1, 1), no FMA contraction:
//   u = ((SplitMix64(SplitMix64(seed ^ NameHash(name)) + index) >> 40) * 2^-23) - 1
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/common.h"

#if defined(__CUDACC__)
#define VERIFYD_HD __host__ __device__
#else
#define VERIFYD_HD
#endif

namespace verifyd::kernels {

// splitmix64 finalizer (Steele, Lea, Flood 2014): a bijective 64-bit mix.
VERIFYD_HD inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a 64 of the tensor name (computed on the host; a kernel receives the hash).
inline uint64_t WeightNameHash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// Per-tensor key: mixes the seed and the name hash once per tensor.
VERIFYD_HD inline uint64_t WeightTensorKey(uint64_t seed, uint64_t name_hash) {
  return SplitMix64(seed ^ name_hash);
}

// Uniform in [-1, 1) with 24 bits, exactly representable in float.
VERIFYD_HD inline float WeightUniform(uint64_t tensor_key, uint64_t index) {
  const uint64_t bits = SplitMix64(tensor_key + index) >> 40;  // 24 bits
  return static_cast<float>(bits) * (1.0f / 8388608.0f) - 1.0f;
}

// Float value before bf16 rounding: offset + scale * u with two separate roundings (a
// multiply, then an add) on host and device alike. Never contracted into an FMA, which would
// round once and change low bits: the device uses __fmul_rn / __fadd_rn, the host goes
// through a volatile product.
VERIFYD_HD inline float WeightValueFloat(uint64_t tensor_key, uint64_t index, float scale,
                                         float offset) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(offset, __fmul_rn(scale, WeightUniform(tensor_key, index)));
#else
  volatile float product = scale * WeightUniform(tensor_key, index);
  return offset + product;
#endif
}

// FP8-quantized tensors of a config with an FP8 quantization_config (tp::IsFp8QuantizedWeight):
// generated the way a DeepSeek-V3 checkpoint stores them, e4m3 codes with a float32 scale per
// 128 x 128 block. The code of element `index` is e4m3(u * 448) (round to nearest even,
// saturating: kernels/kv_fp8.h Fp8E4m3FromFloat; the device's __nv_cvt_float_to_fp8 with
// __NV_SATFINITE), every block's scale is scale / 448, so the logical value
// e4m3(u * 448) * (scale / 448) spreads like the bf16 generator's scale * u (offset 0).
inline constexpr float kWeightFp8Range = 448.0f;
VERIFYD_HD inline float WeightFp8Input(uint64_t tensor_key, uint64_t index) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(kWeightFp8Range, WeightUniform(tensor_key, index));
#else
  volatile float product = kWeightFp8Range * WeightUniform(tensor_key, index);
  return product;
#endif
}
// The block scale (scale_inv) of a generated FP8 tensor whose spec has init_scale `scale`.
inline float WeightFp8Scale(float scale) { return scale / kWeightFp8Range; }

// Host version with bf16 rounding (the device code rounds with __float2bfloat16_rn, which is
// the same round-to-nearest-even).
inline float WeightValue(uint64_t tensor_key, uint64_t index, float scale, float offset) {
  return RoundToBf16(WeightValueFloat(tensor_key, index, scale, offset));
}

}  // namespace verifyd::kernels
