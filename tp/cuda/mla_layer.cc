// The decoder's kernels on one rank (see mla_layer.h).
#include "tp/cuda/mla_layer.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/elementwise.h"
#include "kernels/cuda/dense/fallback_attention.h"
#include "kernels/cuda/dense/gemm.h"
#include "kernels/cuda/dense/rms_norm.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/moe/moe_mlp.h"
#include "kernels/cuda/sampling/argmax.h"
#include "kernels/status.h"
#include "tp/cuda/moe_layer.h"

namespace verifyd::tp {
namespace {

namespace kc = kernels::cuda;
using bf16 = kernels::bf16_bits;
constexpr auto F32 = kernels::DType::kFloat32;
constexpr auto BF16 = kernels::DType::kBFloat16;

}  // namespace

absl::Status StepRmsNorm(const MlaStep& s, CudaRankContext& rk, const void* x, kernels::DType xt,
                         int64_t ldx, int64_t cols, const bf16* w, void* y, kernels::DType yt,
                         int64_t ldy) {
  kc::RmsNormParams p;
  p.rows = s.rows;
  p.cols = cols;
  p.x = x;
  p.x_dtype = xt;
  p.ldx = ldx;
  p.weight = w;
  p.eps = static_cast<float>(s.config->rms_norm_eps);
  p.y = y;
  p.y_dtype = yt;
  p.ldy = ldy;
  p.stream = rk.stream;
  return kc::RmsNormCuda(p);
}

namespace {

// y[R, n] = x[R, k] . w[n, k]^T + beta * y.
absl::Status Gemm(const MlaStep& s, CudaRankContext& rk, const bf16* x, int64_t k, const bf16* w,
                  int64_t n, void* y, kernels::DType yt, float beta) {
  return kc::GemmBf16Packed(rk.cublas, s.rows, x, k, w, n, y, yt, beta);
}

// out[R, n] (fp32) = x[R, k] . W^T with the FP8 weight W (moe_mlp.h RunFp8Linear, the
// rank's one-group GEMM of shape (n, k)); x read with row stride ldx (0: k).
absl::Status Fp8Linear(const MlaStep& s, CudaRankContext& rk, const bf16* x, int64_t ldx,
                       const uint8_t* w, const float* w_scale, kc::GroupedGemm* gemm, float* out) {
  kc::Fp8LinearArgs a;
  a.rows = s.rows;
  a.x = x;
  a.ldx = ldx;
  a.w = w;
  a.w_scale = w_scale;
  a.gemm = gemm;
  a.lt = rk.fp8_lt.get();
  a.offsets = rk.fp8_offsets;
  a.xq = rk.fp8_xq;
  a.xq_scale = rk.fp8_xq_scale;
  a.out = out;
  a.stream = rk.stream;
  return kc::RunFp8Linear(a);
}

// x += AllReduce(part) (TP > 1); at TP = 1 the GEMM accumulated into x already.
absl::Status ReduceIntoX(const MlaStep& s, CudaRankContext& rk) {
  if (s.tp == 1) return absl::OkStatus();
  const int64_t n = s.rows * s.config->hidden_size;
  MarkProfile(rk, ProfileCategory::kComm);
  VERIFYD_RETURN_IF_ERROR(rk.comm->AllReduceSum(rk.part, n, F32, rk.stream));
  MarkProfile(rk, ProfileCategory::kOther);
  return kc::AddInPlaceCuda(rk.x, rk.part, n, rk.stream);
}

// The fallback attention with the step's attention parameters over one layer's cache.
absl::Status FallbackAttention(const kernels::VerifyAttentionParams& ap) {
  kc::FallbackAttentionParams p;
  p.batch = ap.batch;
  p.total_rows = ap.total_rows;
  p.num_heads = ap.num_heads;
  p.qk_dim = ap.qk_dim;
  p.v_dim = ap.v_dim;
  p.softmax_scale = ap.softmax_scale;
  p.q = ap.q;
  p.kv = ap.kv;
  p.kv_fp8 = ap.kv_fp8;
  p.q_indptr = ap.q_indptr;
  p.kv_indptr = ap.kv_indptr;
  p.kv_indices = ap.kv_indices;
  p.tree_mask = ap.tree_mask;
  p.mask_words = ap.mask_words;
  p.out = ap.out;
  p.stream = ap.stream;
  return kc::FallbackAttentionCuda(p);
}

}  // namespace

absl::Status ComputeRopeTable(const MlaStep& s, CudaRankContext& rk) {
  kc::RopeTableParams p;
  p.rows = static_cast<int>(s.rows);
  p.rope_dim = static_cast<int>(s.config->qk_rope_head_dim);
  p.positions = s.positions;
  p.inv_freq = rk.inv_freq;
  p.attention_factor = rk.rope_attention_factor;
  p.cos_table = rk.cos_t;
  p.sin_table = rk.sin_t;
  p.stream = rk.stream;
  return kc::RopeTableCuda(p);
}

absl::Status EmbedTokens(const MlaStep& s, CudaRankContext& rk) {
  kc::EmbeddingGatherParams p;
  p.rows = static_cast<int>(s.rows);
  p.hidden = s.config->hidden_size;
  p.tokens = s.tokens;
  p.table = rk.embed;
  p.out = rk.x;
  p.stream = rk.stream;
  if (s.tp > 1) {  // vocab-parallel: this rank's rows, the others' zeros; summed below
    p.vocab_begin = rk.vocab.begin;
    p.vocab_rows = rk.vocab.size;
  }
  VERIFYD_RETURN_IF_ERROR(kc::EmbeddingGatherCuda(p));
  if (s.tp == 1) return absl::OkStatus();
  // One rank holds each token's row: the sum is that row exactly, in any order.
  MarkProfile(rk, ProfileCategory::kComm);
  VERIFYD_RETURN_IF_ERROR(
      rk.comm->AllReduceSum(rk.x, s.rows * s.config->hidden_size, F32, rk.stream));
  MarkProfile(rk, ProfileCategory::kOther);
  return absl::OkStatus();
}

namespace {

// The per-layer sizes RunMlaLayer's phases share.
struct LayerDims {
  explicit LayerDims(const MlaStep& s, const CudaRankContext& rk)
      : R(s.rows),
        hid(s.config->hidden_size),
        qk(s.config->qk_head_dim()),
        nope(s.config->qk_nope_head_dim),
        rope(s.config->qk_rope_head_dim),
        v(s.config->v_head_dim),
        kvl(s.config->kv_lora_rank),
        lat(s.config->latent_dim()),
        ql(s.config->q_lora_rank),
        Hl(rk.heads.size),
        Il(rk.inter.size) {}
  int64_t R, hid, qk, nope, rope, v, kvl, lat, ql, Hl, Il;
};

// kv_a's output (fp32, row stride ld): its own buffer, or a column block of the fused FP8
// q_a | kv_a output.
struct KvaView {
  const float* kva;
  int64_t ld;
};

// q (bf16, [R, Hl * qk]) and kv_a's output from xn: the FP8 path (W8A8: one GEMM for q_a and
// kv_a, xn quantized once; q_b's fp32 output rounded to bf16 as cuBLAS rounds the bf16
// path's) or the bf16 GEMMs.
absl::Status QueryAndKvA(const MlaStep& s, const LayerDims& d, const CudaLayerWeights& L,
                         CudaRankContext& rk, KvaView* kv_a) {
  MarkProfile(rk, ProfileCategory::kGemm);
  if (rk.fp8_attention) {
    const int64_t na = rk.fp8_qkv_a_cols;
    VERIFYD_RETURN_IF_ERROR(Fp8Linear(s, rk, rk.xn, d.hid, L.qkv_a_fp8, L.qkv_a_scale,
                                      rk.attn_gemm_qkv_a.get(), rk.qkva));
    *kv_a = {rk.qkva + d.ql, na};
    const bf16* q_in = rk.xn;
    int64_t ld_q_in = d.hid;
    if (d.ql > 0) {
      MarkProfile(rk, ProfileCategory::kOther);
      VERIFYD_RETURN_IF_ERROR(
          StepRmsNorm(s, rk, rk.qkva, F32, na, d.ql, L.q_a_norm, rk.qan, BF16, d.ql));
      MarkProfile(rk, ProfileCategory::kGemm);
      q_in = rk.qan;
      ld_q_in = d.ql;
    }
    VERIFYD_RETURN_IF_ERROR(
        Fp8Linear(s, rk, q_in, ld_q_in, L.q_b_fp8, L.q_b_scale, rk.attn_gemm_q_b.get(), rk.qf));
    return kc::FloatToBf16Cuda(rk.qf, rk.q, d.R * d.Hl * d.qk, rk.stream);
  }
  *kv_a = {rk.kva, d.lat};
  if (d.ql > 0) {
    VERIFYD_RETURN_IF_ERROR(Gemm(s, rk, rk.xn, d.hid, L.q_a, d.ql, rk.qa, F32, 0.f));
    MarkProfile(rk, ProfileCategory::kOther);
    VERIFYD_RETURN_IF_ERROR(
        StepRmsNorm(s, rk, rk.qa, F32, d.ql, d.ql, L.q_a_norm, rk.qan, BF16, d.ql));
    MarkProfile(rk, ProfileCategory::kGemm);
    VERIFYD_RETURN_IF_ERROR(Gemm(s, rk, rk.qan, d.ql, L.q_b, d.Hl * d.qk, rk.q, BF16, 0.f));
  } else {
    VERIFYD_RETURN_IF_ERROR(Gemm(s, rk, rk.xn, d.hid, L.q_b, d.Hl * d.qk, rk.q, BF16, 0.f));
  }
  return Gemm(s, rk, rk.xn, d.hid, L.kv_a, d.lat, rk.kva, F32, 0.f);
}

// One batched GEMM a head through W_kv_b's per-head blocks: the absorbed query's latent part
// (W_UK, !transposed) or the attention output's value projection (W_UV^T, transposed).
absl::Status HeadBatchedGemm(const LayerDims& d, const CudaLayerWeights& L, CudaRankContext& rk,
                             bool uv) {
  kc::BatchedGemmParams p;
  p.batch = static_cast<int>(d.Hl);
  p.m = d.R;
  p.ldw = d.kvl;
  p.stride_w = (d.nope + d.v) * d.kvl;
  if (!uv) {  // qatt[r, h, 0:kvl] = q_nope[r, h] . W_UK[h] ([nope, kvl])
    p.n = d.kvl;
    p.k = d.nope;
    p.x = rk.q;
    p.ldx = d.Hl * d.qk;
    p.stride_x = d.qk;
    p.w = L.kv_b;
    p.w_transposed = false;
    p.y = rk.qatt;
    p.ldy = d.Hl * d.lat;
    p.stride_y = d.lat;
  } else {  // attn[r, h*v : (h+1)*v] = olat[r, h] . W_UV[h]^T (W_UV[h] [v, kvl])
    p.n = d.v;
    p.k = d.kvl;
    p.x = rk.olat;
    p.ldx = d.Hl * d.kvl;
    p.stride_x = d.kvl;
    p.w = L.kv_b + d.nope * d.kvl;
    p.w_transposed = true;
    p.y = rk.attn;
    p.ldy = d.Hl * d.v;
    p.stride_y = d.v;
  }
  return kc::GemmBf16Batched(rk.cublas, p);
}

// The step's latent KV rows into the layer's cache (kv_a norm + RoPE), and the absorbed
// query's rope columns.
absl::Status WriteLatentKvAndRopeQuery(const MlaStep& s, const LayerDims& d,
                                       const CudaLayerWeights& L, int64_t layer,
                                       CudaRankContext& rk, const KvaView& kv_a) {
  MarkProfile(rk, ProfileCategory::kOther);
  kc::LatentKvWriteParams p;
  p.rows = static_cast<int>(d.R);
  p.kv_lora = static_cast<int>(d.kvl);
  p.rope_dim = static_cast<int>(d.rope);
  p.kva = kv_a.kva;
  p.ld_kva = kv_a.ld;
  p.kv_norm_weight = L.kv_a_norm;
  p.eps = static_cast<float>(s.config->rms_norm_eps);
  p.cos_table = rk.cos_t;
  p.sin_table = rk.sin_t;
  p.slots = s.slots;
  p.cache = rk.kv[layer];
  p.fp8 = rk.kv_fp8;
  p.kv_slots = s.kv_slots;
  p.stream = rk.stream;
  VERIFYD_RETURN_IF_ERROR(kc::LatentKvWriteCuda(p));
  kc::QRopeParams q;
  q.rows = static_cast<int>(d.R);
  q.heads = static_cast<int>(d.Hl);
  q.rope_dim = static_cast<int>(d.rope);
  q.in = rk.q;
  q.in_head_stride = d.qk;
  q.in_offset = d.nope;
  q.out = rk.qatt;
  q.out_head_stride = d.lat;
  q.out_offset = d.kvl;
  q.cos_table = rk.cos_t;
  q.sin_table = rk.sin_t;
  q.stream = rk.stream;
  return kc::QRopeCuda(q);
}

// Verify attention (or the fallback) over the layer's cache: qatt -> olat.
absl::Status LayerAttention(const MlaStep& s, int64_t layer, CudaRankContext& rk) {
  MarkProfile(rk, ProfileCategory::kAttention);
  kernels::VerifyAttentionParams ap = s.attention;
  ap.kv = rk.kv[layer];
  if (s.verify_plan != nullptr) return kc::VerifyAttentionCuda(ap, *s.verify_plan, rk.vk_ws);
  return FallbackAttention(ap);
}

// x += o_proj(W_UV(olat)), reduced over the ranks.
absl::Status AttentionOutput(const MlaStep& s, const LayerDims& d, const CudaLayerWeights& L,
                             CudaRankContext& rk) {
  MarkProfile(rk, ProfileCategory::kGemm);
  VERIFYD_RETURN_IF_ERROR(HeadBatchedGemm(d, L, rk, /*uv=*/true));
  const bool tp1 = s.tp == 1;
  if (rk.fp8_attention) {
    // The FP8 GEMM overwrites: its partial goes to part, added into x at TP = 1.
    VERIFYD_RETURN_IF_ERROR(Fp8Linear(s, rk, rk.attn, d.Hl * d.v, L.o_proj_fp8, L.o_proj_scale,
                                      rk.attn_gemm_o.get(), rk.part));
    if (tp1) {
      MarkProfile(rk, ProfileCategory::kOther);
      VERIFYD_RETURN_IF_ERROR(kc::AddInPlaceCuda(rk.x, rk.part, d.R * d.hid, rk.stream));
    }
  } else {
    VERIFYD_RETURN_IF_ERROR(Gemm(s, rk, rk.attn, d.Hl * d.v, L.o_proj, d.hid, tp1 ? rk.x : rk.part,
                                 F32, tp1 ? 1.f : 0.f));
  }
  return ReduceIntoX(s, rk);
}

// The dense MLP with FP8 weights (W8A8, moe_mlp.h RunFp8Mlp; rk.fp8_offsets written by the
// step): its partial goes to part, added into x at TP = 1.
absl::Status DenseFp8Mlp(const MlaStep& s, const LayerDims& d, const CudaLayerWeights& L,
                         CudaRankContext& rk) {
  MarkProfile(rk, ProfileCategory::kGemm);
  kc::Fp8MlpArgs f;
  f.rows = d.R;
  f.hidden = d.hid;
  f.inter = d.Il;
  f.x = rk.xn;
  f.gate_up = L.gate_up_fp8;
  f.gate_up_scale = L.gate_up_scale;
  f.down = L.down_fp8;
  f.down_scale = L.down_scale;
  f.gemm_gate_up = rk.dense_gemm_gate_up.get();
  f.gemm_down = rk.dense_gemm_down.get();
  f.offsets = rk.fp8_offsets;
  f.lt = rk.fp8_lt.get();
  f.xq = rk.fp8_xq;
  f.xq_scale = rk.fp8_xq_scale;
  f.gu = rk.gu;
  f.actq = rk.fp8_actq;
  f.actq_scale = rk.fp8_actq_scale;
  f.out = rk.part;
  f.stream = rk.stream;
  VERIFYD_RETURN_IF_ERROR(kc::RunFp8Mlp(f));
  MarkProfile(rk, ProfileCategory::kOther);
  if (s.tp == 1) return kc::AddInPlaceCuda(rk.x, rk.part, d.R * d.hid, rk.stream);
  return absl::OkStatus();
}

// The dense MLP with bf16 weights: gate_up, SwiGLU, down (into x at TP = 1, else part).
absl::Status DenseBf16Mlp(const MlaStep& s, const LayerDims& d, const CudaLayerWeights& L,
                          CudaRankContext& rk) {
  const bool tp1 = s.tp == 1;
  MarkProfile(rk, ProfileCategory::kGemm);
  VERIFYD_RETURN_IF_ERROR(Gemm(s, rk, rk.xn, d.hid, L.gate_up, 2 * d.Il, rk.gu, F32, 0.f));
  MarkProfile(rk, ProfileCategory::kOther);
  VERIFYD_RETURN_IF_ERROR(kc::SwiGluPackedCuda(d.R, d.Il, rk.gu, rk.act, rk.stream));
  MarkProfile(rk, ProfileCategory::kGemm);
  return Gemm(s, rk, rk.act, d.Il, L.down, d.hid, tp1 ? rk.x : rk.part, F32, tp1 ? 1.f : 0.f);
}

}  // namespace

absl::Status RunMlaLayer(const MlaStep& s, int64_t layer, CudaRankContext& rk) {
  const LayerDims d(s, rk);
  const CudaLayerWeights& L = rk.layers[layer];

  // Attention block: projections, absorbed query, latent KV write, attention, o_proj.
  MarkProfile(rk, ProfileCategory::kOther);
  VERIFYD_RETURN_IF_ERROR(
      StepRmsNorm(s, rk, rk.x, F32, d.hid, d.hid, L.input_norm, rk.xn, BF16, d.hid));
  KvaView kv_a{};
  VERIFYD_RETURN_IF_ERROR(QueryAndKvA(s, d, L, rk, &kv_a));
  VERIFYD_RETURN_IF_ERROR(HeadBatchedGemm(d, L, rk, /*uv=*/false));
  VERIFYD_RETURN_IF_ERROR(WriteLatentKvAndRopeQuery(s, d, L, layer, rk, kv_a));
  VERIFYD_RETURN_IF_ERROR(LayerAttention(s, layer, rk));
  VERIFYD_RETURN_IF_ERROR(AttentionOutput(s, d, L, rk));

  // MLP block: MoE, dense FP8, dense bf16, or none (a zero partial for the reduction).
  MarkProfile(rk, ProfileCategory::kOther);
  VERIFYD_RETURN_IF_ERROR(
      StepRmsNorm(s, rk, rk.x, F32, d.hid, d.hid, L.post_norm, rk.xn, BF16, d.hid));
  if (s.config->IsMoeLayer(layer)) {
    VERIFYD_RETURN_IF_ERROR(RunMoeMlp(s, layer, rk));
  } else if (d.Il > 0 && L.gate_up_fp8 != nullptr) {
    VERIFYD_RETURN_IF_ERROR(DenseFp8Mlp(s, d, L, rk));
  } else if (d.Il > 0) {
    VERIFYD_RETURN_IF_ERROR(DenseBf16Mlp(s, d, L, rk));
  } else if (s.tp != 1) {
    VERIFYD_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(rk.part, 0, d.R * d.hid * sizeof(float), rk.stream));
  }
  return ReduceIntoX(s, rk);
}

