// Preset configs and their seeded counter-based weights.
#include "tp/presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/kv_fp8.h"
#include "kernels/weight_init.h"

namespace verifyd::tp {

std::vector<std::string> PresetNames() {
  return {"tiny", "small", "kimi-k2-attn", "tiny-moe", "kimi-k2", "deepseek-v3"};
}

namespace {

// The attention and dense-MLP dimensions every preset states.
struct PresetShape {
  int64_t vocab, hidden, layers, heads, q_lora, kv_lora, rope, nope, v, inter, max_positions;
};
// clang-format off
//                                        vocab hidden layers heads q_lora kv_lora rope nope    v  inter  max_pos
constexpr PresetShape kTinyShape       = {  512,   128,     2,    8,    64,     64,  16,  32,  32,   256,    4096};
constexpr PresetShape kSmallShape      = { 2048,   256,     4,   16,   128,    128,  32,  64,  64,   512,    8192};
constexpr PresetShape kKimiK2AttnShape = {32000,  7168,     2,   64,  1536,    512,  64, 128, 128, 18432,  262144};
// clang-format on

void SetShape(ModelConfig* c, const PresetShape& s) {
  c->vocab_size = s.vocab;
  c->hidden_size = s.hidden;
  c->num_hidden_layers = s.layers;
  c->num_attention_heads = s.heads;
  c->q_lora_rank = s.q_lora;
  c->kv_lora_rank = s.kv_lora;
  c->qk_rope_head_dim = s.rope;
  c->qk_nope_head_dim = s.nope;
  c->v_head_dim = s.v;
  c->intermediate_size = s.inter;
  c->max_position_embeddings = s.max_positions;
}

// What Kimi-K2 and DeepSeek-V3 share: the MLA shapes (hidden 7168, q_lora 1536, kv_lora 512,
// rope 64, nope 128, v 128), 61 layers, the dense MLP (18432) and routed experts (2048) with
// top-8 sigmoid noaux_tc routing and one shared expert, YaRN over 4096 original positions with
// mscale = mscale_all_dim = 1, and FP8 e4m3 weights in 128 x 128 blocks.
void SetDeepseekV3Architecture(ModelConfig* c) {
  c->hidden_size = 7168;
  c->num_hidden_layers = 61;
  c->q_lora_rank = 1536;
  c->kv_lora_rank = 512;
  c->qk_rope_head_dim = 64;
  c->qk_nope_head_dim = 128;
  c->v_head_dim = 128;
  c->intermediate_size = 18432;
  c->rms_norm_eps = 1e-6;
  c->tie_word_embeddings = false;
  c->moe.num_experts_per_tok = 8;
  c->moe.n_shared_experts = 1;
  c->moe.moe_intermediate_size = 2048;
  c->moe.moe_layer_freq = 1;
  c->moe.scoring_func = "sigmoid";
  c->moe.topk_method = "noaux_tc";
  c->moe.norm_topk_prob = true;
  c->rope_scaling.type = "yarn";
  c->rope_scaling.original_max_position_embeddings = 4096;
  c->rope_scaling.beta_slow = 1.0;
  c->rope_scaling.mscale = 1.0;
  c->rope_scaling.mscale_all_dim = 1.0;
  c->quant.method = "fp8";
  c->quant.fmt = "e4m3";
  c->quant.block_rows = 128;
  c->quant.block_cols = 128;
}

// Where Kimi-K2 and DeepSeek-V3 differ (their published config.json files).
struct PublishedDeepseekV3 {
  int64_t vocab, heads, max_positions;
  double rope_theta;
  int64_t routed_experts, first_k_dense_replace, n_group, topk_group;
  double routed_scaling_factor, yarn_factor, yarn_beta_fast;
  int64_t nextn_predict_layers;
};
// clang-format off
//                                            vocab heads max_pos rope_theta experts k_dense n_group topk_group scaling yarn beta_fast nextn
// moonshotai/Kimi-K2-Instruct.
constexpr PublishedDeepseekV3 kKimiK2     = {163840,  64, 131072,   50000.0,   384,     1,      1,         1,  2.827, 32.0,     1.0,   0};
// deepseek-ai/DeepSeek-V3 (its MTP layer is listed, not run).
constexpr PublishedDeepseekV3 kDeepseekV3 = {129280, 128, 163840,   10000.0,   256,     3,      8,         4,    2.5, 40.0,    32.0,   1};
// clang-format on

void SetPublished(ModelConfig* c, const PublishedDeepseekV3& p) {
  SetDeepseekV3Architecture(c);
  c->vocab_size = p.vocab;
  c->num_attention_heads = p.heads;
  c->max_position_embeddings = p.max_positions;
  c->rope_theta = p.rope_theta;
  c->moe.n_routed_experts = p.routed_experts;
  c->moe.first_k_dense_replace = p.first_k_dense_replace;
  c->moe.n_group = p.n_group;
  c->moe.topk_group = p.topk_group;
  c->moe.routed_scaling_factor = p.routed_scaling_factor;
  c->rope_scaling.factor = p.yarn_factor;
  c->rope_scaling.beta_fast = p.yarn_beta_fast;
  c->num_nextn_predict_layers = p.nextn_predict_layers;
}

}  // namespace

absl::StatusOr<ModelConfig> PresetConfig(const std::string& name, int64_t num_layers) {
  ModelConfig c;
  c.name = name;
  if (name == "tiny") {
    SetShape(&c, kTinyShape);
  } else if (name == "small") {
    SetShape(&c, kSmallShape);
  } else if (name == "kimi-k2-attn") {
    SetShape(&c, kKimiK2AttnShape);
    c.rope_theta = 50000.0;
  } else if (name == "tiny-moe") {
    // tiny's attention, one dense layer, then two MoE layers; YaRN.
    SetShape(&c, kTinyShape);
    c.num_hidden_layers = 3;
    c.moe.n_routed_experts = 16;
    c.moe.num_experts_per_tok = 4;
    c.moe.n_shared_experts = 1;
    c.moe.moe_intermediate_size = 64;
    c.moe.first_k_dense_replace = 1;
    c.moe.moe_layer_freq = 1;
    c.moe.n_group = 4;
    c.moe.topk_group = 2;
    c.moe.norm_topk_prob = true;
    c.moe.routed_scaling_factor = 2.5;
    c.rope_scaling.type = "yarn";
    c.rope_scaling.factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 1024;
    c.rope_scaling.beta_fast = 32.0;
    c.rope_scaling.beta_slow = 1.0;
    c.rope_scaling.mscale = 1.0;
    c.rope_scaling.mscale_all_dim = 0.8;  // != mscale: cos / sin and softmax both scaled
  } else if (name == "kimi-k2") {
    SetPublished(&c, kKimiK2);
  } else if (name == "deepseek-v3") {
    SetPublished(&c, kDeepseekV3);
  } else {
    return absl::NotFoundError(absl::StrCat("unknown preset '", name,
                                            "' (known: ", absl::StrJoin(PresetNames(), ", "), ")"));
  }
  if (num_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("preset layer count ", num_layers, " < 0"));
  }
  if (num_layers > 0) c.num_hidden_layers = num_layers;
  return c;
}

