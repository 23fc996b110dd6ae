// One MoE MLP's launch sequence (see moe_mlp.h).
#include "kernels/cuda/moe/moe_mlp.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/elementwise.h"
#include "kernels/cuda/dense/gemm.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/status.h"

namespace verifyd::kernels::cuda {

const char* ExpertPathName(ExpertPath p) {
  switch (p) {
    case ExpertPath::kFp8Grouped:
      return "fp8 block-scaled grouped GEMMs";
    case ExpertPath::kBf16Grouped:
      return "bf16 grouped GEMMs";
    case ExpertPath::kBf16PerExpert:
      return "bf16 per-expert cuBLAS GEMMs";
  }
  return "?";
}

namespace {

// out[m, hid] = down(SwiGLU(gate_up(x))) over m rows with bf16 cuBLAS GEMMs (gu, act: scratch).
absl::Status DenseMlp(void* cublas, void* stream, int64_t m, int64_t hid, int64_t inter,
                      const bf16_bits* x, const bf16_bits* gate_up, const bf16_bits* down,
                      float* gu, bf16_bits* act, float* out) {
  if (m == 0) return absl::OkStatus();
  VERIFYD_RETURN_IF_ERROR(GemmBf16Packed(cublas, m, x, hid, gate_up, 2 * inter, gu));
  VERIFYD_RETURN_IF_ERROR(SwiGluPackedCuda(m, inter, gu, act, stream));
  return GemmBf16Packed(cublas, m, act, inter, down, hid, out);
}

int LocalExperts(const MoeMlpShape& s) {
  return s.local_experts < 0 ? s.num_experts : s.local_experts;
}

// The local experts' pairs [*begin, *end) of the permutation (device pointers into the
// offsets), or nulls when this GPU holds every expert.
struct LocalPairs {
  const int32_t* begin = nullptr;
  const int32_t* end = nullptr;
};
LocalPairs LocalPairRows(const MoeMlpArgs& a) {
  const MoeMlpShape& s = a.shape;
  if (LocalExperts(s) >= s.num_experts) return {};
  const int32_t* first = a.buffers.offsets + s.expert_begin;
  return {first, first + LocalExperts(s)};
}

// The fields both gathers (MoeGatherParams, MoeGatherQuantFp8Params) share: xn's rows through
// the permutation, for the local experts' pairs only.
template <class Gather>
Gather ExpertGatherOf(const MoeMlpArgs& a) {
  const LocalPairs rows = LocalPairRows(a);
  Gather g;
  g.n = a.shape.rows * a.shape.top_k;
  g.cols = a.shape.hidden;
  g.x = a.xn;
  g.ldx = a.shape.hidden;
  g.perm_rows = a.buffers.perm_rows;
  g.row_begin = rows.begin;
  g.row_end = rows.end;
  g.stream = a.stream;
  return g;
}

// The experts' inputs: bf16 into x or (fp8) quantized into xq / xq_scale.
absl::Status GatherExpertInputs(const MoeMlpArgs& a, bool fp8) {
  if (fp8) {
    auto g = ExpertGatherOf<MoeGatherQuantFp8Params>(a);
    g.out = a.buffers.xq;
    g.out_scale = a.buffers.xq_scale;
    return MoeGatherQuantFp8Cuda(g);
  }
  auto g = ExpertGatherOf<MoeGatherParams>(a);
  g.out = a.buffers.x;
  return MoeGatherCuda(g);
}

// The operands both router-logit paths (MoeRouterLogitsParams, GemmF32Params) share:
// logits[rows, experts] = x_router . router^T, fp32.
template <class Gemm>
Gemm RouterOperandsOf(const MoeMlpArgs& a) {
  Gemm p;
  p.x = a.x_router;
  p.ldx = a.shape.hidden;
  p.w = a.weights.router;
  p.ldw = a.shape.hidden;
  p.y = a.buffers.logits;
  p.ldy = a.shape.num_experts;
  return p;
}

// d = a . b^T per group of `gemm` (grouped_gemm.h): the groups' rows from the device offsets.
absl::Status RunGrouped(GroupedGemm* gemm, const int32_t* offsets, const void* a,
                        const float* a_scale, const void* b, const float* b_scale, float* d,
                        void* stream) {
  GroupedGemmArgs g;
  g.offsets = offsets;
  g.a = a;
  g.a_scale = a_scale;
  g.b = b;
  g.b_scale = b_scale;
  g.d = d;
  g.stream = stream;
  return gemm->Run(g);
}

// gate_up / SwiGLU / down over the local experts' permuted pairs with one grouped GEMM per
// projection; the inputs gathered (and quantized) first.
absl::Status GroupedExperts(const MoeMlpArgs& a, const std::function<void(MoePhase)>& mark) {
  const MoeMlpShape& s = a.shape;
  const MoeMlpBuffers& b = a.buffers;
  const MoeMlpWeights& w = a.weights;
  const int64_t P = s.rows * s.top_k;
  const bool fp8 = a.path == ExpertPath::kFp8Grouped;
  // The local experts' offsets (absolute pair indices) and their rows.
  const int32_t* offsets = b.offsets + s.expert_begin;
  const LocalPairs rows = LocalPairRows(a);
  if (b.gemm_gate_up == nullptr || b.gemm_down == nullptr) {
    return absl::InvalidArgumentError("moe mlp: the grouped paths need both grouped GEMMs");
  }
  VERIFYD_RETURN_IF_ERROR(GatherExpertInputs(a, fp8));
  mark(MoePhase::kGateUp);
  VERIFYD_RETURN_IF_ERROR(RunGrouped(b.gemm_gate_up, offsets,
                                     fp8 ? static_cast<const void*>(b.xq) : b.x, b.xq_scale,
                                     fp8 ? static_cast<const void*>(w.gate_up_fp8) : w.gate_up,
                                     w.gate_up_scale, b.gate_up, a.stream));
  mark(MoePhase::kSwiGlu);
  if (fp8) {
    SwiGluQuantFp8Params q;
    SetPackedSwiGlu(q, P, s.inter, b.gate_up, b.actq, a.stream, rows.begin, rows.end);
    q.cols = s.inter;
    q.out_scale = b.actq_scale;
    VERIFYD_RETURN_IF_ERROR(SwiGluQuantFp8Cuda(q));
  } else {
    VERIFYD_RETURN_IF_ERROR(
        SwiGluPackedCuda(P, s.inter, b.gate_up, b.act, a.stream, rows.begin, rows.end));
  }
  mark(MoePhase::kDown);
  return RunGrouped(b.gemm_down, offsets, fp8 ? static_cast<const void*>(b.actq) : b.act,
                    b.actq_scale, fp8 ? static_cast<const void*>(w.down_fp8) : w.down, w.down_scale,
                    b.y, a.stream);
}

// The rows gathered, the per-expert row counts read on the host (one sync), then one cuBLAS
// GEMM triple per non-empty expert over its contiguous rows.
absl::Status PerExpert(const MoeMlpArgs& a, const std::function<void(MoePhase)>& mark) {
  const MoeMlpShape& s = a.shape;
  const MoeMlpBuffers& b = a.buffers;
  const MoeMlpWeights& w = a.weights;
  const int64_t P = s.rows * s.top_k, E = s.num_experts, H = s.hidden, I = s.inter;
  const int64_t e0 = s.expert_begin, El = LocalExperts(s);
  if (!a.host_sync || b.offsets_host == nullptr) {
    return absl::InvalidArgumentError(
        "moe mlp: the per-expert path needs host_sync and "
        "offsets_host");
  }
  VERIFYD_RETURN_IF_ERROR(GatherExpertInputs(a, /*fp8=*/false));
  mark(MoePhase::kGateUp);
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.offsets_host, b.offsets, (E + 1) * sizeof(int32_t),
                                               cudaMemcpyDeviceToHost,
                                               static_cast<cudaStream_t>(a.stream)));
  VERIFYD_RETURN_IF_ERROR(a.host_sync());
  const int32_t* off = b.offsets_host;
  if (off[0] != 0 || off[E] != P) {
    return absl::InternalError(
        absl::StrCat("moe mlp: the permutation covers ", off[E] - off[0], " of ", P, " pairs"));
  }
  for (int64_t e = e0; e < e0 + El; ++e) {  // the local experts; weights indexed from e0
    const int64_t o = off[e], m = off[e + 1] - off[e];
    if (m < 0 || o + m > P) return absl::InternalError("moe mlp: bad expert offsets");
    VERIFYD_RETURN_IF_ERROR(DenseMlp(a.cublas, a.stream, m, H, I, b.x + o * H,
                                     w.gate_up + (e - e0) * 2 * I * H, w.down + (e - e0) * H * I,
                                     b.gate_up + o * 2 * I, b.act + o * I, b.y + o * H));
  }
  // The loop holds gate_up, SwiGLU and down: the later phases are empty.
  mark(MoePhase::kSwiGlu);
  mark(MoePhase::kDown);
  return absl::OkStatus();
}

