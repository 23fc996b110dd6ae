// The per-GPU memory plan: the CUDA engine's allocations (tp/cuda/rank_context.cc) as
// arithmetic.
#include "tp/memory_plan.h"

#include <algorithm>
#include <climits>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/kv_fp8.h"
#include "kernels/verify_attention.h"
#include "tp/checkpoint_reader.h"
#include "tp/presets.h"
#include "tp/sharding.h"

namespace verifyd::tp {
namespace {

constexpr int64_t kBf16 = 2, kF32 = 4, kI32 = 4;
constexpr int64_t kCublasWorkspaceBytes = int64_t{32} << 20;  // InitRankContext's kCublasWs
constexpr int64_t kArgmaxPairBytes = 8;                       // kernels/cuda/sampling/argmax.h
constexpr int64_t kMoePermuteChunk = 256;                     // kernels/cuda/moe/moe.cu

double Gb(int64_t bytes) { return static_cast<double>(bytes) / 1e9; }

// e4m3 bytes of a [rows, cols] linear plus its fp32 128 x 128 block scales (the batch-invariant
// scale layout: cols / 128 a row).
int64_t Fp8LinearBytes(int64_t rows, int64_t cols) {
  return rows * cols + (rows + 127) / 128 * (cols / 128) * kF32;
}

// A SwiGLU MLP's [gate | up] and down with `inter` intermediate columns, FP8 or bf16.
int64_t MlpBytes(int64_t hid, int64_t inter, bool fp8) {
  if (inter <= 0) return 0;
  if (fp8) return Fp8LinearBytes(2 * inter, hid) + Fp8LinearBytes(hid, inter);
  return 3 * inter * hid * kBf16;
}

bool Aligned128(const ShardRange& r) {
  return r.size > 0 && r.size % 128 == 0 && r.begin % 128 == 0;
}

absl::Status Invalid(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("memory plan: '", field, "' ", why));
}

absl::Status ValidateOptions(const ModelConfig& c, const MemoryPlanOptions& o) {
  if (o.tp < 1) return Invalid("tp", absl::StrCat("must be >= 1, got ", o.tp));
  if (absl::Status s = ValidateTpSize(c, o.tp); !s.ok()) return s;
  if (o.rank < 0 || o.rank >= o.tp) {
    return Invalid("rank", absl::StrCat("must be in [0, tp = ", o.tp, "), got ", o.rank));
  }
  if (o.max_batch < 1) return Invalid("max_batch", absl::StrCat("must be >= 1, got ", o.max_batch));
  if (o.max_tail_rows < 1 || o.max_tail_rows > kernels::kMaxTailRows) {
    return Invalid("max_tail_rows", absl::StrCat("must be in [1, ", kernels::kMaxTailRows,
                                                 "], got ", o.max_tail_rows));
  }
  if (o.max_context < 0) {
    return Invalid("max_context", absl::StrCat("must be >= 0, got ", o.max_context));
  }
  if (o.kv_slots < 0 || o.kv_slots > INT32_MAX) {
    return Invalid("kv_slots", absl::StrCat("must be in [0, 2^31), got ", o.kv_slots));
  }
  if (o.device_memory_bytes <= 0) {
    return Invalid("device_memory_bytes", absl::StrCat("must be > 0, got ", o.device_memory_bytes));
  }
  if (!(o.reserve_fraction >= 0 && o.reserve_fraction < 1)) {
    return Invalid("reserve_fraction", absl::StrCat("must be in [0, 1), got ", o.reserve_fraction));
  }
  if (o.positional_max_splits < 1 || o.positional_max_splits > 256) {
    return Invalid("positional_max_splits",
                   absl::StrCat("must be in [1, 256], got ", o.positional_max_splits));
  }
  if (o.positional_partial_rows < 4096) {
    return Invalid("positional_partial_rows",
                   absl::StrCat("must be >= 4096, got ", o.positional_partial_rows));
  }
  if (o.fp8_staging_keys < 0) {
    return Invalid("fp8_staging_keys", absl::StrCat("must be >= 0, got ", o.fp8_staging_keys));
  }
  return absl::OkStatus();
}

int64_t SumParts(const std::vector<MemoryPart>& parts) {
  int64_t total = 0;
  for (const MemoryPart& p : parts) total += p.bytes;
  return total;
}

int64_t FindPart(const std::vector<MemoryPart>& parts, const std::string& name) {
  for (const MemoryPart& p : parts) {
    if (p.name == name) return p.bytes;
  }
  return 0;
}

// The rank's slices and counts (InitRankContext's sharding and path choices).
struct RankShape {
  ShardRange heads, vocab, inter, erows, moe_inter, shared;
  int64_t Hl = 0, h0 = 0, Il = 0, vmax = 0, El = 0, Iel = 0, Sl = 0;
  int64_t moe_layers = 0, dense_layers = 0;
};

RankShape RankShapeOf(const ModelConfig& c, const MemoryPlanOptions& o) {
  const int tp = o.tp, rank = o.rank;
  const int64_t E = c.moe.n_routed_experts;
  RankShape r;
  r.heads = HeadShard(c.num_attention_heads, tp, rank);
  r.vocab = VocabShard(c.vocab_size, tp, rank);
  r.inter = IntermediateShard(c.intermediate_size, tp, rank);
  r.erows = tp > 1 ? r.vocab : ShardRange{0, c.vocab_size};
  r.Hl = r.heads.size;
  r.h0 = r.heads.begin;
  r.Il = r.inter.size;
  r.vmax = CeilShardMax(c.vocab_size, tp);
  const bool ep = o.expert_parallel && tp > 1 && E > 0 && E % tp == 0;
  r.El = ep ? E / tp : E;
  r.moe_inter = ep ? ShardRange{0, c.moe.moe_intermediate_size}
                   : IntermediateShard(c.moe.moe_intermediate_size, tp, rank);
  r.shared = IntermediateShard(c.moe.moe_intermediate_size * c.moe.n_shared_experts, tp, rank);
  r.Iel = r.moe_inter.size;
  r.Sl = r.shared.size;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) r.moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  r.dense_layers = c.num_hidden_layers - r.moe_layers;
  return r;
}

