// ModelConfig JSON: round trip, Hugging Face keys, rejection of unsupported features.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tp/cpu/cpu_engine.h"
#include "tp/engine_options.h"
#include "tp/model_config.h"
#include "tp/presets.h"
#include "tp/sharding.h"

namespace verifyd::tp {
namespace {

using json = nlohmann::json;

// `c` through its JSON form and back: every field, the MoE, YaRN and quantization ones too,
// comes back the same.
void ExpectRoundTrips(const ModelConfig& c, const std::string& name) {
  SCOPED_TRACE(name);
  absl::StatusOr<ModelConfig> back = ParseModelConfigJson(ModelConfigToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->vocab_size, c.vocab_size);
  EXPECT_EQ(back->hidden_size, c.hidden_size);
  EXPECT_EQ(back->num_hidden_layers, c.num_hidden_layers);
  EXPECT_EQ(back->num_attention_heads, c.num_attention_heads);
  EXPECT_EQ(back->q_lora_rank, c.q_lora_rank);
  EXPECT_EQ(back->kv_lora_rank, c.kv_lora_rank);
  EXPECT_EQ(back->qk_nope_head_dim, c.qk_nope_head_dim);
  EXPECT_EQ(back->qk_rope_head_dim, c.qk_rope_head_dim);
  EXPECT_EQ(back->v_head_dim, c.v_head_dim);
  EXPECT_EQ(back->intermediate_size, c.intermediate_size);
  EXPECT_EQ(back->rms_norm_eps, c.rms_norm_eps);
  EXPECT_EQ(back->rope_theta, c.rope_theta);
  EXPECT_EQ(back->max_position_embeddings, c.max_position_embeddings);
  EXPECT_EQ(back->tie_word_embeddings, c.tie_word_embeddings);
  EXPECT_EQ(back->latent_dim(), c.kv_lora_rank + c.qk_rope_head_dim);
  const MoeConfig &a = c.moe, &b = back->moe;
  EXPECT_EQ(b.n_routed_experts, a.n_routed_experts);
  EXPECT_EQ(b.num_experts_per_tok, a.num_experts_per_tok);
  EXPECT_EQ(b.n_shared_experts, a.n_shared_experts);
  EXPECT_EQ(b.moe_intermediate_size, a.moe_intermediate_size);
  EXPECT_EQ(b.first_k_dense_replace, a.first_k_dense_replace);
  EXPECT_EQ(b.moe_layer_freq, a.moe_layer_freq);
  EXPECT_EQ(b.n_group, a.n_group);
  EXPECT_EQ(b.topk_group, a.topk_group);
  EXPECT_EQ(b.norm_topk_prob, a.norm_topk_prob);
  EXPECT_EQ(b.routed_scaling_factor, a.routed_scaling_factor);
  const RopeScaling &r = c.rope_scaling, &rb = back->rope_scaling;
  EXPECT_EQ(rb.type, r.type);
  EXPECT_EQ(rb.factor, r.factor);
  EXPECT_EQ(rb.original_max_position_embeddings, r.original_max_position_embeddings);
  EXPECT_EQ(rb.beta_fast, r.beta_fast);
  EXPECT_EQ(rb.beta_slow, r.beta_slow);
  EXPECT_EQ(rb.mscale, r.mscale);
  EXPECT_EQ(rb.mscale_all_dim, r.mscale_all_dim);
  EXPECT_EQ(back->quant.method, c.quant.method);
  EXPECT_EQ(back->quant.block_rows, c.quant.block_rows);
  EXPECT_EQ(back->quant.block_cols, c.quant.block_cols);
  EXPECT_EQ(back->num_nextn_predict_layers, c.num_nextn_predict_layers);
  EXPECT_EQ(ModelConfigToJson(*back), ModelConfigToJson(c)) << name;
}

TEST(ModelConfig, RoundTripOfEveryPreset) {
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<ModelConfig> c = PresetConfig(name);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(ValidateModelConfig(*c).ok());
    ExpectRoundTrips(*c, name);
  }
}

TEST(ModelConfig, PresetShapes) {
  absl::StatusOr<ModelConfig> k = PresetConfig("kimi-k2-attn", 3);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->num_hidden_layers, 3);
  EXPECT_EQ(k->latent_dim(), 576);
  EXPECT_EQ(k->num_attention_heads, 64);
  EXPECT_EQ(k->hidden_size, 7168);
  // The checkpoint tensors of the Kimi-K2 attention shapes.
  for (const TensorSpec& spec : ModelTensorSpecs(*k)) {
    if (spec.name == "model.layers.0.self_attn.q_b_proj.weight") {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{64 * 192, 1536}));
    } else if (spec.name == "model.layers.0.self_attn.kv_a_proj_with_mqa.weight") {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{576, 7168}));
    } else if (spec.name == "model.layers.0.self_attn.kv_b_proj.weight") {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{64 * 256, 512}));
    } else if (spec.name == "model.layers.0.self_attn.o_proj.weight") {
      EXPECT_EQ(spec.shape, (std::vector<int64_t>{7168, 64 * 128}));
    }
  }
  EXPECT_EQ(ModelTensorSpecs(*k).size(), 2u + 3u * 12u + 1u);
  absl::StatusOr<ModelConfig> t = PresetConfig("tiny");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->num_attention_heads % 8, 0);
  EXPECT_EQ(PresetConfig("nope").status().code(), absl::StatusCode::kNotFound);
}