// d[rows, n] = a . b^T of a one-group FP8 GEMM (gemm's shape): cuBLASLt when lt is set, else
// the grouped kernel.
absl::Status OneGroupFp8(Fp8BlockGemmLt* lt, GroupedGemm* gemm, int64_t rows,
                         const int32_t* offsets, const uint8_t* a, const float* a_scale,
                         const uint8_t* b, const float* b_scale, float* d, void* stream) {
  if (lt != nullptr) {
    Fp8BlockGemmArgs g;
    g.m = rows;
    g.n = gemm->shape().n;
    g.k = gemm->shape().k;
    g.x = a;
    g.x_scale = a_scale;
    g.w = b;
    g.w_scale = b_scale;
    g.y = d;
    g.stream = stream;
    return lt->Run(g);
  }
  return RunGrouped(gemm, offsets, a, a_scale, b, b_scale, d, stream);
}

}  // namespace

absl::Status RunMoeMlp(const MoeMlpArgs& a) {
  const MoeMlpShape& s = a.shape;
  const MoeMlpBuffers& b = a.buffers;
  const MoeMlpWeights& w = a.weights;
  const std::function<void(MoePhase)> mark = a.mark ? a.mark : [](MoePhase) {};
  if (s.rows < 0 || s.hidden <= 0 || s.num_experts <= 0 || s.top_k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("moe mlp: bad shape rows=", s.rows,
                                                   " hidden=", s.hidden, " experts=", s.num_experts,
                                                   " top_k=", s.top_k));
  }
  if (s.expert_begin < 0 || s.expert_begin + LocalExperts(s) > s.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("moe mlp: local experts [", s.expert_begin,
                                                   ", +", LocalExperts(s), ") outside ",
                                                   s.num_experts));
  }
  if (s.rows == 0) {
    mark(MoePhase::kDone);
    return absl::OkStatus();
  }
  mark(MoePhase::kRoute);
  if (s.rows <= kMoeRouterKernelMaxRows || a.batch_invariant) {
    auto p = RouterOperandsOf<MoeRouterLogitsParams>(a);
    p.rows = static_cast<int>(s.rows);
    p.num_experts = s.num_experts;
    p.hidden = s.hidden;
    p.stream = a.stream;
    VERIFYD_RETURN_IF_ERROR(MoeRouterLogitsCuda(p));
  } else {
    auto p = RouterOperandsOf<GemmF32Params>(a);
    p.m = s.rows;
    p.n = s.num_experts;
    p.k = s.hidden;
    VERIFYD_RETURN_IF_ERROR(GemmF32(a.cublas, p));
  }
  {
    MoeRouteParams p;
    p.rows = static_cast<int>(s.rows);
    p.num_experts = s.num_experts;
    p.top_k = s.top_k;
    p.n_group = s.n_group;
    p.topk_group = s.topk_group;
    p.norm_topk_prob = s.norm_topk_prob;
    p.routed_scaling_factor = s.routed_scaling_factor;
    p.logits = b.logits;
    p.bias = w.router_bias;
    p.experts = b.experts;
    p.weights = b.weights;
    p.stream = a.stream;
    VERIFYD_RETURN_IF_ERROR(MoeRouteCuda(p));
  }
  const bool routed = s.inter > 0;
  if (routed) {
    mark(MoePhase::kPermute);
    MoePermuteParams p;
    p.rows = static_cast<int>(s.rows);
    p.num_experts = s.num_experts;
    p.top_k = s.top_k;
    p.experts = b.experts;
    p.offsets = b.offsets;
    p.perm_rows = b.perm_rows;
    p.pair_pos = b.pair_pos;
    p.workspace = b.permute_ws;
    p.stream = a.stream;
    VERIFYD_RETURN_IF_ERROR(MoePermuteCuda(p));
    VERIFYD_RETURN_IF_ERROR(a.path == ExpertPath::kBf16PerExpert ? PerExpert(a, mark)
                                                                 : GroupedExperts(a, mark));
  }
  // Shared experts over every row (after the routed experts: they reuse gate_up / act).
  mark(MoePhase::kShared);
  const bool shared_fp8 = s.shared_inter > 0 && w.shared_gate_up_fp8 != nullptr;
  const bool shared = shared_fp8 || (s.shared_inter > 0 && w.shared_gate_up != nullptr);
  if (shared_fp8) {
    Fp8MlpArgs f;
    f.rows = s.rows;
    f.hidden = s.hidden;
    f.inter = s.shared_inter;
    f.x = a.xn;
    f.gate_up = w.shared_gate_up_fp8;
    f.gate_up_scale = w.shared_gate_up_scale;
    f.down = w.shared_down_fp8;
    f.down_scale = w.shared_down_scale;
    f.gemm_gate_up = b.shared_gemm_gate_up;
    f.gemm_down = b.shared_gemm_down;
    f.offsets = b.shared_offsets;
    f.lt = b.shared_lt;
    f.xq = b.shared_xq;
    f.xq_scale = b.shared_xq_scale;
    f.gu = b.gate_up;
    f.actq = b.shared_actq;
    f.actq_scale = b.shared_actq_scale;
    f.out = b.shared;
    f.stream = a.stream;
    VERIFYD_RETURN_IF_ERROR(RunFp8Mlp(f));
  } else if (shared) {
    VERIFYD_RETURN_IF_ERROR(DenseMlp(a.cublas, a.stream, s.rows, s.hidden, s.shared_inter, a.xn,
                                     w.shared_gate_up, w.shared_down, b.gate_up, b.act, b.shared));
  }
  mark(MoePhase::kCombine);
  MoeCombineParams p;
  p.rows = static_cast<int>(s.rows);
  p.top_k = s.top_k;
  p.cols = s.hidden;
  p.experts = b.experts;
  p.weights = b.weights;
  p.pair_pos = b.pair_pos;
  p.y = routed ? b.y : nullptr;
  p.shared = shared ? b.shared : nullptr;
  p.out = a.out;
  p.ld_out = a.ld_out;
  p.accumulate = a.accumulate;
  p.expert_begin = s.expert_begin;
  p.expert_end = s.expert_begin + LocalExperts(s);
  p.stream = a.stream;
  VERIFYD_RETURN_IF_ERROR(MoeCombineCuda(p));
  mark(MoePhase::kDone);
  return absl::OkStatus();
}