// Which FP8-stored weights stay FP8 (Fp8WeightsCanStayFp8, ChooseFp8Attention, ChooseFp8Mlps,
// ChooseExpertPath on sm_90) into p's fp8_* fields.
void PlanFp8Choices(const ModelConfig& c, const MemoryPlanOptions& o, const RankShape& r,
                    MemoryPlan& p) {
  const int64_t hid = c.hidden_size, ql = c.q_lora_rank, qk = c.qk_head_dim(), v = c.v_head_dim;
  const bool fp8_ok = o.fp8_weights && c.quant.method == "fp8" && c.quant.block_rows == 128 &&
                      c.quant.block_cols == 128 && hid % 128 == 0;
  p.fp8_attention = fp8_ok && c.num_hidden_layers > 0 && r.Hl > 0 && ql % 128 == 0 &&
                    (r.Hl * qk) % 128 == 0 && (r.h0 * qk) % 128 == 0 && (r.Hl * v) % 128 == 0 &&
                    (r.h0 * v) % 128 == 0;
  p.fp8_dense = fp8_ok && r.dense_layers > 0 && Aligned128(r.inter);
  p.fp8_shared = fp8_ok && r.moe_layers > 0 && Aligned128(r.shared);
  p.fp8_experts =
      fp8_ok && r.moe_layers > 0 && r.Iel > 0 && r.Iel % 128 == 0 && r.moe_inter.begin % 128 == 0;
}