int64_t HostWeightBytes(const ModelConfig& config) {
  int64_t bytes = 0;
  for (const TensorSpec& spec : ModelTensorSpecs(config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    bytes += n * static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

absl::StatusOr<ModelWeights> GenerateRandomWeights(const ModelConfig& config, uint64_t seed) {
  if (absl::Status s = ValidateModelConfig(config); !s.ok()) return s;
  if (const int64_t bytes = HostWeightBytes(config); bytes > kMaxGeneratedHostWeightBytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "model '%s': generating its weights on the host takes %.1f GB of float32 (%d layers), "
        "above the %.1f GB limit of generated host weights (the CPU backend and preset "
        "checkpoints need them; the cuda backend generates each rank's slices on the device)",
        config.name, bytes / 1e9, config.num_hidden_layers, kMaxGeneratedHostWeightBytes / 1e9));
  }
  ModelWeights w;
  w.config = config;
  for (const TensorSpec& spec : ModelTensorSpecs(config)) {
    HostTensor t;
    t.shape = spec.shape;
    t.data.resize(t.numel());
    const uint64_t key = kernels::WeightTensorKey(seed, kernels::WeightNameHash(spec.name));
    if (IsFp8QuantizedWeight(config, spec.name)) {
      // As an FP8 checkpoint stores it: e4m3 codes times a block scale, read as float32.
      const float s = kernels::WeightFp8Scale(spec.init_scale);
      for (size_t i = 0; i < t.data.size(); ++i) {
        const uint8_t code = kernels::Fp8E4m3FromFloat(kernels::WeightFp8Input(key, i));
        t.data[i] = kernels::Fp8E4m3ToFloat(code) * s;
      }
    } else {
      for (size_t i = 0; i < t.data.size(); ++i) {
        t.data[i] = kernels::WeightValue(key, i, spec.init_scale, spec.init_offset);
      }
    }
    w.tensors.emplace(spec.name, std::move(t));
  }
  return w;
}

absl::StatusOr<ModelWeights> MakePresetWeights(const std::string& name, uint64_t seed,
                                               int64_t num_layers) {
  absl::StatusOr<ModelConfig> c = PresetConfig(name, num_layers);
  if (!c.ok()) return c.status();
  return GenerateRandomWeights(*c, seed);
}

absl::Status WritePresetToDirectory(const std::string& name, uint64_t seed, const std::string& dir,
                                    int64_t max_shard_bytes) {
  absl::StatusOr<ModelWeights> w = MakePresetWeights(name, seed);
  if (!w.ok()) return w.status();
  return WriteModelToDirectory(*w, dir, SafetensorsDType::kBF16, max_shard_bytes);
}

}  // namespace verifyd::tp
