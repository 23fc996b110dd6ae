// Absorbed MLA (queries projected into the latent space, attention over the latent cache,
// output multiplied by W_UV) equals the standard, unabsorbed multi-head attention with
// k = [W_UK · c_kv | k_pe] and v = W_UV · c_kv, on random trees over random contexts.
#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "tp/cpu/cpu_forward.h"
#include "tp/presets.h"

namespace verifyd::tp {
namespace {

TEST(AbsorbedMla, EqualsUnabsorbedAttention) {
  ModelConfig c = *PresetConfig("tiny", 1);
  ModelWeights w = *GenerateRandomWeights(c, 21);
  const HostTensor& kvb = *w.Find("model.layers.0.self_attn.kv_b_proj.weight");
  const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t v = c.v_head_dim, kvl = c.kv_lora_rank, lat = c.latent_dim(), qk = c.qk_head_dim();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 1);
  const int64_t kv_slots = 300;
  for (int world : {1, 2}) {
    for (int rank = 0; rank < world; ++rank) {
      RankWeights rw = *ShardWeights(w, world, rank);
      const int64_t Hl = rw.heads.size;
      // Latent cache: NaN everywhere except the slots in use.
      std::vector<float> kv(kv_slots * lat, std::numeric_limits<float>::quiet_NaN());
      std::vector<int32_t> perm(kv_slots);
      for (int i = 0; i < kv_slots; ++i) perm[i] = i;
      std::shuffle(perm.begin(), perm.end(), rng);
      int next_slot = 0;
      std::vector<StepRequest> batch(3);
      for (auto& q : batch) {
        const int ctx = static_cast<int>(rng() % 40);
        const int n = 1 + static_cast<int>(rng() % 12);
        for (int i = 0; i < ctx; ++i) q.context_slots.push_back(perm[next_slot++]);
        for (int t = 0; t < n; ++t) {
          q.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
          q.parents.push_back(t == 0 ? -1 : static_cast<int32_t>(rng() % t));
          q.tail_slots.push_back(perm[next_slot++]);
        }
        for (int32_t s : q.context_slots)
          for (int64_t j = 0; j < lat; ++j) kv[s * lat + j] = nd(rng);
        for (int32_t s : q.tail_slots)
          for (int64_t j = 0; j < lat; ++j) kv[s * lat + j] = nd(rng);
      }
      EngineLimits lim;
      lim.max_context = c.max_position_embeddings;
      absl::StatusOr<BatchPlan> plan = BuildBatchPlan(batch, c, lim, kv_slots);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int64_t R = plan->total_rows;
      std::vector<float> q(R * Hl * qk);
      for (float& x : q) x = nd(rng);
      std::vector<float> out(R * Hl * v, std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(AbsorbedMlaAttention(c, Hl, *plan, q.data(), rw.layers[0].w_uk_t.data(),
                                       rw.layers[0].w_uv.data(), kv.data(), kv_slots, out.data())
                      .ok());
      // Unabsorbed reference in double.
      const double scale = 1.0 / std::sqrt(static_cast<double>(qk));
      double max_err = 0, max_ref = 0;
      for (int b = 0; b < plan->batch; ++b) {
        const int r0 = plan->q_indptr[b], n = plan->q_indptr[b + 1] - r0;
        const int k0 = plan->kv_indptr[b], L = plan->kv_indptr[b + 1] - k0, P = L - n;
        for (int t = 0; t < n; ++t) {
          const int r = r0 + t;
          for (int64_t hl = 0; hl < Hl; ++hl) {
            const int64_t gh = rw.heads.begin + hl;
            const float* wk = kvb.data.data() + gh * (nope + v) * kvl;  // [nope, kvl]
            const float* wv = wk + nope * kvl;                          // [v, kvl]
            const float* qq = q.data() + (r * Hl + hl) * qk;
            std::vector<double> s;
            std::vector<std::vector<double>> vals;
            for (int j = 0; j < L; ++j) {
              const bool visible =
                  j < P || ((plan->tree_mask[r * kMaskWords + (j - P) / 64] >> ((j - P) % 64)) & 1);
              if (!visible) continue;
              const float* row = kv.data() + int64_t{plan->kv_indices[k0 + j]} * lat;
              double dot = 0;
              for (int64_t d = 0; d < nope; ++d) {
                double k = 0;
                for (int64_t m = 0; m < kvl; ++m) k += double{wk[d * kvl + m]} * row[m];
                dot += qq[d] * k;
              }
              for (int64_t d = 0; d < rope; ++d) dot += double{qq[nope + d]} * row[kvl + d];
              s.push_back(dot * scale);
              std::vector<double> vv(v);
              for (int64_t i = 0; i < v; ++i) {
                for (int64_t m = 0; m < kvl; ++m) vv[i] += double{wv[i * kvl + m]} * row[m];
              }
              vals.push_back(vv);
            }
            ASSERT_FALSE(s.empty());  // a row always sees itself
            const double mx = *std::max_element(s.begin(), s.end());
            double den = 0;
            for (double x : s) den += std::exp(x - mx);
            for (int64_t i = 0; i < v; ++i) {
              double o = 0;
              for (size_t j = 0; j < s.size(); ++j) o += std::exp(s[j] - mx) / den * vals[j][i];
              const float got = out[(r * Hl + hl) * v + i];
              ASSERT_TRUE(std::isfinite(got));
              max_err = std::max(max_err, std::fabs(got - o));
              max_ref = std::max(max_ref, std::fabs(o));
            }
          }
        }
      }
      // float32 accumulation over kv_lora = 64 and <= 52 keys: relative error ~1e-6.
      EXPECT_LE(max_err, 1e-4 * std::max(1.0, max_ref)) << "world " << world << " rank " << rank;
      EXPECT_GT(max_ref, 0.0);
    }
  }
}

}  // namespace
}  // namespace verifyd::tp