// The weight shard by part (rank_weights.cc FillRankWeights) into p.weights / weight_bytes.
void PlanWeights(const ModelConfig& c, const MemoryPlanOptions& o, const RankShape& r,
                 MemoryPlan& p) {
  const int tp = o.tp;
  const int64_t hid = c.hidden_size, ql = c.q_lora_rank, qk = c.qk_head_dim();
  const int64_t nope = c.qk_nope_head_dim, v = c.v_head_dim, kvl = c.kv_lora_rank;
  const int64_t lat = c.latent_dim(), L = c.num_hidden_layers, E = c.moe.n_routed_experts;
  const int64_t Hl = r.Hl, Il = r.Il, El = r.El, Iel = r.Iel, Sl = r.Sl;
  const int64_t moe_layers = r.moe_layers, dense_layers = r.dense_layers;
  const ShardRange& vocab = r.vocab;
  const ShardRange& erows = r.erows;
  const int64_t na = ql + (lat + 127) / 128 * 128, qin = ql > 0 ? ql : hid;
  int64_t attn_layer = Hl * (nope + v) * kvl * kBf16;  // kv_b: always bf16
  if (p.fp8_attention) {
    attn_layer +=
        Fp8LinearBytes(na, hid) + Fp8LinearBytes(Hl * qk, qin) + Fp8LinearBytes(hid, Hl * v);
  } else {
    attn_layer += (ql > 0 ? ql * hid + Hl * qk * ql : Hl * qk * hid) * kBf16 + lat * hid * kBf16 +
                  hid * Hl * v * kBf16;
  }
  const int64_t norms_layer = (2 * hid + (ql > 0 ? ql : 0) + kvl) * kBf16;
  const int64_t dense_layer = MlpBytes(hid, Il, p.fp8_dense);
  const int64_t expert_bytes =
      Iel <= 0 ? 0
               : (p.fp8_experts ? Fp8LinearBytes(2 * Iel, hid) + Fp8LinearBytes(hid, Iel)
                                : 3 * Iel * hid * kBf16);
  const int64_t shared_layer = MlpBytes(hid, Sl, p.fp8_shared);
  const int64_t router_layer = E * hid * kF32 + E * kF32;
  const bool tied_share = vocab.size > 0 && c.tie_word_embeddings && erows == vocab;
  const int64_t lm_head = vocab.size > 0 && !tied_share ? vocab.size * hid * kBf16 : 0;
  auto per = [](int64_t n, const char* what, int64_t each) {
    return absl::StrFormat("%d %s x %.4f GB", n, what, Gb(each));
  };
  p.weights = {
      {"embedding", erows.size * hid * kBf16,
       absl::StrCat(erows.size, " vocab rows, bf16", tp > 1 ? " (the lm_head's rows)" : "")},
      {"attention", L * attn_layer,
       absl::StrCat(per(L, "layers", attn_layer), ", ", Hl, " heads",
                    p.fp8_attention ? ", FP8 but kv_b" : ", bf16")},
      {"dense_mlp", dense_layers * dense_layer,
       absl::StrCat(per(dense_layers, "layers", dense_layer), ", ", Il, " columns",
                    p.fp8_dense ? ", FP8" : ", bf16")},
      {"routed_experts", moe_layers * El * expert_bytes,
       absl::StrCat(per(moe_layers * El, "experts", expert_bytes), " (", El, " a layer, ", Iel,
                    " columns", p.fp8_experts ? ", FP8" : ", bf16", ")")},
      {"shared_experts", moe_layers * shared_layer,
       absl::StrCat(per(moe_layers, "layers", shared_layer), ", ", Sl, " columns",
                    p.fp8_shared ? ", FP8" : ", bf16")},
      {"router", moe_layers * router_layer, per(moe_layers, "layers", router_layer) + ", fp32"},
      {"norms", L * norms_layer + hid * kBf16, absl::StrCat(L, " layers + the final norm, bf16")},
      {"lm_head", lm_head,
       tied_share ? std::string("tied: the embedding slice")
                  : absl::StrCat(vocab.size, " vocab rows, bf16")},
  };
  p.weight_bytes = SumParts(p.weights);
}

