// YaRN RoPE (see yarn.h). Built with -ffp-contract=off (in verifyd_kernels_ref): each float
// operation below is one rounded float32 operation, as in the torch code it mirrors.
#include "kernels/yarn.h"

#include <algorithm>
#include <cmath>

namespace verifyd::kernels {
namespace {

constexpr double kPi = 3.141592653589793;  // math.pi

// transformers' find_correction_dim, in Python's double arithmetic and operation order.
double FindCorrectionDim(double num_rotations, double dim, double base, double max_pos) {
  return (dim * std::log(max_pos / (num_rotations * 2 * kPi))) / (2 * std::log(base));
}

}  // namespace

double YarnGetMscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

void YarnCorrectionRange(const YarnParams& p, double* low, double* high) {
  const double dim = static_cast<double>(p.rope_dim);
  const double beta_fast = p.beta_fast != 0 ? p.beta_fast : 32.0;
  const double beta_slow = p.beta_slow != 0 ? p.beta_slow : 1.0;
  const double orig = static_cast<double>(p.original_max_position_embeddings);
  const double lo = std::floor(FindCorrectionDim(beta_fast, dim, p.theta, orig));
  const double hi = std::ceil(FindCorrectionDim(beta_slow, dim, p.theta, orig));
  *low = std::max(lo, 0.0);
  *high = std::min(hi, dim - 1);
}

std::vector<float> YarnInvFreq(const YarnParams& p) {
  const int64_t half = p.rope_dim / 2;
  double low = 0, high = 0;
  YarnCorrectionRange(p, &low, &high);
  if (low == high) high += 0.001;  // linear_ramp_factor's singularity guard
  // torch: (arange(half, float32) - min) / (max - min); the Python numbers are cast to
  // float32 for the tensor op.
  const float fmin = static_cast<float>(low);
  const float frange = static_cast<float>(high - low);
  const float fbase = static_cast<float>(p.theta);
  const float ffactor = static_cast<float>(p.factor);
  const float fdim = static_cast<float>(p.rope_dim);
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / fdim;
    const float pos_freq =
        static_cast<float>(std::pow(static_cast<double>(fbase), static_cast<double>(exponent)));
    const float extrap = 1.0f / pos_freq;
    const float interp = 1.0f / (ffactor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - fmin) / frange, 0.0f, 1.0f);
    const float ext_factor = 1.0f - ramp;
    const float a = interp * (1.0f - ext_factor);
    const float b = extrap * ext_factor;
    inv_freq[i] = a + b;
  }
  return inv_freq;
}

double YarnAttentionFactor(const YarnParams& p) {
  if (p.mscale != 0 && p.mscale_all_dim != 0) {
    return YarnGetMscale(p.factor, p.mscale) / YarnGetMscale(p.factor, p.mscale_all_dim);
  }
  return YarnGetMscale(p.factor, 1.0);
}

double YarnSoftmaxScale(const YarnParams& p, int64_t qk_head_dim) {
  double scale = std::pow(static_cast<double>(qk_head_dim), -0.5);
  if (p.mscale_all_dim != 0) {
    const double m = YarnGetMscale(p.factor, p.mscale_all_dim);
    scale = scale * m * m;
  }
  return scale;
}

}  // namespace verifyd::kernels
