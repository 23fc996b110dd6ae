// The CPU backend's per-rank forward; see cpu_forward.h.
#include "tp/cpu/cpu_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/kv_fp8.h"
#include "kernels/reference/ops.h"
#include "kernels/status.h"
#include "kernels/verify_attention.h"
#include "kernels/yarn.h"

namespace verifyd::tp {
namespace {

namespace ref = kernels::ref;

// The [rows, cols] matrix view of a tensor's shape (validated by the caller).
absl::StatusOr<MatrixView> ViewOf(const WeightSource& src, const std::string& name) {
  VERIFYD_ASSIGN_OR_RETURN(std::vector<int64_t> shape, src.Shape(name));
  return MatrixViewOf(shape);
}

// The whole tensor (replicated ones).
absl::StatusOr<std::vector<float>> Whole(const WeightSource& src, const std::string& name) {
  VERIFYD_ASSIGN_OR_RETURN(MatrixView m, ViewOf(src, name));
  std::vector<float> out;
  VERIFYD_RETURN_IF_ERROR(AppendFiniteBlock(src, name, 0, m.rows, 0, m.cols, &out));
  return out;
}

// Rows [row0, row0 + nrows), every column.
absl::StatusOr<std::vector<float>> Rows(const WeightSource& src, const std::string& name,
                                        int64_t row0, int64_t nrows) {
  VERIFYD_ASSIGN_OR_RETURN(MatrixView m, ViewOf(src, name));
  std::vector<float> out;
  VERIFYD_RETURN_IF_ERROR(AppendFiniteBlock(src, name, row0, nrows, 0, m.cols, &out));
  return out;
}

// Columns [col0, col0 + ncols) of every row -> [rows, ncols].
absl::StatusOr<std::vector<float>> Cols(const WeightSource& src, const std::string& name,
                                        int64_t col0, int64_t ncols) {
  VERIFYD_ASSIGN_OR_RETURN(MatrixView m, ViewOf(src, name));
  std::vector<float> out;
  VERIFYD_RETURN_IF_ERROR(AppendFiniteBlock(src, name, 0, m.rows, col0, ncols, &out));
  return out;
}

}  // namespace

absl::StatusOr<RankWeights> ShardWeights(const WeightSource& src, int world, int rank) {
  const ModelConfig& c = src.config();
  VERIFYD_RETURN_IF_ERROR(ValidateTpSize(c, world));
  if (rank < 0 || rank >= world) return absl::InvalidArgumentError("ShardWeights: bad rank");
  VERIFYD_RETURN_IF_ERROR(ValidateModelConfig(c));
  VERIFYD_RETURN_IF_ERROR(ValidateWeightSource(src, ModelTensorSpecs(c)));
  RankWeights w;
  w.world = world;
  w.rank = rank;
  w.heads = HeadShard(c.num_attention_heads, world, rank);
  w.vocab = VocabShard(c.vocab_size, world, rank);
  w.inter = IntermediateShard(c.intermediate_size, world, rank);
  const int64_t qk = c.qk_head_dim(), nope = c.qk_nope_head_dim, v = c.v_head_dim;
  const int64_t kvl = c.kv_lora_rank, Hl = w.heads.size, h0 = w.heads.begin;
  VERIFYD_ASSIGN_OR_RETURN(w.embed, Whole(src, "model.embed_tokens.weight"));
  std::vector<float> w_uk;  // one head's W_UK [nope, kv_lora], before the transpose
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto n = [&](const char* suffix) { return LayerTensorName(l, suffix); };
    RankWeights::Layer L;
    VERIFYD_ASSIGN_OR_RETURN(L.input_norm, Whole(src, n("input_layernorm.weight")));
    if (c.q_lora_rank > 0) {
      VERIFYD_ASSIGN_OR_RETURN(L.q_a, Whole(src, n("self_attn.q_a_proj.weight")));
      VERIFYD_ASSIGN_OR_RETURN(L.q_a_norm, Whole(src, n("self_attn.q_a_layernorm.weight")));
      VERIFYD_ASSIGN_OR_RETURN(L.q_b, Rows(src, n("self_attn.q_b_proj.weight"), h0 * qk, Hl * qk));
    } else {
      VERIFYD_ASSIGN_OR_RETURN(L.q_b, Rows(src, n("self_attn.q_proj.weight"), h0 * qk, Hl * qk));
    }
    VERIFYD_ASSIGN_OR_RETURN(L.kv_a, Whole(src, n("self_attn.kv_a_proj_with_mqa.weight")));
    VERIFYD_ASSIGN_OR_RETURN(L.kv_a_norm, Whole(src, n("self_attn.kv_a_layernorm.weight")));
    // kv_b_proj rows of head h: [h*(nope+v), +nope) = W_UK[h] [nope, kv_lora], then
    // [+nope, +v) = W_UV[h] [v, kv_lora]. Read head by head: W_UV in place, W_UK transposed.
    const std::string kvb = n("self_attn.kv_b_proj.weight");
    L.w_uk_t.resize(Hl * kvl * nope);
    L.w_uv.resize(Hl * v * kvl);
    w_uk.resize(nope * kvl);
    for (int64_t h = 0; h < Hl; ++h) {
      const int64_t row0 = (h0 + h) * (nope + v);
      VERIFYD_RETURN_IF_ERROR(ReadFiniteBlock(src, kvb, row0, nope, 0, kvl, w_uk.data()));
      for (int64_t d = 0; d < nope; ++d) {
        for (int64_t j = 0; j < kvl; ++j) L.w_uk_t[(h * kvl + j) * nope + d] = w_uk[d * kvl + j];
      }
      VERIFYD_RETURN_IF_ERROR(
          ReadFiniteBlock(src, kvb, row0 + nope, v, 0, kvl, L.w_uv.data() + h * v * kvl));
    }
    VERIFYD_ASSIGN_OR_RETURN(L.o_proj, Cols(src, n("self_attn.o_proj.weight"), h0 * v, Hl * v));
    VERIFYD_ASSIGN_OR_RETURN(L.post_norm, Whole(src, n("post_attention_layernorm.weight")));
    if (c.IsMoeLayer(l)) {
      L.is_moe = true;
      VERIFYD_ASSIGN_OR_RETURN(L.moe, ShardMoeLayer(src, l, world, rank));
      w.layers.push_back(std::move(L));
      continue;
    }
    VERIFYD_ASSIGN_OR_RETURN(L.gate,
                             Rows(src, n("mlp.gate_proj.weight"), w.inter.begin, w.inter.size));
    VERIFYD_ASSIGN_OR_RETURN(L.up, Rows(src, n("mlp.up_proj.weight"), w.inter.begin, w.inter.size));
    VERIFYD_ASSIGN_OR_RETURN(L.down,
                             Cols(src, n("mlp.down_proj.weight"), w.inter.begin, w.inter.size));
    w.layers.push_back(std::move(L));
  }
  VERIFYD_ASSIGN_OR_RETURN(w.final_norm, Whole(src, "model.norm.weight"));
  VERIFYD_ASSIGN_OR_RETURN(
      w.lm_head, Rows(src, c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                      w.vocab.begin, w.vocab.size));
  return w;
}

