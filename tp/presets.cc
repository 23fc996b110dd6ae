// Preset configs and their seeded counter-based weights.
#include "tp/presets.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/kv_fp8.h"
#include "kernels/weight_init.h"

namespace verifyd::tp {

namespace {

// The attention and dense-MLP dimensions every preset states.
struct PresetShape {
  int64_t vocab, hidden, layers, heads, q_lora, kv_lora, rope, nope, v, inter, max_positions;
};

// One preset: its dimensions, rope_theta, MLP stack, RoPE scaling, weight quantization and
// MTP layers. rms_norm_eps (1e-6) and untied embeddings are ModelConfig's defaults in each.
struct Preset {
  const char* name;
  PresetShape shape;
  double rope_theta;
  MoeConfig moe;             // n_routed_experts 0: every layer dense
  RopeScaling rope_scaling;  // type "": plain RoPE
  QuantConfig quant;         // method "": bf16 / fp32 weights
  int64_t nextn_predict_layers;
};

// Every preset, in PresetNames() order (tp/presets.h describes each). Kimi-K2 and DeepSeek-V3
// share the architecture: the MLA shapes, 61 layers, the dense MLP (18432) and routed experts
// (2048) with top-8 sigmoid noaux_tc routing and one shared expert, YaRN over 4096 original
// positions with mscale = mscale_all_dim = 1, and FP8 e4m3 weights in 128 x 128 blocks; they
// differ where their published config.json files do.
std::vector<Preset> Presets() {
  // clang-format off
  //                                         vocab hidden layers heads q_lora kv_lora rope nope    v  inter  max_pos
  constexpr PresetShape kTinyShape       = {   512,   128,     2,    8,    64,     64,  16,  32,  32,   256,    4096};
  constexpr PresetShape kSmallShape      = {  2048,   256,     4,   16,   128,    128,  32,  64,  64,   512,    8192};
  constexpr PresetShape kKimiK2AttnShape = { 32000,  7168,     2,   64,  1536,    512,  64, 128, 128, 18432,  262144};
  // tiny's attention, one dense layer, then two MoE layers.
  constexpr PresetShape kTinyMoeShape    = {   512,   128,     3,    8,    64,     64,  16,  32,  32,   256,    4096};
  // moonshotai/Kimi-K2-Instruct.
  constexpr PresetShape kKimiK2Shape     = {163840,  7168,    61,   64,  1536,    512,  64, 128, 128, 18432,  131072};
  // deepseek-ai/DeepSeek-V3 (its MTP layer is listed, not run).
  constexpr PresetShape kDeepseekV3Shape = {129280,  7168,    61,  128,  1536,    512,  64, 128, 128, 18432,  163840};
  //                                experts  top_k  shared  inter  k_dense  freq    scoring  topk_method  n_group  topk_group  norm  scaling
  const MoeConfig kTinyMoe       = {     16,     4,      1,    64,       1,    1, "sigmoid",  "noaux_tc",       4,          2, true,     2.5};
  const MoeConfig kKimiK2Moe     = {    384,     8,      1,  2048,       1,    1, "sigmoid",  "noaux_tc",       1,          1, true,   2.827};
  const MoeConfig kDeepseekV3Moe = {    256,     8,      1,  2048,       3,    1, "sigmoid",  "noaux_tc",       8,          4, true,     2.5};
  // YaRN; tiny-moe's mscale_all_dim != mscale: cos / sin and softmax both scaled.
  //                                     type  factor  original  beta_fast  beta_slow  mscale  mscale_all_dim
  const RopeScaling kTinyYarn       = {"yarn",    4.0,     1024,      32.0,       1.0,    1.0,            0.8};
  const RopeScaling kKimiK2Yarn     = {"yarn",   32.0,     4096,       1.0,       1.0,    1.0,            1.0};
  const RopeScaling kDeepseekV3Yarn = {"yarn",   40.0,     4096,      32.0,       1.0,    1.0,            1.0};
  const QuantConfig kFp8 = {"fp8", "e4m3", 128, 128};
  return {
    //  name           shape             theta    moe             rope_scaling     quant          nextn
      {"tiny",         kTinyShape,       10000.0, MoeConfig(),    RopeScaling(),   QuantConfig(), 0},
      {"small",        kSmallShape,      10000.0, MoeConfig(),    RopeScaling(),   QuantConfig(), 0},
      {"kimi-k2-attn", kKimiK2AttnShape, 50000.0, MoeConfig(),    RopeScaling(),   QuantConfig(), 0},
      {"tiny-moe",     kTinyMoeShape,    10000.0, kTinyMoe,       kTinyYarn,       QuantConfig(), 0},
      {"kimi-k2",      kKimiK2Shape,     50000.0, kKimiK2Moe,     kKimiK2Yarn,     kFp8,          0},
      {"deepseek-v3",  kDeepseekV3Shape, 10000.0, kDeepseekV3Moe, kDeepseekV3Yarn, kFp8,          1},
  };
  // clang-format on
}

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

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const Preset& p : Presets()) names.push_back(p.name);
  return names;
}

absl::StatusOr<ModelConfig> PresetConfig(const std::string& name, int64_t num_layers) {
  const std::vector<Preset> presets = Presets();
  auto p = std::find_if(presets.begin(), presets.end(),
                        [&](const Preset& preset) { return name == preset.name; });
  if (p == presets.end()) {
    return absl::NotFoundError(absl::StrCat("unknown preset '", name,
                                            "' (known: ", absl::StrJoin(PresetNames(), ", "), ")"));
  }
  if (num_layers < 0) {
    return absl::InvalidArgumentError(absl::StrCat("preset layer count ", num_layers, " < 0"));
  }
  ModelConfig c;
  c.name = name;
  SetShape(&c, p->shape);
  c.rope_theta = p->rope_theta;
  c.moe = p->moe;
  c.rope_scaling = p->rope_scaling;
  c.quant = p->quant;
  c.num_nextn_predict_layers = p->nextn_predict_layers;
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