// Activations and workspaces for R rows (InitRankContext, AllocMoeBuffers, AllocFp8Buffers)
// into p.buffers / buffer_bytes.
void PlanBuffers(const ModelConfig& c, const MemoryPlanOptions& o, const RankShape& r,
                 MemoryPlan& p) {
  const int tp = o.tp;
  const int64_t hid = c.hidden_size, ql = c.q_lora_rank, qk = c.qk_head_dim();
  const int64_t v = c.v_head_dim, kvl = c.kv_lora_rank, lat = c.latent_dim();
  const int64_t rope = c.qk_rope_head_dim, E = c.moe.n_routed_experts;
  const int64_t K = c.moe.num_experts_per_tok;
  const int64_t Hl = r.Hl, Il = r.Il, Iel = r.Iel, Sl = r.Sl, vmax = r.vmax;
  const int64_t na = ql + (lat + 127) / 128 * 128;
  const int64_t R = static_cast<int64_t>(o.max_batch) * o.max_tail_rows;
  const int64_t R4 = (R + 3) / 4 * 4;  // kc::Fp8LtRows
  const int64_t B = o.max_batch, Ilm = std::max<int64_t>(Il, 1);
  int64_t act = R * hid * (kF32 + kBf16) + R * Hl * qk * kBf16 + R * Hl * lat * kBf16 +
                R * Hl * kvl * kBf16 + R * Hl * v * kBf16 + R4 * hid * kF32 + R4 * 2 * Ilm * kF32 +
                R * Ilm * kBf16 + R * vmax * kF32 + R * rope * kF32 + rope / 2 * kF32 +
                R * (1 + tp) * kArgmaxPairBytes + 4 * R * kI32 + 2 * B * kI32;
  if (ql > 0) act += R * ql * (p.fp8_attention ? kBf16 : kF32 + kBf16);
  if (!p.fp8_attention) act += R * lat * kF32;
  int64_t moe = 0;
  if (r.moe_layers > 0) {
    const int64_t P = R * K;
    moe = R * hid * kF32 + R * E * kF32 + 4 * P * kI32 + (E + 1) * kI32 +
          std::max<int64_t>((P + kMoePermuteChunk - 1) / kMoePermuteChunk, 1) * E * kI32 +
          P * hid * kBf16 + std::max(P * 2 * Iel, R4 * 2 * Sl) * kF32 +
          std::max(P * Iel, R * Sl) * kBf16 + P * hid * kF32 + R4 * hid * kF32;
    if (p.fp8_experts) moe += P * hid + P * hid / 128 * kF32 + P * Iel + P * Iel / 128 * kF32;
  }
  int64_t fp8 = 0;
  const int64_t fp8_inter = std::max(p.fp8_dense ? Il : 0, p.fp8_shared ? Sl : 0);
  if (fp8_inter > 0 || p.fp8_attention) {
    const int64_t xq_cols = p.fp8_attention ? std::max({hid, ql, Hl * v}) : hid;
    fp8 = 2 * kI32 + R4 * xq_cols + R4 * xq_cols / 128 * kF32;
    if (fp8_inter > 0) fp8 += R4 * fp8_inter + R4 * fp8_inter / 128 * kF32;
    if (p.fp8_attention) fp8 += R4 * na * kF32 + R4 * Hl * qk * kF32;
  }
  using VaWorkspace = kernels::cuda::VerifyAttentionWorkspace;
  const int64_t verify_ws = static_cast<int64_t>(
      (o.batch_invariant ? VaWorkspace::PositionalCapacity(R, Hl, o.positional_max_splits,
                                                           o.positional_partial_rows)
                         : VaWorkspace::DefaultCapacity(o.kv_fp8 ? o.fp8_staging_keys : 0))
          .CapacityBytes());
  const int64_t reduce = o.batch_invariant && tp > 1 ? tp * R * hid * kF32 : 0;
  const int64_t gather = o.sampling && tp > 1 ? tp * R * vmax * kF32 : 0;
  p.buffers = {
      {"activations", act, absl::StrCat(R, " rows (", o.max_batch, " x ", o.max_tail_rows, ")")},
      {"moe_buffers", moe, absl::StrCat(R * K, " routed pairs")},
      {"fp8_buffers", fp8, "quantized linear inputs and FP8 GEMM outputs"},
      {"cublas_workspace", kCublasWorkspaceBytes, "fixed"},
      {"verify_attention_workspace", verify_ws,
       o.batch_invariant
           ? absl::StrCat("positional plans: ", o.positional_partial_rows, " partial rows")
           : absl::StrCat("default capacity",
                          o.kv_fp8 ? absl::StrCat(" + ", o.fp8_staging_keys, " staged keys") : "")},
      {"rank_order_reduce", reduce, "NCCL gather of the layer sums (batch-invariant, tp > 1)"},
      {"logits_gather", gather, "all-gathered logits of sampling / logprobs (on first use)"},
  };
  p.buffer_bytes = SumParts(p.buffers);
}

