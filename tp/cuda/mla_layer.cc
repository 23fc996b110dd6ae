// The decoder's kernels on one rank (see mla_layer.h).
#include "tp/cuda/mla_layer.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/argmax.h"
#include "kernels/cuda/dense/elementwise.h"
#include "kernels/cuda/dense/fallback_attention.h"
#include "kernels/cuda/dense/gemm.h"
#include "kernels/cuda/dense/moe.h"
#include "kernels/cuda/dense/moe_mlp.h"
#include "kernels/cuda/dense/rms_norm.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/status.h"
#include "tp/cuda/moe_layer.h"

namespace verifyd::tp {
namespace {

namespace kc = kernels::cuda;
using bf16 = kernels::bf16_bits;
constexpr auto F32 = kernels::DType::kFloat32;
constexpr auto BF16 = kernels::DType::kBFloat16;

// y[R, cols] = RMSNorm(x[R, cols]) * w.
absl::Status Norm(const MlaStep& s, CudaRankContext& rk, const void* x, kernels::DType xt,
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

absl::Status RunMlaLayer(const MlaStep& s, int64_t layer, CudaRankContext& rk) {
  const ModelConfig& c = *s.config;
  const int64_t R = s.rows;
  const int64_t hid = c.hidden_size, qk = c.qk_head_dim(), nope = c.qk_nope_head_dim;
  const int64_t rope = c.qk_rope_head_dim, v = c.v_head_dim, kvl = c.kv_lora_rank;
  const int64_t lat = c.latent_dim(), ql = c.q_lora_rank;
  const int64_t Hl = rk.heads.size, Il = rk.inter.size;
  const CudaLayerWeights& L = rk.layers[layer];

  // Attention block: projections, absorbed query, latent KV write, attention, o_proj.
  MarkProfile(rk, ProfileCategory::kOther);
  VERIFYD_RETURN_IF_ERROR(Norm(s, rk, rk.x, F32, hid, hid, L.input_norm, rk.xn, BF16, hid));
  MarkProfile(rk, ProfileCategory::kGemm);
  // kv_a's output (fp32, row stride ld_kva): its own buffer, or a column block of the fused
  // FP8 q_a | kv_a output.
  const float* kva = rk.kva;
  int64_t ld_kva = lat;
  if (rk.fp8_attention) {
    // FP8 weights (W8A8): one GEMM for q_a and kv_a (xn quantized once), q_b's fp32 output
    // rounded to bf16 as cuBLAS rounds the bf16 path's.
    const int64_t na = rk.fp8_qkv_a_cols;
    VERIFYD_RETURN_IF_ERROR(Fp8Linear(s, rk, rk.xn, hid, L.qkv_a_fp8, L.qkv_a_scale,
                                      rk.attn_gemm_qkv_a.get(), rk.qkva));
    kva = rk.qkva + ql;
    ld_kva = na;
    const bf16* q_in = rk.xn;
    int64_t ld_q_in = hid;
    if (ql > 0) {
      MarkProfile(rk, ProfileCategory::kOther);
      VERIFYD_RETURN_IF_ERROR(Norm(s, rk, rk.qkva, F32, na, ql, L.q_a_norm, rk.qan, BF16, ql));
      MarkProfile(rk, ProfileCategory::kGemm);
      q_in = rk.qan;
      ld_q_in = ql;
    }
    VERIFYD_RETURN_IF_ERROR(
        Fp8Linear(s, rk, q_in, ld_q_in, L.q_b_fp8, L.q_b_scale, rk.attn_gemm_q_b.get(), rk.qf));
    VERIFYD_RETURN_IF_ERROR(kc::FloatToBf16Cuda(rk.qf, rk.q, R * Hl * qk, rk.stream));
  } else if (ql > 0) {
    VERIFYD_RETURN_IF_ERROR(Gemm(s, rk, rk.xn, hid, L.q_a, ql, rk.qa, F32, 0.f));
    MarkProfile(rk, ProfileCategory::kOther);
    VERIFYD_RETURN_IF_ERROR(Norm(s, rk, rk.qa, F32, ql, ql, L.q_a_norm, rk.qan, BF16, ql));
    MarkProfile(rk, ProfileCategory::kGemm);
    VERIFYD_RETURN_IF_ERROR(Gemm(s, rk, rk.qan, ql, L.q_b, Hl * qk, rk.q, BF16, 0.f));
  } else {
    VERIFYD_RETURN_IF_ERROR(Gemm(s, rk, rk.xn, hid, L.q_b, Hl * qk, rk.q, BF16, 0.f));
  }
  if (!rk.fp8_attention) {
    VERIFYD_RETURN_IF_ERROR(Gemm(s, rk, rk.xn, hid, L.kv_a, lat, rk.kva, F32, 0.f));
  }
  // Absorbed query, latent part: qatt[r, h, 0:kvl] = q_nope[r, h] . W_UK[h] ([nope, kvl]).
  {
    kc::BatchedGemmParams p;
    p.batch = static_cast<int>(Hl);
    p.m = R;
    p.n = kvl;
    p.k = nope;
    p.x = rk.q;
    p.ldx = Hl * qk;
    p.stride_x = qk;
    p.w = L.kv_b;
    p.ldw = kvl;
    p.stride_w = (nope + v) * kvl;
    p.w_transposed = false;
    p.y = rk.qatt;
    p.ldy = Hl * lat;
    p.stride_y = lat;
    VERIFYD_RETURN_IF_ERROR(kc::GemmBf16Batched(rk.cublas, p));
  }
  MarkProfile(rk, ProfileCategory::kOther);
  {
    kc::LatentKvWriteParams p;
    p.rows = static_cast<int>(R);
    p.kv_lora = static_cast<int>(kvl);
    p.rope_dim = static_cast<int>(rope);
    p.kva = kva;
    p.ld_kva = ld_kva;
    p.kv_norm_weight = L.kv_a_norm;
    p.eps = static_cast<float>(c.rms_norm_eps);
    p.cos_table = rk.cos_t;
    p.sin_table = rk.sin_t;
    p.slots = s.slots;
    p.cache = rk.kv[layer];
    p.fp8 = rk.kv_fp8;
    p.kv_slots = s.kv_slots;
    p.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::LatentKvWriteCuda(p));
  }
  {
    kc::QRopeParams p;
    p.rows = static_cast<int>(R);
    p.heads = static_cast<int>(Hl);
    p.rope_dim = static_cast<int>(rope);
    p.in = rk.q;
    p.in_head_stride = qk;
    p.in_offset = nope;
    p.out = rk.qatt;
    p.out_head_stride = lat;
    p.out_offset = kvl;
    p.cos_table = rk.cos_t;
    p.sin_table = rk.sin_t;
    p.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::QRopeCuda(p));
  }
  MarkProfile(rk, ProfileCategory::kAttention);
  {
    kernels::VerifyAttentionParams ap = s.attention;
    ap.kv = rk.kv[layer];
    if (s.verify_plan != nullptr) {
      VERIFYD_RETURN_IF_ERROR(kc::VerifyAttentionCuda(ap, *s.verify_plan, rk.vk_ws));
    } else {
      VERIFYD_RETURN_IF_ERROR(FallbackAttention(ap));
    }
  }
  MarkProfile(rk, ProfileCategory::kGemm);
  // attn[r, h*v : (h+1)*v] = olat[r, h] . W_UV[h]^T (W_UV[h] [v, kvl]).
  {
    kc::BatchedGemmParams p;
    p.batch = static_cast<int>(Hl);
    p.m = R;
    p.n = v;
    p.k = kvl;
    p.x = rk.olat;
    p.ldx = Hl * kvl;
    p.stride_x = kvl;
    p.w = L.kv_b + nope * kvl;
    p.ldw = kvl;
    p.stride_w = (nope + v) * kvl;
    p.w_transposed = true;
    p.y = rk.attn;
    p.ldy = Hl * v;
    p.stride_y = v;
    VERIFYD_RETURN_IF_ERROR(kc::GemmBf16Batched(rk.cublas, p));
  }
  const bool tp1 = s.tp == 1;
  if (rk.fp8_attention) {
    // The FP8 GEMM overwrites: its partial goes to part, added into x at TP = 1.
    VERIFYD_RETURN_IF_ERROR(Fp8Linear(s, rk, rk.attn, Hl * v, L.o_proj_fp8, L.o_proj_scale,
                                      rk.attn_gemm_o.get(), rk.part));
    if (tp1) {
      MarkProfile(rk, ProfileCategory::kOther);
      VERIFYD_RETURN_IF_ERROR(kc::AddInPlaceCuda(rk.x, rk.part, R * hid, rk.stream));
    }
  } else {
    VERIFYD_RETURN_IF_ERROR(
        Gemm(s, rk, rk.attn, Hl * v, L.o_proj, hid, tp1 ? rk.x : rk.part, F32, tp1 ? 1.f : 0.f));
  }
  VERIFYD_RETURN_IF_ERROR(ReduceIntoX(s, rk));

