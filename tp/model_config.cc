// config.json (Hugging Face DeepSeek-V3 keys) <-> ModelConfig, and its consistency checks.
#include "tp/model_config.h"

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace verifyd::tp {
namespace {

using json = nlohmann::json;

// Reads an integer key when present and not null; a wrong type is InvalidArgument.
absl::Status ReadInt(const json& j, const char* key, int64_t* out, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required)
      return absl::InvalidArgumentError(absl::StrCat("config.json: missing key '", key, "'"));
    return absl::OkStatus();
  }
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: key '", key, "' must be an integer, got ", it->dump()));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadDouble(const json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: key '", key, "' must be a number, got ", it->dump()));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfigJson(const std::string& json_text) {
  json j = json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("config.json: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("config.json: top level is not an object");

  ModelConfig c;
  c.max_position_embeddings = 4096;
  if (auto it = j.find("name"); it != j.end() && it->is_string()) c.name = it->get<std::string>();
  struct IntKey {
    const char* key;
    int64_t* out;
    bool required;
  };
  const IntKey int_keys[] = {
      {"vocab_size", &c.vocab_size, true},
      {"hidden_size", &c.hidden_size, true},
      {"num_hidden_layers", &c.num_hidden_layers, true},
      {"num_attention_heads", &c.num_attention_heads, true},
      {"q_lora_rank", &c.q_lora_rank, false},  // null / absent = plain q_proj
      {"kv_lora_rank", &c.kv_lora_rank, true},
      {"qk_nope_head_dim", &c.qk_nope_head_dim, true},
      {"qk_rope_head_dim", &c.qk_rope_head_dim, true},
      {"v_head_dim", &c.v_head_dim, true},
      {"intermediate_size", &c.intermediate_size, true},
      {"max_position_embeddings", &c.max_position_embeddings, false},
  };
  for (const IntKey& k : int_keys) {
    if (absl::Status s = ReadInt(j, k.key, k.out, k.required); !s.ok()) return s;
  }
  if (absl::Status s = ReadDouble(j, "rms_norm_eps", &c.rms_norm_eps); !s.ok()) return s;
  if (absl::Status s = ReadDouble(j, "rope_theta", &c.rope_theta); !s.ok()) return s;
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError("config.json: key 'tie_word_embeddings' must be a boolean");
    }
    c.tie_word_embeddings = it->get<bool>();
  }

  // Features this engine does not implement: say which key asked for them.
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    return absl::UnimplementedError(absl::StrCat("config.json: 'rope_scaling' = ", it->dump(),
                                                 " is not supported (only null)"));
  }
  int64_t n_routed = 0;
  if (absl::Status s = ReadInt(j, "n_routed_experts", &n_routed, false); !s.ok()) return s;
  if (n_routed > 0) {
    // DeepSeek-V3: layers [0, first_k_dense_replace) are dense, the rest MoE (when
    // moe_layer_freq divides the index; any MoE layer is unsupported).
    int64_t first_dense = 0;
    if (absl::Status s = ReadInt(j, "first_k_dense_replace", &first_dense, false); !s.ok()) {
      return s;
    }
    if (first_dense < c.num_hidden_layers) {
      return absl::UnimplementedError(
          absl::StrCat("config.json: 'n_routed_experts' = ", n_routed,
                       " with 'first_k_dense_replace' = ", first_dense, " < 'num_hidden_layers' = ",
                       c.num_hidden_layers, ": MoE layers are not supported (dense layers only)"));
    }
  }
  if (absl::Status s = ValidateModelConfig(c); !s.ok()) return s;
  return c;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  json j;
  j["architectures"] = json::array({"DeepseekV3ForCausalLM"});
  j["model_type"] = "deepseek_v3";
  j["name"] = c.name;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_attention_heads;
  if (c.q_lora_rank > 0) {
    j["q_lora_rank"] = c.q_lora_rank;
  } else {
    j["q_lora_rank"] = nullptr;
  }
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["intermediate_size"] = c.intermediate_size;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["n_routed_experts"] = nullptr;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "bfloat16";
  return j.dump(2);
}

absl::Status ValidateModelConfig(const ModelConfig& c) {
  struct Positive {
    const char* key;
    int64_t value;
  };
  const Positive keys[] = {
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"kv_lora_rank", c.kv_lora_rank},
      {"qk_nope_head_dim", c.qk_nope_head_dim},
      {"qk_rope_head_dim", c.qk_rope_head_dim},
      {"v_head_dim", c.v_head_dim},
      {"intermediate_size", c.intermediate_size},
      {"max_position_embeddings", c.max_position_embeddings},
  };
  for (const Positive& k : keys) {
    if (k.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: '", k.key, "' must be > 0, got ", k.value));
    }
  }
  if (c.q_lora_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: 'q_lora_rank' must be >= 0, got ", c.q_lora_rank));
  }
  if (c.qk_rope_head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: 'qk_rope_head_dim' must be even, got ", c.qk_rope_head_dim));
  }
  if (c.vocab_size > INT32_MAX) {
    return absl::InvalidArgumentError("model config: 'vocab_size' exceeds int32 token ids");
  }
  if (!(c.rms_norm_eps > 0)) {
    return absl::InvalidArgumentError("model config: 'rms_norm_eps' must be > 0");
  }
  if (!(c.rope_theta > 0)) {
    return absl::InvalidArgumentError("model config: 'rope_theta' must be > 0");
  }
  return absl::OkStatus();
}

}  // namespace verifyd::tp
