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

// Appends rows [row0, row0 + nrows) of a row-major [*, cols] tensor.
void AppendRows(const HostTensor& t, int64_t row0, int64_t nrows, std::vector<float>* out) {
  const int64_t cols = t.shape[1];
  out->insert(out->end(), t.data.begin() + row0 * cols, t.data.begin() + (row0 + nrows) * cols);
}

// Appends columns [col0, col0 + ncols) of a row-major [rows, cols] tensor.
void AppendCols(const HostTensor& t, int64_t col0, int64_t ncols, std::vector<float>* out) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = t.data.data() + r * cols + col0;
    out->insert(out->end(), src, src + ncols);
  }
}

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

absl::StatusOr<MoeLayerWeights> ShardMoeLayer(const ModelWeights& w, int64_t layer, int world,
                                              int rank) {
  const ModelConfig& c = w.config;
  const MoeConfig& mc = c.moe;
  auto T = [&](const std::string& suffix) -> absl::StatusOr<const HostTensor*> {
    const HostTensor* t = w.Find(LayerTensorName(layer, suffix));
    if (t == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("weights: tensor '", LayerTensorName(layer, suffix), "' is missing"));
    }
    return t;
  };
  MoeLayerWeights m;
  m.inter = IntermediateShard(mc.moe_intermediate_size, world, rank);
  m.shared_inter = IntermediateShard(mc.moe_intermediate_size * mc.n_shared_experts, world, rank);
  VERIFYD_ASSIGN_OR_RETURN(const HostTensor* router, T("mlp.gate.weight"));
  VERIFYD_ASSIGN_OR_RETURN(const HostTensor* bias, T("mlp.gate.e_score_correction_bias"));
  m.router = router->data;
  m.bias = bias->data;
  const int64_t E = mc.n_routed_experts, Il = m.inter.size;
  m.gate.reserve(E * Il * c.hidden_size);
  m.up.reserve(E * Il * c.hidden_size);
  m.down.reserve(E * Il * c.hidden_size);
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = absl::StrCat("mlp.experts.", e, ".");
    VERIFYD_ASSIGN_OR_RETURN(const HostTensor* g, T(p + "gate_proj.weight"));
    VERIFYD_ASSIGN_OR_RETURN(const HostTensor* u, T(p + "up_proj.weight"));
    VERIFYD_ASSIGN_OR_RETURN(const HostTensor* d, T(p + "down_proj.weight"));
    AppendRows(*g, m.inter.begin, Il, &m.gate);
    AppendRows(*u, m.inter.begin, Il, &m.up);
    AppendCols(*d, m.inter.begin, Il, &m.down);
  }
  if (mc.n_shared_experts > 0) {
    VERIFYD_ASSIGN_OR_RETURN(const HostTensor* g, T("mlp.shared_experts.gate_proj.weight"));
    VERIFYD_ASSIGN_OR_RETURN(const HostTensor* u, T("mlp.shared_experts.up_proj.weight"));
    VERIFYD_ASSIGN_OR_RETURN(const HostTensor* d, T("mlp.shared_experts.down_proj.weight"));
    AppendRows(*g, m.shared_inter.begin, m.shared_inter.size, &m.shared_gate);
    AppendRows(*u, m.shared_inter.begin, m.shared_inter.size, &m.shared_up);
    AppendCols(*d, m.shared_inter.begin, m.shared_inter.size, &m.shared_down);
  }
  return m;
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
