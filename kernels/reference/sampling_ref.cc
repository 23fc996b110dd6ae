// Reference sampling and logprobs (see sampling_ref.h and kernels/sampling.h).
#include "kernels/reference/sampling_ref.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

namespace verifyd::kernels::ref {
namespace {

// z = the scaled logits of the row (raw when greedy).
std::vector<float> Scaled(const float* logits, int64_t vocab, float temperature, bool sampled) {
  std::vector<float> z(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) z[i] = ScaledLogit(logits[i], temperature, sampled);
  return z;
}

int32_t Argmax(const float* v, int64_t n) {
  int32_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(v[i])) continue;
    if (best < 0 || v[i] > v[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

// Kept set of already scaled logits z (see kernels/sampling.h).
void KeptSet(const std::vector<float>& z, const SamplingParams& p, std::vector<uint8_t>* keep) {
  const int64_t vocab = static_cast<int64_t>(z.size());
  keep->assign(z.size(), 0);
  std::vector<float> live;
  live.reserve(z.size());
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(z[i])) {
      (*keep)[i] = 1;
      live.push_back(z[i]);
    }
  }
  if (!p.sampled() || live.empty()) return;
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < live.size()) {
    std::nth_element(live.begin(), live.begin() + (p.top_k - 1), live.end(), std::greater<>());
    const float kth = live[p.top_k - 1];
    for (int64_t i = 0; i < vocab; ++i) {
      if ((*keep)[i] && !(z[i] >= kth)) (*keep)[i] = 0;
    }
  }
  if (p.top_p < 1.0f) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < vocab; ++i) {
      if ((*keep)[i]) m = std::max(m, z[i]);
    }
    double total = 0;
    std::vector<int32_t> order;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!(*keep)[i]) continue;
      total += std::exp(static_cast<double>(z[i]) - m);
      order.push_back(static_cast<int32_t>(i));
    }
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    // Groups of equal z: a group is kept iff the mass strictly above it is < top_p.
    double above = 0;
    size_t g = 0;
    while (g < order.size()) {
      size_t e = g;
      double group = 0;
      while (e < order.size() && z[order[e]] == z[order[g]]) {
        group += std::exp(static_cast<double>(z[order[e]]) - m);
        ++e;
      }
      const bool kept = above / total < static_cast<double>(p.top_p);
      for (size_t k = g; k < e; ++k) (*keep)[order[k]] = kept ? 1 : 0;
      above += group;
      g = e;
    }
  }
}

}  // namespace

void SamplingKeptSet(const float* logits, int64_t vocab, const SamplingParams& p,
                     std::vector<uint8_t>* keep) {
  KeptSet(Scaled(logits, vocab, p.temperature, p.sampled()), p, keep);
}

std::vector<double> SamplingDistribution(const float* logits, int64_t vocab,
                                         const SamplingParams& p) {
  std::vector<double> out(static_cast<size_t>(vocab), 0.0);
  if (!p.sampled()) {
    const int32_t best = Argmax(logits, vocab);
    if (best >= 0) out[best] = 1.0;
    return out;
  }
  const std::vector<float> z = Scaled(logits, vocab, p.temperature, true);
  std::vector<uint8_t> keep;
  KeptSet(z, p, &keep);
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    if (keep[i]) m = std::max(m, z[i]);
  }
  double total = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (keep[i]) total += (out[i] = std::exp(static_cast<double>(z[i]) - m));
  }
  if (total > 0) {
    for (double& v : out) v /= total;
  }
  return out;
}

int32_t SampleToken(const float* logits, int64_t vocab, const SamplingParams& p, int64_t position) {
  if (!p.sampled()) return Argmax(logits, vocab);
  const std::vector<float> z = Scaled(logits, vocab, p.temperature, true);
  std::vector<uint8_t> keep;
  KeptSet(z, p, &keep);
  int32_t best = -1;
  double best_score = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!keep[i]) continue;
    const double s =
        static_cast<double>(z[i]) + GumbelNoise(p.seed, position, static_cast<int32_t>(i));
    if (best < 0 || s > best_score) {
      best = static_cast<int32_t>(i);
      best_score = s;
    }
  }
  return best;
}

TokenLogprobs ComputeLogprobs(const float* logits, int64_t vocab, float temperature, bool sampled,
                              int32_t token, int top_n) {
  const std::vector<float> z = Scaled(logits, vocab, temperature, sampled);
  float m = -std::numeric_limits<float>::infinity();
  for (float v : z) {
    if (!std::isnan(v)) m = std::max(m, v);
  }
  double sum = 0;
  for (float v : z) {
    if (!std::isnan(v)) sum += std::exp(static_cast<double>(v) - m);
  }
  const double lse = static_cast<double>(m) + std::log(sum);
  TokenLogprobs out;
  out.token = token;
  out.logprob = token >= 0 && token < vocab ? static_cast<float>(z[token] - lse)
                                            : -std::numeric_limits<float>::infinity();
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(z[i])) ids.push_back(static_cast<int32_t>(i));
  }
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(top_n, 0)), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                    [&](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  for (size_t k = 0; k < n; ++k) {
    out.top_tokens.push_back(ids[k]);
    out.top_logprobs.push_back(static_cast<float>(z[ids[k]] - lse));
  }
  return out;
}

}  // namespace verifyd::kernels::ref