  // MLP block.
  MarkProfile(rk, ProfileCategory::kOther);
  VERIFYD_RETURN_IF_ERROR(Norm(s, rk, rk.x, F32, hid, hid, L.post_norm, rk.xn, BF16, hid));
  if (c.IsMoeLayer(layer)) {
    VERIFYD_RETURN_IF_ERROR(RunMoeMlp(s, layer, rk));
  } else if (Il > 0 && L.gate_up_fp8 != nullptr) {
    // FP8 weights (W8A8, moe_mlp.h RunFp8Mlp; rk.fp8_offsets written by the step): the MLP
    // writes its partial into part.
    MarkProfile(rk, ProfileCategory::kGemm);
    kc::Fp8MlpArgs f;
    f.rows = R;
    f.hidden = hid;
    f.inter = Il;
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
    if (tp1) return kc::AddInPlaceCuda(rk.x, rk.part, R * hid, rk.stream);
  } else if (Il > 0) {
    MarkProfile(rk, ProfileCategory::kGemm);
    VERIFYD_RETURN_IF_ERROR(Gemm(s, rk, rk.xn, hid, L.gate_up, 2 * Il, rk.gu, F32, 0.f));
    MarkProfile(rk, ProfileCategory::kOther);
    kc::SwiGluParams p;
    p.rows = static_cast<int>(R);
    p.n = Il;
    p.gate_up = rk.gu;
    p.ld_in = 2 * Il;
    p.up_offset = Il;
    p.out = rk.act;
    p.ld_out = Il;
    p.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::SwiGluCuda(p));
    MarkProfile(rk, ProfileCategory::kGemm);
    VERIFYD_RETURN_IF_ERROR(
        Gemm(s, rk, rk.act, Il, L.down, hid, tp1 ? rk.x : rk.part, F32, tp1 ? 1.f : 0.f));
  } else if (!tp1) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(rk.part, 0, R * hid * sizeof(float), rk.stream));
  }
  return ReduceIntoX(s, rk);
}

absl::Status RunLmHeadArgmax(const MlaStep& s, CudaRankContext& rk) {
  const int64_t R = s.rows, hid = s.config->hidden_size, Vl = rk.vocab.size;
  MarkProfile(rk, ProfileCategory::kOther);
  VERIFYD_RETURN_IF_ERROR(Norm(s, rk, rk.x, F32, hid, hid, rk.final_norm, rk.xn, BF16, hid));
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