absl::StatusOr<RankWeights> ShardWeights(const ModelWeights& mw, int world, int rank) {
  const InMemoryWeightSource src(&mw);
  return ShardWeights(src, world, rank);
}

absl::Status AbsorbedMlaAttention(const ModelConfig& c, int64_t heads, const BatchPlan& plan,
                                  const float* q, const float* w_uk_t, const float* w_uv,
                                  const float* kv, int64_t kv_slots, float* out) {
  const int64_t R = plan.total_rows, qk = c.qk_head_dim(), nope = c.qk_nope_head_dim;
  const int64_t rope = c.qk_rope_head_dim, kvl = c.kv_lora_rank, lat = c.latent_dim();
  const int64_t v = c.v_head_dim;
  // Absorbed query [R, heads, kv_lora + rope]: q_nope[h] · W_UK[h], then q_rope[h].
  std::vector<float> qlat(R * heads * lat);
  for (int64_t h = 0; h < heads; ++h) {
    ref::Linear(q + h * qk, R, nope, heads * qk, w_uk_t + h * kvl * nope, kvl,
                qlat.data() + h * lat, heads * lat);
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(qlat.data() + (r * heads + h) * lat + kvl, q + (r * heads + h) * qk + nope,
                  rope * sizeof(float));
    }
  }
  std::vector<float> olat(R * heads * kvl, std::numeric_limits<float>::quiet_NaN());
  kernels::VerifyAttentionParams p;
  p.batch = plan.batch;
  p.total_rows = plan.total_rows;
  p.num_heads = static_cast<int>(heads);
  p.qk_dim = static_cast<int>(lat);
  p.v_dim = static_cast<int>(kvl);
  p.softmax_scale = AttentionSoftmaxScale(c);
  p.dtype = kernels::DType::kFloat32;
  p.q = qlat.data();
  p.kv = kv;
  p.kv_slots = kv_slots;
  p.q_indptr = plan.q_indptr.data();
  p.kv_indptr = plan.kv_indptr.data();
  p.kv_indices = plan.kv_indices.data();
  p.tree_mask = plan.tree_mask.data();
  p.mask_words = kMaskWords;
  p.out = olat.data();
  if (absl::Status s = kernels::VerifyAttentionReference(p); !s.ok()) return s;
  // attn[r, h*v + i] = o_lat[r, h] · W_UV[h][i]
  for (int64_t h = 0; h < heads; ++h) {
    ref::Linear(olat.data() + h * kvl, R, kvl, heads * kvl, w_uv + h * v * kvl, v, out + h * v,
                heads * v);
  }
  return absl::OkStatus();
}