// A DeepSeek-V3-like config.json (dense): the keys the real file has, plus unknown ones.
json DenseConfig() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": null,
    "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
    "intermediate_size": 96, "rms_norm_eps": 1e-5, "rope_theta": 50000,
    "max_position_embeddings": 1024, "tie_word_embeddings": true, "rope_scaling": null,
    "n_routed_experts": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
    "torch_dtype": "bfloat16"})");
}

TEST(ModelConfig, ParsesHuggingFaceKeys) {
  absl::StatusOr<ModelConfig> c = ParseModelConfigJson(DenseConfig().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->vocab_size, 1000);
  EXPECT_EQ(c->q_lora_rank, 0);  // null = plain q_proj
  EXPECT_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope_theta, 50000);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->qk_head_dim(), 24);
}

// DeepSeek-V3's published config.json (deepseek-ai/DeepSeek-V3), transformers <= 4 keys.
json DeepSeekV3Config() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
    "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
    "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "seq_aux": true, "tie_word_embeddings": false, "topk_group": 4,
    "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.33.1",
    "use_cache": true, "v_head_dim": 128, "vocab_size": 129280})");
}

// Kimi-K2's published config.json (moonshotai/Kimi-K2-Instruct): DeepSeek-V3's with these
// keys changed, pretraining_tp added and the null ones absent.
json KimiK2Config() {
  json j = DeepSeekV3Config();
  j.merge_patch(json::parse(R"({
    "attention_bias": null, "attention_dropout": null, "ep_size": null,
    "bos_token_id": 163584, "eos_token_id": 163585, "first_k_dense_replace": 1,
    "max_position_embeddings": 131072, "model_type": "kimi_k2", "n_group": 1,
    "n_routed_experts": 384, "num_attention_heads": 64, "num_key_value_heads": 64,
    "num_nextn_predict_layers": 0, "pretraining_tp": 1,
    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0},
    "rope_theta": 50000.0, "routed_scaling_factor": 2.827, "topk_group": 1,
    "transformers_version": "4.48.3", "vocab_size": 163840})"));
  return j;
}

