// The MoE MLP on one rank (see moe_layer.h).
#include "tp/cuda/moe_layer.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/elementwise.h"
#include "kernels/cuda/dense/gemm.h"
#include "kernels/cuda/dense/grouped_gemm.h"
#include "kernels/cuda/dense/moe.h"
#include "kernels/cuda/dense/rms_norm.h"
#include "kernels/status.h"

namespace verifyd::tp {
namespace {

namespace kc = kernels::cuda;
using bf16 = kernels::bf16_bits;

// y[m, n] = x[m, k] . w[n, k]^T (bf16 in, fp32 out).
absl::Status Gemm(CudaRankContext& rk, int64_t m, const bf16* x, int64_t k, const bf16* w,
                  int64_t n, float* y) {
  kc::GemmParams p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.x = x;
  p.ldx = k;
  p.w = w;
  p.ldw = k;
  p.y = y;
  p.ldy = n;
  p.y_dtype = kernels::DType::kFloat32;
  return kc::GemmBf16(rk.cublas, p);
}

// out[m, hid] = down(SwiGLU(gate_up(x))) for an expert slice of inter columns: gu and act are
// scratch of m rows.
absl::Status ExpertMlp(CudaRankContext& rk, int64_t m, int64_t hid, int64_t inter, const bf16* x,
                       const bf16* gate_up, const bf16* down, float* gu, bf16* act, float* out) {
  if (m == 0) return absl::OkStatus();
  VERIFYD_RETURN_IF_ERROR(Gemm(rk, m, x, hid, gate_up, 2 * inter, gu));
  kc::SwiGluParams p;
  p.rows = static_cast<int>(m);
  p.n = inter;
  p.gate_up = gu;
  p.ld_in = 2 * inter;
  p.up_offset = inter;
  p.out = act;
  p.ld_out = inter;
  p.stream = rk.stream;
  VERIFYD_RETURN_IF_ERROR(kc::SwiGluCuda(p));
  return Gemm(rk, m, act, inter, down, hid, out);
}

// The routed experts over the permuted pairs (expert modes kFp8Grouped / kBf16Grouped): the
// rows gathered (and quantized), one grouped GEMM for every expert's [gate | up], SwiGLU (and
// quantization), one grouped GEMM for the down projections into moe_y. The per-expert row
// counts stay on the device: no host sync, a fixed launch sequence.
absl::Status GroupedExpertMlp(const MlaStep& s, int64_t layer, CudaRankContext& rk) {
  const ModelConfig& c = *s.config;
  const int64_t P = s.rows * c.moe.num_experts_per_tok, hid = c.hidden_size;
  const int64_t Il = rk.moe_inter.size;
  const CudaLayerWeights& L = rk.layers[layer];
  const bool fp8 = rk.expert_mode == ExpertMode::kFp8Grouped;
  if (fp8) {
    kc::MoeGatherQuantFp8Params g;
    g.n = P;
    g.cols = hid;
    g.x = rk.xn;
    g.ldx = hid;
    g.perm_rows = rk.moe_rows;
    g.out = rk.moe_xq;
    g.out_scale = rk.moe_xq_scale;
    g.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::MoeGatherQuantFp8Cuda(g));
  } else {
    kc::MoeGatherParams g;
    g.n = P;
    g.cols = hid;
    g.x = rk.xn;
    g.ldx = hid;
    g.perm_rows = rk.moe_rows;
    g.out = rk.moe_x;
    g.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::MoeGatherCuda(g));
  }
  MarkProfile(rk, ProfileCategory::kGemm);
  kc::GroupedGemmArgs gu;
  gu.offsets = rk.moe_offsets;
  gu.a = fp8 ? static_cast<const void*>(rk.moe_xq) : rk.moe_x;
  gu.a_scale = rk.moe_xq_scale;
  gu.b = fp8 ? static_cast<const void*>(L.experts_gate_up_fp8) : L.experts_gate_up;
  gu.b_scale = L.experts_gate_up_scale;
  gu.d = rk.moe_gu;
  gu.stream = rk.stream;
  VERIFYD_RETURN_IF_ERROR(rk.moe_gemm_gate_up->Run(gu));
  MarkProfile(rk, ProfileCategory::kOther);
  if (fp8) {
    kc::SwiGluQuantFp8Params a;
    a.rows = P;
    a.cols = Il;
    a.gate_up = rk.moe_gu;
    a.ld_in = 2 * Il;
    a.up_offset = Il;
    a.out = rk.moe_actq;
    a.out_scale = rk.moe_actq_scale;
    a.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::SwiGluQuantFp8Cuda(a));
  } else {
    kc::SwiGluParams a;
    a.rows = static_cast<int>(P);
    a.n = Il;
    a.gate_up = rk.moe_gu;
    a.ld_in = 2 * Il;
    a.up_offset = Il;
    a.out = rk.moe_act;
    a.ld_out = Il;
    a.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::SwiGluCuda(a));
  }
  MarkProfile(rk, ProfileCategory::kGemm);
  kc::GroupedGemmArgs dn;
  dn.offsets = rk.moe_offsets;
  dn.a = fp8 ? static_cast<const void*>(rk.moe_actq) : rk.moe_act;
  dn.a_scale = rk.moe_actq_scale;
  dn.b = fp8 ? static_cast<const void*>(L.experts_down_fp8) : L.experts_down;
  dn.b_scale = L.experts_down_scale;
  dn.d = rk.moe_y;
  dn.stream = rk.stream;
  return rk.moe_gemm_down->Run(dn);
}

