// YaRN rotary embedding as Hugging Face transformers computes it for DeepSeek-V3 / Kimi-K2
// (modeling_rope_utils._compute_yarn_parameters, DeepseekV3RotaryEmbedding,
// apply_rotary_pos_emb_interleave and yarn_apply_mscale), plain C++.
//
// inv_freq follows transformers' float32 tensor arithmetic step by step:
//   exponent[i]  = float(2i) / float(dim)                       (float32)
//   pos_freq[i]  = float(theta) ^ exponent[i]                    (float32 result)
//   extrap[i]    = 1 / pos_freq[i];  interp[i] = 1 / (float(factor) * pos_freq[i])
//   low, high    = floor / ceil of find_correction_dim(beta_fast / beta_slow) (double, as
//                  Python's math), clamped to [0, dim - 1]; high += 0.001 when equal
//   ramp[i]      = clamp((float(i) - low) / (high - low), 0, 1)  (float32)
//   ext_factor   = 1 - ramp;  inv_freq = interp * (1 - ext_factor) + extrap * ext_factor
// cos / sin of float(position) * inv_freq[i] (a float32 product) are rounded to float and
// multiplied by float(attention_factor), attention_factor = get_mscale(factor, mscale) /
// get_mscale(factor, mscale_all_dim) when both are non-zero, else get_mscale(factor), with
// get_mscale(s, m) = 0.1 * m * ln(s) + 1 for s > 1, else 1.
// The CUDA engine's RoPE tables and the CPU engine both use these (kernels/reference/ops.h
// ApplyRopeTable applies a table on the CPU).
// Thread-safe: pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace verifyd::kernels {

struct YarnParams {
  int64_t rope_dim = 0;                          // qk_rope_head_dim (transformers' head_dim)
  double theta = 10000.0;                        // rope_theta
  double factor = 1.0;                           // factor
  int64_t original_max_position_embeddings = 0;  // original_max_position_embeddings
  double beta_fast = 32.0;                       // beta_fast (0 = 32, as transformers' `or`)
  double beta_slow = 1.0;                        // beta_slow (0 = 1)
  double mscale = 0.0;                           // mscale (0 = absent)
  double mscale_all_dim = 0.0;                   // mscale_all_dim (0 = absent)
};

// get_mscale(scale, mscale) = 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1.
double YarnGetMscale(double scale, double mscale);

// The correction range [low, high] (already floored / ceiled and clamped; not yet widened
// by 0.001 when equal).
void YarnCorrectionRange(const YarnParams& p, double* low, double* high);

// The rope_dim / 2 inverse frequencies.
std::vector<float> YarnInvFreq(const YarnParams& p);

// The factor cos and sin are multiplied by.
double YarnAttentionFactor(const YarnParams& p);

// DeepSeek-V3's softmax scale: qk_head_dim^-0.5 * get_mscale(factor, mscale_all_dim)^2 when
// mscale_all_dim != 0, else qk_head_dim^-0.5 (in double, as Python; round to float on use).
double YarnSoftmaxScale(const YarnParams& p, int64_t qk_head_dim);

}  // namespace verifyd::kernels