TEST(ModelConfig, ParsesDeepSeekV3) {
  absl::StatusOr<ModelConfig> c = ParseModelConfigJson(DeepSeekV3Config().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 7168);
  EXPECT_EQ(c->num_hidden_layers, 61);
  EXPECT_EQ(c->moe.n_routed_experts, 256);
  EXPECT_EQ(c->moe.num_experts_per_tok, 8);
  EXPECT_EQ(c->moe.n_shared_experts, 1);
  EXPECT_EQ(c->moe.moe_intermediate_size, 2048);
  EXPECT_EQ(c->moe.first_k_dense_replace, 3);
  EXPECT_EQ(c->moe.n_group, 8);
  EXPECT_EQ(c->moe.topk_group, 4);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_EQ(c->moe.routed_scaling_factor, 2.5);
  EXPECT_FALSE(c->IsMoeLayer(2));
  EXPECT_TRUE(c->IsMoeLayer(3));
  EXPECT_TRUE(c->IsMoeLayer(60));
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_EQ(c->rope_scaling.factor, 40);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_EQ(c->rope_scaling.beta_fast, 32);
  EXPECT_EQ(c->rope_scaling.beta_slow, 1);
  EXPECT_EQ(c->rope_scaling.mscale, 1.0);
  EXPECT_EQ(c->rope_scaling.mscale_all_dim, 1.0);
  EXPECT_EQ(c->quant.method, "fp8");
  EXPECT_EQ(c->quant.block_rows, 128);
  EXPECT_EQ(c->quant.block_cols, 128);
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  EXPECT_EQ(c->max_position_embeddings, 163840);
  // Softmax scale: 192^-0.5 * (0.1 ln 40 + 1)^2.
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_EQ(AttentionSoftmaxScale(*c), static_cast<float>(std::pow(192.0, -0.5) * m * m));
  EXPECT_TRUE(ValidateTpSize(*c, 8).ok());
}

TEST(ModelConfig, ParsesKimiK2) {
  absl::StatusOr<ModelConfig> c = ParseModelConfigJson(KimiK2Config().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.n_routed_experts, 384);
  EXPECT_EQ(c->moe.n_group, 1);
  EXPECT_EQ(c->moe.topk_group, 1);
  EXPECT_EQ(c->moe.routed_scaling_factor, 2.827);
  EXPECT_EQ(c->moe.first_k_dense_replace, 1);
  EXPECT_EQ(c->rope_scaling.factor, 32);
  EXPECT_EQ(c->rope_scaling.beta_fast, 1.0);
  EXPECT_EQ(c->rope_theta, 50000);
  EXPECT_EQ(c->num_attention_heads, 64);
  EXPECT_EQ(c->num_nextn_predict_layers, 0);
}

// transformers v5 writes rope_parameters (rope_type + rope_theta inside) instead.
TEST(ModelConfig, ParsesRopeParameters) {
  json j = DeepSeekV3Config();
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "yarn"},   {"rope_theta", 12345.0},
                          {"factor", 40},          {"beta_fast", 32},
                          {"beta_slow", 1},        {"mscale", 1.0},
                          {"mscale_all_dim", 0.5}, {"original_max_position_embeddings", 4096}};
  absl::StatusOr<ModelConfig> c = ParseModelConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 12345.0);
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_EQ(c->rope_scaling.mscale_all_dim, 0.5);
  // "default" and null mean plain RoPE.
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500.0}};
  c = ParseModelConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, "");
  EXPECT_EQ(c->rope_theta, 500.0);
  EXPECT_EQ(AttentionSoftmaxScale(*c), 1.0f / std::sqrt(192.0f));
  j["rope_parameters"] = nullptr;
  j["rope_scaling"] = nullptr;
  c = ParseModelConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, "");
}

TEST(ModelConfig, MoeAndYarnRoundTrip) {
  for (const auto& [name, j] :
       {std::pair{"deepseek-v3", DeepSeekV3Config()}, std::pair{"kimi-k2", KimiK2Config()}}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfigJson(j.dump());
    ASSERT_TRUE(c.ok()) << c.status();
    ExpectRoundTrips(*c, name);
  }
}

// `base` with `path` (a top-level key, or "parent.child") set to `value`.
json With(json base, const std::string& path, const json& value) {
  if (const size_t dot = path.find('.'); dot != std::string::npos) {
    base[path.substr(0, dot)][path.substr(dot + 1)] = value;
  } else {
    base[path] = value;
  }
  return base;
}