RankForward::RankForward(const ModelConfig& config, RankWeights weights, Communicator* comm,
                         int64_t kv_slots, bool kv_fp8)
    : config_(config),
      w_(std::move(weights)),
      comm_(comm),
      kv_slots_(kv_slots),
      kv_fp8_(kv_fp8),
      // Unused slots hold NaN: a stray read poisons the output and fails loudly.
      kv_(config.num_hidden_layers * kv_slots * config.latent_dim(),
          std::numeric_limits<float>::quiet_NaN()) {
  if (config.rope_scaling.type == "yarn") {
    const kernels::YarnParams p = YarnParamsOf(config);
    yarn_inv_freq_ = kernels::YarnInvFreq(p);
    yarn_attention_factor_ = static_cast<float>(kernels::YarnAttentionFactor(p));
  }
}

void RankForward::Rope(float* x, int64_t rows, int64_t heads, int64_t head_stride, int64_t offset,
                       const int32_t* positions) const {
  const int64_t rope = config_.qk_rope_head_dim;
  if (yarn_inv_freq_.empty()) {
    ref::ApplyRope(x, rows, heads, head_stride, offset, rope, positions,
                   static_cast<float>(config_.rope_theta));
  } else {
    ref::ApplyRopeTable(x, rows, heads, head_stride, offset, rope, positions, yarn_inv_freq_.data(),
                        yarn_attention_factor_);
  }
}