// The routed experts with one cuBLAS GEMM pair per non-empty expert (expert mode
// kBf16PerExpert): the host reads the per-expert row counts (one sync per MoE layer).
absl::Status PerExpertMlp(const MlaStep& s, int64_t layer, CudaRankContext& rk) {
  const ModelConfig& c = *s.config;
  const int64_t R = s.rows, K = c.moe.num_experts_per_tok, E = c.moe.n_routed_experts;
  const int64_t hid = c.hidden_size, Il = rk.moe_inter.size;
  const CudaLayerWeights& L = rk.layers[layer];
  kc::MoeGatherParams g;
  g.n = R * K;
  g.cols = hid;
  g.x = rk.xn;
  g.ldx = hid;
  g.perm_rows = rk.moe_rows;
  g.out = rk.moe_x;
  g.stream = rk.stream;
  VERIFYD_RETURN_IF_ERROR(kc::MoeGatherCuda(g));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rk.moe_offsets_host, rk.moe_offsets,
                                               (E + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                               rk.stream));
  VERIFYD_RETURN_IF_ERROR(WaitRankStream(rk, s.sync_timeout_ms));
  const int32_t* off = rk.moe_offsets_host;
  if (off[0] != 0 || off[E] != R * K) {
    return absl::InternalError(absl::StrCat("moe layer ", layer, ": permutation covers ",
                                            off[E] - off[0], " of ", R * K, " pairs"));
  }
  // Routed experts in ascending index, each over its contiguous rows.
  MarkProfile(rk, ProfileCategory::kGemm);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t o = off[e], m = off[e + 1] - off[e];
    if (m < 0 || o + m > R * K) {
      return absl::InternalError(absl::StrCat("moe layer ", layer, ": bad offsets"));
    }
    VERIFYD_RETURN_IF_ERROR(ExpertMlp(rk, m, hid, Il, rk.moe_x + o * hid,
                                      L.experts_gate_up + e * 2 * Il * hid,
                                      L.experts_down + e * hid * Il, rk.moe_gu + o * 2 * Il,
                                      rk.moe_act + o * Il, rk.moe_y + o * hid));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunMoeMlp(const MlaStep& s, int64_t layer, CudaRankContext& rk) {
  const ModelConfig& c = *s.config;
  const MoeConfig& mc = c.moe;
  const int64_t R = s.rows, hid = c.hidden_size;
  const int64_t E = mc.n_routed_experts, K = mc.num_experts_per_tok;
  const int64_t Il = rk.moe_inter.size, Sl = rk.moe_shared_inter.size;
  const CudaLayerWeights& L = rk.layers[layer];
  if (L.router == nullptr || rk.moe_xf == nullptr) {
    return absl::InternalError(absl::StrCat("layer ", layer, " has no MoE weights or buffers"));
  }
  if (R == 0) return absl::OkStatus();

  // Router: fp32 RMSNorm output . fp32 router weight -> fp32 logits; routing; permutation.
  MarkProfile(rk, ProfileCategory::kOther);
  {
    kc::RmsNormParams p;
    p.rows = R;
    p.cols = hid;
    p.x = rk.x;
    p.x_dtype = kernels::DType::kFloat32;
    p.ldx = hid;
    p.weight = L.post_norm;
    p.eps = static_cast<float>(c.rms_norm_eps);
    p.y = rk.moe_xf;
    p.y_dtype = kernels::DType::kFloat32;
    p.ldy = hid;
    p.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::RmsNormCuda(p));
  }
  MarkProfile(rk, ProfileCategory::kGemm);
  {
    if (R <= kc::kMoeRouterKernelMaxRows) {
      kc::MoeRouterLogitsParams p;
      p.rows = static_cast<int>(R);
      p.num_experts = static_cast<int>(E);
      p.hidden = hid;
      p.x = rk.moe_xf;
      p.ldx = hid;
      p.w = L.router;
      p.ldw = hid;
      p.y = rk.moe_logits;
      p.ldy = E;
      p.stream = rk.stream;
      VERIFYD_RETURN_IF_ERROR(kc::MoeRouterLogitsCuda(p));
    } else {
      kc::GemmF32Params p;
      p.m = R;
      p.n = E;
      p.k = hid;
      p.x = rk.moe_xf;
      p.ldx = hid;
      p.w = L.router;
      p.ldw = hid;
      p.y = rk.moe_logits;
      p.ldy = E;
      VERIFYD_RETURN_IF_ERROR(kc::GemmF32(rk.cublas, p));
    }
  }
  MarkProfile(rk, ProfileCategory::kOther);
  {
    kc::MoeRouteParams p;
    p.rows = static_cast<int>(R);
    p.num_experts = static_cast<int>(E);
    p.top_k = static_cast<int>(K);
    p.n_group = static_cast<int>(mc.n_group);
    p.topk_group = static_cast<int>(mc.topk_group);
    p.norm_topk_prob = mc.norm_topk_prob;
    p.routed_scaling_factor = static_cast<float>(mc.routed_scaling_factor);
    p.logits = rk.moe_logits;
    p.bias = L.router_bias;
    p.experts = rk.moe_experts;
    p.weights = rk.moe_weights;
    p.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::MoeRouteCuda(p));
  }
  const bool routed = Il > 0;
  if (routed) {
    kc::MoePermuteParams p;
    p.rows = static_cast<int>(R);
    p.num_experts = static_cast<int>(E);
    p.top_k = static_cast<int>(K);
    p.experts = rk.moe_experts;
    p.offsets = rk.moe_offsets;
    p.perm_rows = rk.moe_rows;
    p.pair_pos = rk.moe_pos;
    p.workspace = rk.moe_permute_ws;
    p.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::MoePermuteCuda(p));
    if (rk.expert_mode == ExpertMode::kBf16PerExpert) {
      VERIFYD_RETURN_IF_ERROR(PerExpertMlp(s, layer, rk));
    } else {
      VERIFYD_RETURN_IF_ERROR(GroupedExpertMlp(s, layer, rk));
    }
  }
  // Shared experts over every row (after the routed experts: they reuse moe_gu / moe_act).
  const bool shared = Sl > 0 && L.shared_gate_up != nullptr;
  if (shared) {
    MarkProfile(rk, ProfileCategory::kGemm);
    VERIFYD_RETURN_IF_ERROR(ExpertMlp(rk, R, hid, Sl, rk.xn, L.shared_gate_up, L.shared_down,
                                      rk.moe_gu, rk.moe_act, rk.moe_shared));
  }
  // Combine in a fixed order: ascending expert index, then + shared.
  MarkProfile(rk, ProfileCategory::kOther);
  const bool tp1 = s.tp == 1;
  kc::MoeCombineParams p;
  p.rows = static_cast<int>(R);
  p.top_k = static_cast<int>(K);
  p.cols = hid;
  p.experts = rk.moe_experts;
  p.weights = rk.moe_weights;
  p.pair_pos = rk.moe_pos;
  p.y = routed ? rk.moe_y : nullptr;
  p.shared = shared ? rk.moe_shared : nullptr;
  p.out = tp1 ? rk.x : rk.part;
  p.ld_out = hid;
  p.accumulate = tp1;
  p.stream = rk.stream;
  return kc::MoeCombineCuda(p);
}

}  // namespace verifyd::tp
