// The MoE MLP on one rank (see moe_layer.h).
#include "tp/cuda/moe_layer.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/moe/moe_mlp.h"
#include "kernels/status.h"
#include "tp/cuda/mla_layer.h"

namespace verifyd::tp {
namespace {

namespace kc = kernels::cuda;

// The profile category of each phase of kc::RunMoeMlp.
ProfileCategory CategoryOf(kc::MoePhase phase) {
  switch (phase) {
    case kc::MoePhase::kRoute:
      return ProfileCategory::kRouter;
    case kc::MoePhase::kPermute:
    case kc::MoePhase::kCombine:
      return ProfileCategory::kDispatch;
    case kc::MoePhase::kGateUp:
    case kc::MoePhase::kSwiGlu:
    case kc::MoePhase::kDown:
      return ProfileCategory::kExperts;
    case kc::MoePhase::kShared:
      return ProfileCategory::kGemm;
    default:
      return ProfileCategory::kOther;
  }
}

}  // namespace

absl::Status RunMoeMlp(const MlaStep& s, int64_t layer, CudaRankContext& rk) {
  const ModelConfig& c = *s.config;
  const MoeConfig& mc = c.moe;
  const int64_t R = s.rows, hid = c.hidden_size;
  const CudaLayerWeights& L = rk.layers[layer];
  if (L.router == nullptr || rk.moe_xf == nullptr) {
    return absl::InternalError(absl::StrCat("layer ", layer, " has no MoE weights or buffers"));
  }
  if (R == 0) return absl::OkStatus();

  // The router's input: post_attention_layernorm in fp32 (the experts read rk.xn, the same
  // norm in bf16, which the caller computed).
  MarkProfile(rk, ProfileCategory::kOther);
  VERIFYD_RETURN_IF_ERROR(StepRmsNorm(s, rk, rk.x, kernels::DType::kFloat32, hid, hid, L.post_norm,
                                      rk.moe_xf, kernels::DType::kFloat32, hid));

  kc::MoeMlpArgs a;
  a.shape.rows = R;
  a.shape.hidden = hid;
  a.shape.num_experts = static_cast<int>(mc.n_routed_experts);
  a.shape.top_k = static_cast<int>(mc.num_experts_per_tok);
  a.shape.n_group = static_cast<int>(mc.n_group);
  a.shape.topk_group = static_cast<int>(mc.topk_group);
  a.shape.norm_topk_prob = mc.norm_topk_prob;
  a.shape.routed_scaling_factor = static_cast<float>(mc.routed_scaling_factor);
  a.shape.inter = rk.moe_inter.size;
  a.shape.shared_inter =
      L.shared_gate_up != nullptr || L.shared_gate_up_fp8 != nullptr ? rk.moe_shared_inter.size : 0;
  a.shape.expert_begin = static_cast<int>(rk.expert_begin);
  a.shape.local_experts = static_cast<int>(rk.local_experts);
  a.path = rk.expert_path;
  a.weights.router = L.router;
  a.weights.router_bias = L.router_bias;
  a.weights.gate_up = L.experts_gate_up;
  a.weights.down = L.experts_down;
  a.weights.gate_up_fp8 = L.experts_gate_up_fp8;
  a.weights.gate_up_scale = L.experts_gate_up_scale;
  a.weights.down_fp8 = L.experts_down_fp8;
  a.weights.down_scale = L.experts_down_scale;
  a.weights.shared_gate_up = L.shared_gate_up;
  a.weights.shared_down = L.shared_down;
  a.weights.shared_gate_up_fp8 = L.shared_gate_up_fp8;
  a.weights.shared_gate_up_scale = L.shared_gate_up_scale;
  a.weights.shared_down_fp8 = L.shared_down_fp8;
  a.weights.shared_down_scale = L.shared_down_scale;
  a.buffers.shared_gemm_gate_up = rk.shared_gemm_gate_up.get();
  a.buffers.shared_gemm_down = rk.shared_gemm_down.get();
  a.buffers.shared_offsets = rk.fp8_offsets;
  a.buffers.shared_lt = rk.fp8_lt.get();
  a.buffers.shared_xq = rk.fp8_xq;
  a.buffers.shared_xq_scale = rk.fp8_xq_scale;
  a.buffers.shared_actq = rk.fp8_actq;
  a.buffers.shared_actq_scale = rk.fp8_actq_scale;
  kc::MoeMlpBuffers& b = a.buffers;
  b.logits = rk.moe_logits;
  b.experts = rk.moe_experts;
  b.weights = rk.moe_weights;
  b.offsets = rk.moe_offsets;
  b.perm_rows = rk.moe_rows;
  b.pair_pos = rk.moe_pos;
  b.permute_ws = rk.moe_permute_ws;
  b.x = rk.moe_x;
  b.xq = rk.moe_xq;
  b.xq_scale = rk.moe_xq_scale;
  b.gate_up = rk.moe_gu;
  b.act = rk.moe_act;
  b.actq = rk.moe_actq;
  b.actq_scale = rk.moe_actq_scale;
  b.y = rk.moe_y;
  b.shared = rk.moe_shared;
  b.offsets_host = rk.moe_offsets_host;
  b.gemm_gate_up = rk.moe_gemm_gate_up.get();
  b.gemm_down = rk.moe_gemm_down.get();
  a.x_router = rk.moe_xf;
  a.xn = rk.xn;
  // TP 1: added to the residual stream; TP > 1: this rank's share into part (the caller
  // all-reduces it into x).
  const bool tp1 = s.tp == 1;
  a.out = tp1 ? rk.x : rk.part;
  a.ld_out = hid;
  a.accumulate = tp1;
  a.cublas = rk.cublas;
  a.batch_invariant = rk.batch_invariant;
  a.stream = rk.stream;
  a.host_sync = [&rk, &s] { return WaitRankStream(rk, s.sync_timeout_ms); };
  absl::Status count_status;
  a.mark = [&](kc::MoePhase phase) {
    // Profiled steps count the local experts the routing reached (the permutation is done by
    // the shared experts' phase).
    if (phase == kc::MoePhase::kShared && rk.profiling && rk.moe_touched != nullptr &&
        a.shape.inter > 0) {
      kc::MoeCountTouchedParams t;
      t.offsets = rk.moe_offsets;
      t.begin = static_cast<int>(rk.expert_begin);
      t.n = static_cast<int>(rk.local_experts);
      t.count = rk.moe_touched + layer;
      t.stream = rk.stream;
      count_status.Update(kc::MoeCountTouchedCuda(t));
    }
    if (phase != kc::MoePhase::kDone) MarkProfile(rk, CategoryOf(phase));
  };
  VERIFYD_RETURN_IF_ERROR(kc::RunMoeMlp(a));
  return count_status;
}

}  // namespace verifyd::tp