// KV bytes a token, the tokens that fit beside the weights, workspaces and reserve, and
// whether the requested pool fits (p.fit).
void PlanKv(const ModelConfig& c, const MemoryPlanOptions& o, MemoryPlan& p) {
  const int tp = o.tp, rank = o.rank;
  const int64_t kvl = c.kv_lora_rank, lat = c.latent_dim(), rope = c.qk_rope_head_dim;
  const int64_t L = c.num_hidden_layers;
  const int64_t row =
      o.kv_fp8 ? kernels::KvFp8RowBytes(kvl, rope, kernels::kKvFp8Group) : lat * kBf16;
  p.kv_bytes_per_token = L * row;
  p.reserve_bytes = static_cast<int64_t>(o.reserve_fraction * o.device_memory_bytes);
  const int64_t left = o.device_memory_bytes - p.weight_bytes - p.buffer_bytes - p.reserve_bytes;
  p.kv_capacity_tokens = left > 0 ? std::min<int64_t>(INT32_MAX, left / p.kv_bytes_per_token) : 0;
  p.kv_tokens = o.kv_slots > 0 ? o.kv_slots : p.kv_capacity_tokens;
  p.max_context = o.max_context == 0 ? c.max_position_embeddings
                                     : std::min(o.max_context, c.max_position_embeddings);
  if (o.kv_slots == 0 && p.kv_capacity_tokens < 1) {
    p.fit = absl::ResourceExhaustedError(absl::StrFormat(
        "memory plan for %s at tp %d (rank %d): weights %.1f GB + workspaces %.1f GB leave no "
        "room for the KV pool (%d bytes a token) in the device's %.1f GB (%.1f GB kept in reserve)",
        c.name, tp, rank, Gb(p.weight_bytes), Gb(p.buffer_bytes), p.kv_bytes_per_token,
        Gb(o.device_memory_bytes), Gb(p.reserve_bytes)));
  } else if (p.kv_tokens > p.kv_capacity_tokens) {
    p.fit = absl::ResourceExhaustedError(absl::StrFormat(
        "memory plan for %s at tp %d (rank %d): weights %.1f GB + workspaces %.1f GB + requested "
        "KV %.1f GB exceed the device's %.1f GB (%.1f GB kept in reserve; KV: %d tokens x %d "
        "bytes requested, %d fit)",
        c.name, tp, rank, Gb(p.weight_bytes), Gb(p.buffer_bytes),
        Gb(p.kv_tokens * p.kv_bytes_per_token), Gb(o.device_memory_bytes), Gb(p.reserve_bytes),
        p.kv_tokens, p.kv_bytes_per_token, p.kv_capacity_tokens));
  }
}

}  // namespace

int64_t MemoryPlan::WeightBytes(const std::string& part) const { return FindPart(weights, part); }
int64_t MemoryPlan::BufferBytes(const std::string& part) const { return FindPart(buffers, part); }

absl::StatusOr<MemoryPlan> PlanRankMemory(const ModelConfig& c, const MemoryPlanOptions& o) {
  if (absl::Status s = ValidateModelConfig(c); !s.ok()) return s;
  if (absl::Status s = ValidateOptions(c, o); !s.ok()) return s;
  MemoryPlan p;
  p.config = c;
  p.options = o;
  const RankShape r = RankShapeOf(c, o);
  p.local_heads = r.Hl;
  p.local_experts = r.moe_layers > 0 ? r.El : 0;
  p.vocab_rows = r.vocab.size;
  PlanFp8Choices(c, o, r, p);
  PlanWeights(c, o, r, p);
  PlanBuffers(c, o, r, p);
  PlanKv(c, o, p);
  return p;
}