absl::Status RankForward::Forward(const BatchPlan& plan, std::vector<int32_t>* predictions,
                                  std::vector<float>* logits, const ForwardExtras* extras,
                                  std::vector<float>* row_logits, std::vector<float>* hidden_out) {
  const ModelConfig& c = config_;
  const int64_t R = plan.total_rows, hid = c.hidden_size, Hl = w_.heads.size;
  const int64_t qk = c.qk_head_dim(), lat = c.latent_dim(), kvl = c.kv_lora_rank;
  const int64_t rope = c.qk_rope_head_dim, v = c.v_head_dim, Il = w_.inter.size;
  const int64_t Vl = w_.vocab.size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  predictions->assign(R, -1);
  if (R == 0) return absl::OkStatus();

  // Residual stream x [R, hidden] = embeddings of the rows' tokens.
  std::vector<float> x(R * hid);
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(x.data() + r * hid, w_.embed.data() + int64_t{plan.tokens[r]} * hid,
                hid * sizeof(float));
  }
  std::vector<float> h(R * hid), qa, q(R * Hl * qk), kva(R * lat), attn(R * Hl * v);
  std::vector<float> part(R * hid), gate(R * Il), up(R * Il), act(R * Il);
  if (c.q_lora_rank > 0) qa.resize(R * c.q_lora_rank);
  const bool capture = extras != nullptr && hidden_out != nullptr && !extras->by_layer.empty();
  if (capture) hidden_out->assign(extras->hidden_floats, 0.0f);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const RankWeights::Layer& L = w_.layers[l];
    ref::RmsNorm(x.data(), R, hid, hid, L.input_norm.data(), eps, h.data());
    // Queries of the local heads [R, H_l, nope + rope].
    if (c.q_lora_rank > 0) {
      const int64_t ql = c.q_lora_rank;
      ref::Linear(h.data(), R, hid, hid, L.q_a.data(), ql, qa.data(), ql);
      ref::RmsNorm(qa.data(), R, ql, ql, L.q_a_norm.data(), eps, qa.data());
      ref::Linear(qa.data(), R, ql, ql, L.q_b.data(), Hl * qk, q.data(), Hl * qk);
    } else {
      ref::Linear(h.data(), R, hid, hid, L.q_b.data(), Hl * qk, q.data(), Hl * qk);
    }
    Rope(q.data(), R, Hl, qk, c.qk_nope_head_dim, plan.positions.data());
    // Latent rows [R, kv_lora + rope]: normed c_kv | roped k_pe, into the tail slots.
    ref::Linear(h.data(), R, hid, hid, L.kv_a.data(), lat, kva.data(), lat);
    ref::RmsNorm(kva.data(), R, kvl, lat, L.kv_a_norm.data(), eps, kva.data());
    Rope(kva.data(), R, 1, lat, kvl, plan.positions.data());
    float* cache = kv_layer_mut(l);
    for (int64_t r = 0; r < R; ++r) {
      float* row = cache + int64_t{plan.tail_slots[r]} * lat;
      std::memcpy(row, kva.data() + r * lat, lat * sizeof(float));
      if (kv_fp8_) kernels::KvFp8RoundTrip(row, kvl, rope, kernels::kKvFp8Group);
    }
    if (absl::Status s = AbsorbedMlaAttention(c, Hl, plan, q.data(), L.w_uk_t.data(), L.w_uv.data(),
                                              cache, kv_slots_, attn.data());
        !s.ok()) {
      return s;
    }
    // o_proj over the local heads' columns, summed over ranks.
    ref::Linear(attn.data(), R, Hl * v, Hl * v, L.o_proj.data(), hid, part.data(), hid);
    if (absl::Status s =
            comm_->AllReduceSum(part.data(), part.size(), kernels::DType::kFloat32, nullptr);
        !s.ok()) {
      return s;
    }
    ref::AddInPlace(x.data(), part.data(), R * hid);
    // SwiGLU MLP on the local intermediate columns, down-projection summed over ranks.
    ref::RmsNorm(x.data(), R, hid, hid, L.post_norm.data(), eps, h.data());
    if (L.is_moe) {
      MoeForwardLocal(c, L.moe, h.data(), R, part.data());
    } else if (Il > 0) {
      ref::Linear(h.data(), R, hid, hid, L.gate.data(), Il, gate.data(), Il);
      ref::Linear(h.data(), R, hid, hid, L.up.data(), Il, up.data(), Il);
      ref::SwiGlu(gate.data(), up.data(), R, Il, Il, act.data());
      ref::Linear(act.data(), R, Il, Il, L.down.data(), hid, part.data(), hid);
    } else {
      std::fill(part.begin(), part.end(), 0.0f);
    }
    if (absl::Status s =
            comm_->AllReduceSum(part.data(), part.size(), kernels::DType::kFloat32, nullptr);
        !s.ok()) {
      return s;
    }
    ref::AddInPlace(x.data(), part.data(), R * hid);
    if (capture) {
      for (const ForwardExtras::Capture& cap : extras->by_layer[l]) {
        for (int32_t t = 0; t < cap.rows; ++t) {
          std::memcpy(hidden_out->data() + cap.offset + t * cap.stride,
                      x.data() + int64_t{cap.row0 + t} * hid, hid * sizeof(float));
        }
      }
    }
  }
  // LM head on the local vocab rows, then the vocab-parallel argmax.
  ref::RmsNorm(x.data(), R, hid, hid, w_.final_norm.data(), eps, h.data());
  const int64_t Vmax = CeilShardMax(c.vocab_size, w_.world);
  std::vector<float> local_logits(R * Vmax, -std::numeric_limits<float>::infinity());
  struct ArgmaxEntry {
    float value;
    int32_t index;
  };
  std::vector<ArgmaxEntry> mine(R, {-std::numeric_limits<float>::infinity(), -1});
  if (Vl > 0) {
    ref::Linear(h.data(), R, hid, hid, w_.lm_head.data(), Vl, local_logits.data(), Vmax);
    std::vector<float> mv(R);
    std::vector<int32_t> mi(R);
    ref::ArgmaxRows(local_logits.data(), R, Vl, Vmax, w_.vocab.begin, mv.data(), mi.data());
    for (int64_t r = 0; r < R; ++r) mine[r] = {mv[r], mi[r]};
  }
  const int world = w_.world;
  std::vector<ArgmaxEntry> all(R * world);
  if (absl::Status s = comm_->AllGather(mine.data(), all.data(), R * sizeof(ArgmaxEntry), nullptr);
      !s.ok()) {
    return s;
  }
  for (int64_t r = 0; r < R; ++r) {
    float best = 0;
    int32_t best_i = -1;
    for (int k = 0; k < world; ++k) {  // ranks hold ascending vocab ranges
      const ArgmaxEntry& e = all[k * R + r];
      if (e.index < 0 || std::isnan(e.value)) continue;
      if (best_i < 0 || e.value > best || (e.value == best && e.index < best_i)) {
        best = e.value;
        best_i = e.index;
      }
    }
    if (best_i < 0) {
      return absl::InternalError(absl::StrCat("forward: row ", r, " has no finite logit"));
    }
    (*predictions)[r] = best_i;
  }
  if (logits != nullptr) {
    std::vector<int32_t> all(R);
    for (int64_t r = 0; r < R; ++r) all[r] = static_cast<int32_t>(r);
    if (absl::Status s = GatherLogitRows(local_logits, R, Vmax, all, logits); !s.ok()) return s;
  }
  if (extras != nullptr && !extras->logit_rows.empty() && row_logits != nullptr) {
    if (logits != nullptr) {
      // Already gathered: copy the rows.
      row_logits->resize(extras->logit_rows.size() * c.vocab_size);
      for (size_t i = 0; i < extras->logit_rows.size(); ++i) {
        std::memcpy(row_logits->data() + i * c.vocab_size,
                    logits->data() + int64_t{extras->logit_rows[i]} * c.vocab_size,
                    c.vocab_size * sizeof(float));
      }
    } else if (absl::Status s =
                   GatherLogitRows(local_logits, R, Vmax, extras->logit_rows, row_logits);
               !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status RankForward::GatherLogitRows(const std::vector<float>& local_logits, int64_t R,
                                          int64_t Vmax, const std::vector<int32_t>& rows,
                                          std::vector<float>* out) {
  const ModelConfig& c = config_;
  const int world = w_.world;
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<float> mine(n * Vmax);
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(mine.data() + i * Vmax, local_logits.data() + int64_t{rows[i]} * Vmax,
                Vmax * sizeof(float));
  }
  std::vector<float> gathered(static_cast<size_t>(world) * n * Vmax);
  if (absl::Status s =
          comm_->AllGather(mine.data(), gathered.data(), mine.size() * sizeof(float), nullptr);
      !s.ok()) {
    return s;
  }
  out->assign(n * c.vocab_size, 0.0f);
  for (int k = 0; k < world; ++k) {
    const ShardRange vr = VocabShard(c.vocab_size, world, k);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(out->data() + i * c.vocab_size + vr.begin, gathered.data() + (k * n + i) * Vmax,
                  vr.size * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace verifyd::tp
