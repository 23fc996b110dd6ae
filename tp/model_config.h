// The MLA decoder's configuration, in the keys of a Hugging Face DeepSeek-V3 config.json.
// Thread-safety: a plain value type.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace verifyd::tp {

struct ModelConfig {
  std::string name = "tiny";               // preset name or checkpoint directory basename
  int64_t vocab_size = 0;                  // vocab_size
  int64_t hidden_size = 0;                 // hidden_size
  int64_t num_hidden_layers = 0;           // num_hidden_layers (all dense)
  int64_t num_attention_heads = 0;         // num_attention_heads
  int64_t q_lora_rank = 0;                 // q_lora_rank; 0 = a plain q_proj
  int64_t kv_lora_rank = 0;                // kv_lora_rank: latent width (the value width in latent)
  int64_t qk_nope_head_dim = 0;            // qk_nope_head_dim
  int64_t qk_rope_head_dim = 0;            // qk_rope_head_dim
  int64_t v_head_dim = 0;                  // v_head_dim
  int64_t intermediate_size = 0;           // intermediate_size (dense MLP)
  double rms_norm_eps = 1e-6;              // rms_norm_eps
  double rope_theta = 10000.0;             // rope_theta
  int64_t max_position_embeddings = 4096;  // max_position_embeddings: the context limit
  bool tie_word_embeddings = false;        // tie_word_embeddings

  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // cache row width
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// Parses config.json text (unknown keys ignored; MoE keys with MoE layers present, or a
// rope_scaling other than null, give Unimplemented naming the key).
absl::StatusOr<ModelConfig> ParseModelConfigJson(const std::string& json_text);
// Serializes the keys above (for writing a preset to disk).
std::string ModelConfigToJson(const ModelConfig& c);
// Checks dimensions are positive and consistent (InvalidArgument naming the key).
absl::Status ValidateModelConfig(const ModelConfig& c);

}  // namespace verifyd::tp
