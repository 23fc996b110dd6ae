// ModelConfig JSON: round trip, Hugging Face keys, rejection of unsupported features.
#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "tp/model_config.h"
#include "tp/presets.h"
#include "tp/sharding.h"

namespace verifyd::tp {
namespace {

using json = nlohmann::json;

TEST(ModelConfig, RoundTripOfEveryPreset) {
  for (const std::string& name : PresetNames()) {
    absl::StatusOr<ModelConfig> c = PresetConfig(name);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(ValidateModelConfig(*c).ok());
    absl::StatusOr<ModelConfig> back = ParseModelConfigJson(ModelConfigToJson(*c));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->vocab_size, c->vocab_size);
    EXPECT_EQ(back->hidden_size, c->hidden_size);
    EXPECT_EQ(back->num_hidden_layers, c->num_hidden_layers);
    EXPECT_EQ(back->num_attention_heads, c->num_attention_heads);
    EXPECT_EQ(back->q_lora_rank, c->q_lora_rank);
    EXPECT_EQ(back->kv_lora_rank, c->kv_lora_rank);
    EXPECT_EQ(back->qk_nope_head_dim, c->qk_nope_head_dim);
    EXPECT_EQ(back->qk_rope_head_dim, c->qk_rope_head_dim);
    EXPECT_EQ(back->v_head_dim, c->v_head_dim);
    EXPECT_EQ(back->intermediate_size, c->intermediate_size);
    EXPECT_EQ(back->rms_norm_eps, c->rms_norm_eps);
    EXPECT_EQ(back->rope_theta, c->rope_theta);
    EXPECT_EQ(back->max_position_embeddings, c->max_position_embeddings);
    EXPECT_EQ(back->tie_word_embeddings, c->tie_word_embeddings);
    EXPECT_EQ(back->latent_dim(), c->kv_lora_rank + c->qk_rope_head_dim);
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

TEST(ModelConfig, RejectsMoeLayers) {
  json j = DenseConfig();
  j["first_k_dense_replace"] = 1;
  absl::StatusOr<ModelConfig> c = ParseModelConfigJson(j.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("n_routed_experts"), std::string::npos) << c.status();
}

TEST(ModelConfig, RejectsRopeScaling) {
  json j = DenseConfig();
  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 40}};
  absl::StatusOr<ModelConfig> c = ParseModelConfigJson(j.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(c.status().message().find("rope_scaling"), std::string::npos) << c.status();
}

TEST(ModelConfig, RejectsBadValuesNamingTheKey) {
  struct Case {
    const char* key;
    json value;
  };
  const Case cases[] = {{"hidden_size", 0},           {"kv_lora_rank", -1},
                        {"qk_rope_head_dim", 7},      {"vocab_size", "many"},
                        {"num_attention_heads", 2.5}, {"rms_norm_eps", 0}};
  for (const Case& cs : cases) {
    json j = DenseConfig();
    j[cs.key] = cs.value;
    absl::StatusOr<ModelConfig> c = ParseModelConfigJson(j.dump());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << cs.key;
    EXPECT_NE(c.status().message().find(cs.key), std::string::npos) << c.status();
  }
  json j = DenseConfig();
  j.erase("v_head_dim");
  absl::StatusOr<ModelConfig> c = ParseModelConfigJson(j.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("v_head_dim"), std::string::npos);
  EXPECT_EQ(ParseModelConfigJson("{not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelConfigJson("[1,2]").status().code(), absl::StatusCode::kInvalidArgument);
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