absl::Status RunFp8Linear(const Fp8LinearArgs& a) {
  if (a.gemm == nullptr || a.offsets == nullptr) {
    return absl::InvalidArgumentError("fp8 linear: gemm and offsets must be set");
  }
  const GroupedGemmShape& g = a.gemm->shape();
  if (g.kind != GroupedGemmKind::kFp8Block128 || g.groups != 1) {
    return absl::InvalidArgumentError("fp8 linear: the GEMM must be a one-group kFp8Block128");
  }
  const int64_t ldx = a.ldx == 0 ? g.k : a.ldx;
  if (a.rows < 0 || ldx < g.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp8 linear: rows >= 0 and ldx >= k needed (rows=", a.rows, " ldx=", ldx, " k=", g.k, ")"));
  }
  if (a.rows == 0) return absl::OkStatus();
  MoeGatherQuantFp8Params q;
  q.n = a.rows;
  q.cols = g.k;
  q.x = a.x;
  q.ldx = ldx;
  q.out = a.xq;
  q.out_scale = a.xq_scale;
  q.scale_ld_rows = a.lt != nullptr ? Fp8LtRows(a.rows) : 0;  // cuBLASLt's scale layout
  q.stream = a.stream;
  VERIFYD_RETURN_IF_ERROR(MoeGatherQuantFp8Cuda(q));
  return OneGroupFp8(a.lt, a.gemm, a.rows, a.offsets, a.xq, a.xq_scale, a.w, a.w_scale, a.out,
                     a.stream);
}