// Parsing `j` fails with `code`, the message naming `key`.
void ExpectRefusedNaming(const json& j, absl::StatusCode code, const std::string& key) {
  absl::StatusOr<ModelConfig> c = ParseModelConfigJson(j.dump());
  EXPECT_EQ(c.status().code(), code) << key;
  EXPECT_NE(c.status().message().find(key), std::string::npos) << c.status();
}

struct KeyValue {
  const char* key;  // top-level key, or "parent.child"
  json value;
};

// `base` with any one of the keys set to its value fails with `code`, naming the key.
void ExpectEachRefused(const json& base, absl::StatusCode code,
                       const std::vector<KeyValue>& cases) {
  for (const KeyValue& kv : cases) ExpectRefusedNaming(With(base, kv.key, kv.value), code, kv.key);
}

TEST(ModelConfig, UnsupportedFeaturesNameTheKey) {
  ExpectEachRefused(DeepSeekV3Config(), absl::StatusCode::kUnimplemented,
                    {
                        {"rope_scaling.type", "linear"},
                        {"scoring_func", "softmax"},
                        {"topk_method", "greedy"},
                        {"quantization_config.quant_method", "awq"},
                        {"quantization_config.fmt", "e5m2"},
                        {"quantization_config.activation_scheme", "static"},
                        {"model_type", "llama"},
                    });
  json j = DeepSeekV3Config();
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  ExpectRefusedNaming(j, absl::StatusCode::kUnimplemented, "rope_parameters.rope_type");
}

TEST(ModelConfig, InconsistentMoeNamesTheKey) {
  ExpectEachRefused(DeepSeekV3Config(), absl::StatusCode::kInvalidArgument,
                    {
                        {"n_group", 7},                // 256 % 7 != 0
                        {"topk_group", 9},             // > n_group
                        {"num_experts_per_tok", 257},  // > experts
                        {"num_experts_per_tok", 0},
                        {"moe_intermediate_size", 0},
                        {"moe_layer_freq", 0},
                        {"routed_scaling_factor", -1.0},
                        {"n_routed_experts", -2},
                        // YaRN with factor < 1.
                        {"rope_scaling.factor", 0.5},
                    });
  // top-k larger than the experts of the kept groups (1 group of 32 kept, top-k 40).
  json j = DeepSeekV3Config();
  j["topk_group"] = 1;
  j["num_experts_per_tok"] = 40;
  ExpectRefusedNaming(j, absl::StatusCode::kInvalidArgument, "num_experts_per_tok");
  // YaRN without original_max_position_embeddings.
  j = DeepSeekV3Config();
  j["rope_scaling"].erase("original_max_position_embeddings");
  ExpectRefusedNaming(j, absl::StatusCode::kInvalidArgument, "original_max_position_embeddings");
  j = DeepSeekV3Config();
  j["quantization_config"]["weight_block_size"] = {128};
  absl::StatusOr<ModelConfig> c = ParseModelConfigJson(j.dump());
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("weight_block_size"), std::string::npos) << c.status();
}

TEST(ModelConfig, DenseConfigStaysDense) {
  // n_routed_experts with first_k_dense_replace >= layers: no MoE layer.
  absl::StatusOr<ModelConfig> c = ParseModelConfigJson(DenseConfig().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  for (int64_t l = 0; l < c->num_hidden_layers; ++l) EXPECT_FALSE(c->IsMoeLayer(l));
  EXPECT_EQ(c->rope_scaling.type, "");
  EXPECT_EQ(c->quant.method, "");
  json j = DenseConfig();
  j["n_routed_experts"] = nullptr;
  c = ParseModelConfigJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.n_routed_experts, 0);
}

