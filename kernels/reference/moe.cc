// DeepSeek-V3 MoE routing and combine (see moe.h).
#include "kernels/reference/moe.h"

#include <cmath>
#include <limits>
#include <vector>

namespace verifyd::kernels::ref {
namespace {

// The index of the largest value not yet taken, the lowest index on ties; NaN never wins
// over a number. -1 when every index is taken.
int64_t TakeLargest(const float* v, int64_t n, std::vector<char>* taken) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if ((*taken)[i]) continue;
    if (best < 0 || v[i] > v[best] || (std::isnan(v[best]) && !std::isnan(v[i]))) best = i;
  }
  if (best >= 0) (*taken)[best] = 1;
  return best;
}

}  // namespace

void MoeRoute(const float* logits, int64_t m, const float* bias, const MoeRouting& p,
              int32_t* experts, float* weights) {
  const int64_t E = p.num_experts, G = p.n_group, per_group = E / G;
  std::vector<float> score(E), choice(E), group_score(G);
  std::vector<char> taken;
  for (int64_t r = 0; r < m; ++r) {
    const float* lr = logits + r * E;
    for (int64_t e = 0; e < E; ++e) {
      score[e] = 1.0f / (1.0f + std::exp(-lr[e]));
      choice[e] = score[e] + bias[e];
    }
    // Group score: the sum of the group's two largest choices.
    for (int64_t g = 0; g < G; ++g) {
      taken.assign(per_group, 0);
      const float* cg = choice.data() + g * per_group;
      const int64_t a = TakeLargest(cg, per_group, &taken);
      const int64_t b = TakeLargest(cg, per_group, &taken);
      group_score[g] = b < 0 ? cg[a] : cg[a] + cg[b];
    }
    // Keep topk_group groups; mask the experts of the others to -inf.
    taken.assign(G, 0);
    for (int64_t k = 0; k < p.topk_group; ++k) TakeLargest(group_score.data(), G, &taken);
    for (int64_t g = 0; g < G; ++g) {
      if (taken[g]) continue;
      for (int64_t j = 0; j < per_group; ++j) {
        choice[g * per_group + j] = -std::numeric_limits<float>::infinity();
      }
    }
    // Top-k experts by masked choice; weights from the un-biased scores.
    taken.assign(E, 0);
    int32_t* er = experts + r * p.top_k;
    float* wr = weights + r * p.top_k;
    float sum = 0.0f;
    for (int64_t k = 0; k < p.top_k; ++k) {
      const int64_t e = TakeLargest(choice.data(), E, &taken);
      er[k] = static_cast<int32_t>(e);
      wr[k] = score[e];
      sum += wr[k];
    }
    if (p.norm_topk_prob) {
      const float denominator = sum + 1e-20f;
      for (int64_t k = 0; k < p.top_k; ++k) wr[k] /= denominator;
    }
    for (int64_t k = 0; k < p.top_k; ++k) wr[k] = wr[k] * p.routed_scaling_factor;
  }
}

void AddScaled(float* y, const float* x, float w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i] * w;
}

}  // namespace verifyd::kernels::ref