absl::Status RunFp8Mlp(const Fp8MlpArgs& a) {
  if (a.rows < 0 || a.hidden <= 0 || a.hidden % 128 != 0 || a.inter <= 0 || a.inter % 128 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp8 mlp: rows >= 0 and hidden, inter positive multiples of 128 needed (rows=", a.rows,
        " hidden=", a.hidden, " inter=", a.inter, ")"));
  }
  if (a.rows == 0) return absl::OkStatus();
  if (a.gemm_gate_up == nullptr || a.gemm_down == nullptr || a.offsets == nullptr) {
    return absl::InvalidArgumentError("fp8 mlp: gemm_gate_up, gemm_down and offsets must be set");
  }
  const GroupedGemmShape& g = a.gemm_gate_up->shape();
  const GroupedGemmShape& d = a.gemm_down->shape();
  if (g.kind != GroupedGemmKind::kFp8Block128 || g.groups != 1 || g.n != 2 * a.inter ||
      g.k != a.hidden || d.kind != GroupedGemmKind::kFp8Block128 || d.groups != 1 ||
      d.n != a.hidden || d.k != a.inter) {
    return absl::InvalidArgumentError(
        "fp8 mlp: the GEMMs must be one-group kFp8Block128 of (2 inter, hidden) and (hidden, "
        "inter)");
  }
  Fp8LinearArgs gu;
  gu.rows = a.rows;
  gu.x = a.x;
  gu.w = a.gate_up;
  gu.w_scale = a.gate_up_scale;
  gu.gemm = a.gemm_gate_up;
  gu.lt = a.lt;
  gu.offsets = a.offsets;
  gu.xq = a.xq;
  gu.xq_scale = a.xq_scale;
  gu.out = a.gu;
  gu.stream = a.stream;
  VERIFYD_RETURN_IF_ERROR(RunFp8Linear(gu));
  SwiGluQuantFp8Params q;
  SetPackedSwiGlu(q, a.rows, a.inter, a.gu, a.actq, a.stream);
  q.cols = a.inter;
  q.out_scale = a.actq_scale;
  q.scale_ld_rows = a.lt != nullptr ? Fp8LtRows(a.rows) : 0;
  VERIFYD_RETURN_IF_ERROR(SwiGluQuantFp8Cuda(q));
  return OneGroupFp8(a.lt, a.gemm_down, a.rows, a.offsets, a.actq, a.actq_scale, a.down,
                     a.down_scale, a.out, a.stream);
}

}  // namespace verifyd::kernels::cuda