TEST(ModelConfig, RejectsBadValuesNamingTheKey) {
  ExpectEachRefused(DenseConfig(), absl::StatusCode::kInvalidArgument,
                    {{"hidden_size", 0},
                     {"kv_lora_rank", -1},
                     {"qk_rope_head_dim", 7},
                     {"vocab_size", "many"},
                     {"num_attention_heads", 2.5},
                     {"rms_norm_eps", 0}});
  json j = DenseConfig();
  j.erase("v_head_dim");
  ExpectRefusedNaming(j, absl::StatusCode::kInvalidArgument, "v_head_dim");
  EXPECT_EQ(ParseModelConfigJson("{not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelConfigJson("[1,2]").status().code(), absl::StatusCode::kInvalidArgument);
}

// The real-size presets are the published config.json files, key for key (every key of
// ModelConfig, through its JSON form), and follow the config's layer override.
TEST(ModelConfig, RealSizePresetsEqualThePublishedConfigs) {
  const std::pair<const char*, json> cases[] = {{"kimi-k2", KimiK2Config()},
                                                {"deepseek-v3", DeepSeekV3Config()}};
  for (const auto& [name, published] : cases) {
    absl::StatusOr<ModelConfig> preset = PresetConfig(name);
    ASSERT_TRUE(preset.ok()) << preset.status();
    absl::StatusOr<ModelConfig> parsed = ParseModelConfigJson(published.dump());
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    parsed->name = name;
    EXPECT_EQ(ModelConfigToJson(*preset), ModelConfigToJson(*parsed)) << name;
    EXPECT_EQ(preset->moe.scoring_func, parsed->moe.scoring_func) << name;
    EXPECT_EQ(preset->moe.topk_method, parsed->moe.topk_method) << name;
    EXPECT_EQ(PresetConfig(name, 4)->num_hidden_layers, 4) << name;
  }
  const std::vector<std::string> names = PresetNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "kimi-k2"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "deepseek-v3"), names.end());
}

// Host weights of a real-size preset are refused (ResourceExhausted naming the model and its
// size) before any allocation, by GenerateRandomWeights and everything built on it.
TEST(ModelConfig, RealSizePresetsRefuseHostGeneration) {
  // Weights, not tensor-name bookkeeping: the kimi-k2 total is about 1.03T parameters.
  EXPECT_GT(HostWeightBytes(*PresetConfig("kimi-k2")), int64_t{4000} * 1000 * 1000 * 1000);
  EXPECT_GT(HostWeightBytes(*PresetConfig("deepseek-v3")), int64_t{2600} * 1000 * 1000 * 1000);
  for (const char* name : {"kimi-k2", "deepseek-v3"}) {
    absl::Status s = GenerateRandomWeights(*PresetConfig(name), 1).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << name;
    EXPECT_NE(s.message().find(absl::StrCat("'", name, "'")), std::string::npos) << s;
    EXPECT_NE(s.message().find(" GB of float32"), std::string::npos) << s;
    EXPECT_EQ(MakePresetWeights(name, 1).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(WritePresetToDirectory(name, 1, ::testing::TempDir() + "/refused").code(),
              absl::StatusCode::kResourceExhausted);
  }
  // The CPU backend, asked for a real-size preset (at TP 8 too), refuses it the same way.
  EngineOptions o;
  o.model = "deepseek-v3";
  o.tp = 8;
  absl::Status cpu = CreateCpuEngine(o).status();
  EXPECT_EQ(cpu.code(), absl::StatusCode::kResourceExhausted) << cpu;
  EXPECT_NE(cpu.message().find("'deepseek-v3'"), std::string::npos) << cpu;
  // The limit is on bytes: small models pass.
  EXPECT_TRUE(MakePresetWeights("tiny", 1).ok());
  EXPECT_LT(HostWeightBytes(*PresetConfig("kimi-k2-attn")), kMaxGeneratedHostWeightBytes);
}

TEST(ModelConfig, HeadsMustDivideByTp) {
  ModelConfig c = *PresetConfig("tiny");  // 8 heads
  EXPECT_TRUE(ValidateTpSize(c, 1).ok());
  EXPECT_TRUE(ValidateTpSize(c, 2).ok());
  EXPECT_TRUE(ValidateTpSize(c, 8).ok());
  absl::Status s = ValidateTpSize(c, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("num_attention_heads"), std::string::npos);
  EXPECT_EQ(ValidateTpSize(c, 0).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace verifyd::tp
