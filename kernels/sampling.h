// Sampled verification: the one definition of how the target's token is drawn, shared by the
// C++ reference (kernels/reference/sampling_ref.h, the CPU backend) and the CUDA kernel
// (kernels/cuda/sampling/sampling.h). Plain C++ that nvcc also compiles for the device.
//
// The draw for the token at absolute position q of a sequence (the row at position q - 1
// predicts it), with parameters (temperature T, top_k, top_p, seed):
//   z_i = logit_i / T (float division)                       scaled logits; NaN never kept
//   top-k  (0 < top_k < kept count): keep z_i >= the top_k-th largest z (ties at the
//          boundary are all kept)
//   top-p  (top_p < 1): with w_i = exp(z_i - max z) over the tokens kept so far and
//          Z = sum w, keep token i iff M(z_i) < top_p, where M(v) = (sum of w_j with z_j > v) / Z
//          is the probability mass strictly above it (the smallest most-probable set whose
//          mass reaches top_p, ties at the boundary kept); sums in double
//   draw   argmax over the kept tokens of (double) z_i + G(seed, q, i), lowest id on ties, with
//          Gumbel noise G = -log(-log(u)) and u in (0, 1) from a counter-based hash of
//          (seed, q, i) (SplitMix64 finalizer, three rounds).
// Gumbel-max draws token i with probability w_i / Z over the kept set. The noise depends only
// on (seed, q, token), never on the batch, the tree or earlier draws: the token at position q is
// a function of (seed, q, the visible token path), which is what makes speculative sampling
// with draft trees emit exactly the tokens of plain seeded decoding ("coupled" acceptance: a
// draft node is accepted iff its token equals the target's draw after its parent).
//
// Temperatures below kMinSamplingTemperature (0 included) are greedy: the argmax, exactly as
// without sampling (top_k / top_p / seed ignored).
//
// Logprobs (of any token t, at one row): log-softmax of z over the whole vocabulary (before
// top-k / top-p), z = logit / T when sampled and the raw logits when greedy:
//   logprob(t) = z_t - (max z + log(sum_i exp(z_i - max z))), sums in double.
// The best `n` (<= kMaxTopLogprobs) are ordered by z descending, lower id first on ties.
//
// Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/weight_init.h"

#if defined(__CUDACC__)
#define VERIFYD_SAMPLING_FN __host__ __device__ __forceinline__
#else
#define VERIFYD_SAMPLING_FN inline
#endif

namespace verifyd::kernels {

// Temperatures below this draw greedily (as vLLM's sampling epsilon).
inline constexpr float kMinSamplingTemperature = 1e-5f;
// Largest number of alternatives a logprobs answer carries per token.
inline constexpr int kMaxTopLogprobs = 20;

// How a sequence's tokens are drawn.
struct SamplingParams {
  float temperature = 0.0f;  // < kMinSamplingTemperature: greedy
  float top_p = 1.0f;        // (0, 1]; 1: off
  int32_t top_k = 0;         // >= 0; 0: off
  uint64_t seed = 0;

  VERIFYD_SAMPLING_FN bool sampled() const { return temperature >= kMinSamplingTemperature; }
};

// SplitMix64: kernels/weight_init.h's (one definition for weights and sampling noise).

// 64 random bits for (seed, absolute position, token id).
VERIFYD_SAMPLING_FN uint64_t SamplingNoiseBits(uint64_t seed, int64_t position, int32_t token) {
  uint64_t h = SplitMix64(seed ^ 0x243F6A8885A308D3ull);
  h = SplitMix64(h ^ static_cast<uint64_t>(position));
  return SplitMix64(h ^ static_cast<uint64_t>(static_cast<uint32_t>(token)));
}

// Uniform in (0, 1), never 0 or 1: the top 53 bits, centred in their interval.
VERIFYD_SAMPLING_FN double SamplingUniform(uint64_t seed, int64_t position, int32_t token) {
  return (static_cast<double>(SamplingNoiseBits(seed, position, token) >> 11) + 0.5) *
         (1.0 / 9007199254740992.0);
}

// Standard Gumbel noise for (seed, position, token).
VERIFYD_SAMPLING_FN double GumbelNoise(uint64_t seed, int64_t position, int32_t token) {
  return -::log(-::log(SamplingUniform(seed, position, token)));
}

// The scaled logit z of the definition above (raw when greedy).
VERIFYD_SAMPLING_FN float ScaledLogit(float logit, float temperature, bool sampled) {
  return sampled ? logit / temperature : logit;
}

// A total order of non-NaN floats as unsigned integers (a < b iff key(a) < key(b); -0 < +0):
// threshold searches bisect over it.
VERIFYD_SAMPLING_FN uint32_t OrderedFloatKey(float f) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(f);
#else
  std::memcpy(&u, &f, 4);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

VERIFYD_SAMPLING_FN float FloatFromOrderedKey(uint32_t k) {
  const uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

}  // namespace verifyd::kernels
