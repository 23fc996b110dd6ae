// The CPU backend's MoE MLP; see cpu_moe.h.
#include "tp/cpu/cpu_moe.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/reference/moe.h"
#include "kernels/reference/ops.h"
#include "kernels/status.h"

namespace verifyd::tp {
namespace {

namespace ref = kernels::ref;

// part[rows] = down(silu(gate(x)) * up(x)) over `inter` intermediate rows.
void SwiGluMlp(const float* x, int64_t rows, int64_t hid, const float* gate, const float* up,
               const float* down, int64_t inter, float* out) {
  std::vector<float> g(rows * inter), u(rows * inter), act(rows * inter);
  ref::Linear(x, rows, hid, hid, gate, inter, g.data(), inter);
  ref::Linear(x, rows, hid, hid, up, inter, u.data(), inter);
  ref::SwiGlu(g.data(), u.data(), rows, inter, inter, act.data());
  ref::Linear(act.data(), rows, inter, inter, down, hid, out, hid);
}

ref::MoeRouting RoutingOf(const MoeConfig& mc) {
  ref::MoeRouting p;
  p.num_experts = mc.n_routed_experts;
  p.top_k = mc.num_experts_per_tok;
  p.n_group = mc.n_group;
  p.topk_group = mc.topk_group;
  p.norm_topk_prob = mc.norm_topk_prob;
  p.routed_scaling_factor = static_cast<float>(mc.routed_scaling_factor);
  return p;
}

}  // namespace

absl::StatusOr<MoeLayerWeights> ShardMoeLayer(const WeightSource& src, int64_t layer, int world,
                                              int rank) {
  const ModelConfig& c = src.config();
  const MoeConfig& mc = c.moe;
  const int64_t hid = c.hidden_size, E = mc.n_routed_experts, mi = mc.moe_intermediate_size;
  auto n = [&](const std::string& suffix) { return LayerTensorName(layer, suffix); };
  MoeLayerWeights m;
  m.inter = IntermediateShard(mi, world, rank);
  m.shared_inter = IntermediateShard(mi * mc.n_shared_experts, world, rank);
  VERIFYD_RETURN_IF_ERROR(AppendFiniteBlock(src, n("mlp.gate.weight"), 0, E, 0, hid, &m.router));
  VERIFYD_RETURN_IF_ERROR(
      AppendFiniteBlock(src, n("mlp.gate.e_score_correction_bias"), 0, 1, 0, E, &m.bias));
  const int64_t Il = m.inter.size, i0 = m.inter.begin;
  m.gate.reserve(E * Il * hid);
  m.up.reserve(E * Il * hid);
  m.down.reserve(E * Il * hid);
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = absl::StrCat("mlp.experts.", e, ".");
    VERIFYD_RETURN_IF_ERROR(
        AppendFiniteBlock(src, n(p + "gate_proj.weight"), i0, Il, 0, hid, &m.gate));
    VERIFYD_RETURN_IF_ERROR(AppendFiniteBlock(src, n(p + "up_proj.weight"), i0, Il, 0, hid, &m.up));
    VERIFYD_RETURN_IF_ERROR(
        AppendFiniteBlock(src, n(p + "down_proj.weight"), 0, hid, i0, Il, &m.down));
  }
  if (mc.n_shared_experts > 0) {
    const int64_t s0 = m.shared_inter.begin, Sl = m.shared_inter.size;
    VERIFYD_RETURN_IF_ERROR(AppendFiniteBlock(src, n("mlp.shared_experts.gate_proj.weight"), s0, Sl,
                                              0, hid, &m.shared_gate));
    VERIFYD_RETURN_IF_ERROR(AppendFiniteBlock(src, n("mlp.shared_experts.up_proj.weight"), s0, Sl,
                                              0, hid, &m.shared_up));
    VERIFYD_RETURN_IF_ERROR(AppendFiniteBlock(src, n("mlp.shared_experts.down_proj.weight"), 0, hid,
                                              s0, Sl, &m.shared_down));
  }
  return m;
}

absl::StatusOr<MoeLayerWeights> ShardMoeLayer(const ModelWeights& w, int64_t layer, int world,
                                              int rank) {
  const InMemoryWeightSource src(&w);
  return ShardMoeLayer(src, layer, world, rank);
}

void MoeForwardLocal(const ModelConfig& c, const MoeLayerWeights& m, const float* h, int64_t rows,
                     float* part) {
  const MoeConfig& mc = c.moe;
  const int64_t hid = c.hidden_size, E = mc.n_routed_experts, K = mc.num_experts_per_tok;
  const int64_t Il = m.inter.size, Sl = m.shared_inter.size;
  std::fill(part, part + rows * hid, 0.0f);
  if (rows <= 0) return;
  // Routing, replicated: router logits in float32, then the noaux_tc top-k.
  std::vector<float> logits(rows * E), weights(rows * K);
  std::vector<int32_t> experts(rows * K);
  ref::Linear(h, rows, hid, hid, m.router.data(), E, logits.data(), E);
  ref::MoeRoute(logits.data(), rows, m.bias.data(), RoutingOf(mc), experts.data(), weights.data());
  // Routed experts in ascending index: gather the rows that chose e, run e's slice, add
  // w * out into each row (so every row accumulates its experts in ascending index).
  if (Il > 0) {
    std::vector<std::vector<std::pair<int64_t, float>>> by_expert(E);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < K; ++k)
        by_expert[experts[r * K + k]].push_back({r, weights[r * K + k]});
    }
    std::vector<float> x, y;
    for (int64_t e = 0; e < E; ++e) {
      const auto& sel = by_expert[e];
      if (sel.empty()) continue;
      const int64_t n = static_cast<int64_t>(sel.size());
      x.resize(n * hid);
      y.resize(n * hid);
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(x.data() + i * hid, h + sel[i].first * hid, hid * sizeof(float));
      }
      SwiGluMlp(x.data(), n, hid, m.gate.data() + e * Il * hid, m.up.data() + e * Il * hid,
                m.down.data() + e * hid * Il, Il, y.data());
      for (int64_t i = 0; i < n; ++i) {
        ref::AddScaled(part + sel[i].first * hid, y.data() + i * hid, sel[i].second, hid);
      }
    }
  }
  // Shared experts, added after the routed sum (transformers: routed + shared).
  if (Sl > 0) {
    std::vector<float> s(rows * hid);
    SwiGluMlp(h, rows, hid, m.shared_gate.data(), m.shared_up.data(), m.shared_down.data(), Sl,
              s.data());
    ref::AddInPlace(part, s.data(), rows * hid);
  }
}

}  // namespace verifyd::tp