absl::Status RunLmHeadArgmax(const MlaStep& s, CudaRankContext& rk) {
  const int64_t R = s.rows, hid = s.config->hidden_size, Vl = rk.vocab.size;
  MarkProfile(rk, ProfileCategory::kOther);
  VERIFYD_RETURN_IF_ERROR(StepRmsNorm(s, rk, rk.x, F32, hid, hid, rk.final_norm, rk.xn, BF16, hid));
  if (Vl > 0) {
    MarkProfile(rk, ProfileCategory::kGemm);
    kc::GemmParams p;
    p.m = R;
    p.n = Vl;
    p.k = hid;
    p.x = rk.xn;
    p.ldx = hid;
    p.w = rk.lm_head;
    p.ldw = hid;
    p.y = rk.logits;
    p.ldy = rk.vmax;
    p.y_dtype = F32;
    VERIFYD_RETURN_IF_ERROR(kc::GemmBf16(rk.cublas, p));
  }
  MarkProfile(rk, ProfileCategory::kSampling);
  {
    kc::ArgmaxRowsParams p;
    p.rows = static_cast<int>(R);
    p.n = Vl;
    p.logits = rk.logits;
    p.ld = rk.vmax;
    p.index_offset = rk.vocab.begin;
    p.out = rk.pairs;
    p.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::ArgmaxRowsCuda(p));
  }
  const kc::ArgmaxPair* cand = rk.pairs;
  if (s.tp > 1) {
    MarkProfile(rk, ProfileCategory::kComm);
    VERIFYD_RETURN_IF_ERROR(
        rk.comm->AllGather(rk.pairs, rk.gathered, R * sizeof(kc::ArgmaxPair), rk.stream));
    cand = rk.gathered;
    MarkProfile(rk, ProfileCategory::kSampling);
  }
  kc::ArgmaxCombineParams p;
  p.rows = static_cast<int>(R);
  p.world = s.tp;
  p.gathered = cand;
  p.predictions = rk.preds;
  p.stream = rk.stream;
  return kc::ArgmaxCombineCuda(p);
}

}  // namespace verifyd::tp