MemoryPlanOptions MemoryPlanOptionsOf(const EngineOptions& e, int64_t device_memory_bytes) {
  MemoryPlanOptions o;
  o.tp = e.tp;
  o.expert_parallel = e.cuda.expert_parallel;
  o.fp8_weights = e.cuda.fp8_experts;
  o.kv_fp8 = e.kv_dtype == KvDtype::kFp8;
  o.max_batch = e.limits.max_batch;
  o.max_tail_rows = e.limits.max_tail_rows;
  o.max_context = e.limits.max_context;
  o.batch_invariant = e.cuda.batch_invariant;
  o.positional_max_splits = e.cuda.positional_max_splits;
  o.positional_partial_rows = e.cuda.positional_partial_rows;
  o.fp8_staging_keys = e.cuda.fp8_staging_keys;
  o.kv_slots = e.kv_slots;
  o.device_memory_bytes = device_memory_bytes;
  return o;
}

absl::StatusOr<ModelConfig> ModelConfigOf(const std::string& model, int64_t preset_layers) {
  const std::vector<std::string> presets = PresetNames();
  if (std::find(presets.begin(), presets.end(), model) != presets.end()) {
    return PresetConfig(model, preset_layers);
  }
  if (!std::filesystem::exists(std::filesystem::path(model) / "config.json")) {
    return absl::InvalidArgumentError(absl::StrCat("model '", model, "' is neither a preset (",
                                                   absl::StrJoin(presets, ", "),
                                                   ") nor a directory with a config.json"));
  }
  return ReadCheckpointConfig(model);
}

std::string FormatMemoryPlan(const MemoryPlan& p) {
  const MemoryPlanOptions& o = p.options;
  std::string s = absl::StrFormat(
      "memory plan (computed, not measured): %s, rank %d of tp %d, %d heads, %d vocab rows, %d "
      "routed experts a MoE layer%s; KV %s; %d x %d rows a step; device %.1f GB\n",
      p.config.name, o.rank, o.tp, p.local_heads, p.vocab_rows, p.local_experts,
      o.expert_parallel && p.local_experts > 0 && p.local_experts < p.config.moe.n_routed_experts
          ? " (expert parallel)"
          : "",
      o.kv_fp8 ? "fp8" : "bf16", o.max_batch, o.max_tail_rows, Gb(o.device_memory_bytes));
  auto line = [&s](const std::string& name, int64_t bytes, const std::string& detail) {
    absl::StrAppendFormat(&s, "  %-28s %10.3f GB  %s\n", name, Gb(bytes), detail);
  };
  s += "weights\n";
  for (const MemoryPart& part : p.weights) line(part.name, part.bytes, part.detail);
  line("total weights", p.weight_bytes, "");
  s += "activations and workspaces\n";
  for (const MemoryPart& part : p.buffers) line(part.name, part.bytes, part.detail);
  line("total workspaces", p.buffer_bytes, "");
  line("reserve", p.reserve_bytes,
       absl::StrFormat("%.0f%% of the device: CUDA context, NCCL, cuBLAS, allocator (estimate)",
                       100 * o.reserve_fraction));
  s += "kv cache\n";
  line("kv bytes a token", p.kv_bytes_per_token,
       absl::StrCat(p.kv_bytes_per_token, " bytes (", p.config.num_hidden_layers, " layers x ",
                    p.kv_bytes_per_token / std::max<int64_t>(p.config.num_hidden_layers, 1), ")"));
  line("kv capacity", p.kv_capacity_tokens * p.kv_bytes_per_token,
       absl::StrCat(p.kv_capacity_tokens, " tokens fit"));
  if (o.kv_slots > 0) {
    line("kv requested", o.kv_slots * p.kv_bytes_per_token,
         absl::StrCat(o.kv_slots, " tokens (--kv_slots)"));
  }
  absl::StrAppendFormat(&s, "max context %d tokens a request\n", p.max_context);
  s += p.fit.ok() ? "fits\n" : absl::StrCat("does not fit: ", p.fit.message(), "\n");
  return s;
}

}  // namespace verifyd::tp
