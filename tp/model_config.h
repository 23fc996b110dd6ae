// The MLA decoder's configuration, in the keys of a Hugging Face DeepSeek-V3 config.json.
// Thread-safety: a plain value type.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/yarn.h"

namespace verifyd::tp {

// rope_scaling (transformers <= 4: "rope_scaling"; v5: "rope_parameters"), YaRN as DeepSeek-V3
// uses it. type "" = plain RoPE with rope_theta.
struct RopeScaling {
  std::string type;                              // "" or "yarn" (rope_type / type)
  double factor = 1.0;                           // factor
  int64_t original_max_position_embeddings = 0;  // original_max_position_embeddings
  double beta_fast = 32.0;                       // beta_fast
  double beta_slow = 1.0;                        // beta_slow
  double mscale = 1.0;                           // mscale (parsed: 0 = absent)
  double mscale_all_dim = 0.0;                   // mscale_all_dim (0 = absent)
};

// DeepSeek-V3 mixture of experts (n_routed_experts = 0: every layer is a dense MLP).
struct MoeConfig {
  int64_t n_routed_experts = 0;          // n_routed_experts
  int64_t num_experts_per_tok = 0;       // num_experts_per_tok (top-k)
  int64_t n_shared_experts = 0;          // n_shared_experts (one fused MLP of that many experts)
  int64_t moe_intermediate_size = 0;     // moe_intermediate_size (per routed expert)
  int64_t first_k_dense_replace = 0;     // first_k_dense_replace: layers [0, k) are dense
  int64_t moe_layer_freq = 1;            // moe_layer_freq: MoE where layer % freq == 0
  std::string scoring_func = "sigmoid";  // scoring_func (only sigmoid)
  std::string topk_method = "noaux_tc";  // topk_method (only noaux_tc: e_score_correction_bias)
  int64_t n_group = 1;                   // n_group: expert groups
  int64_t topk_group = 1;                // topk_group: groups kept per token
  bool norm_topk_prob = true;            // norm_topk_prob
  double routed_scaling_factor = 1.0;    // routed_scaling_factor
};

// quantization_config of FP8 checkpoints (DeepSeek-V3 layout: every Linear weight of the
// decoder layers stored as float8_e4m3fn with a float32 `<name>_scale_inv` per block).
struct QuantConfig {
  std::string method;        // "" (bf16 / fp32 weights) or "fp8" (quant_method)
  std::string fmt = "e4m3";  // fmt
  int64_t block_rows = 128;  // weight_block_size[0]
  int64_t block_cols = 128;  // weight_block_size[1]
};

struct ModelConfig {
  std::string name = "tiny";               // preset name or checkpoint directory basename
  int64_t vocab_size = 0;                  // vocab_size
  int64_t hidden_size = 0;                 // hidden_size
  int64_t num_hidden_layers = 0;           // num_hidden_layers (see IsMoeLayer)
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
  RopeScaling rope_scaling;                // rope_scaling / rope_parameters
  MoeConfig moe;                           // MoE keys (n_routed_experts = 0: dense)
  QuantConfig quant;                       // quantization_config
  int64_t num_nextn_predict_layers = 0;    // MTP layers: present in checkpoints, not run

  int64_t latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // cache row width
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Whether decoder layer `layer` has a MoE MLP (DeepSeek-V3's rule). transformers'
  // DeepseekV3DecoderLayer ignores moe_layer_freq (MoE iff layer >= first_k_dense_replace);
  // the two agree for moe_layer_freq = 1, the value of every published checkpoint.
  bool IsMoeLayer(int64_t layer) const {
    return moe.n_routed_experts > 0 && layer >= moe.first_k_dense_replace &&
           layer % moe.moe_layer_freq == 0;
  }
};

// Parses config.json text: the keys above, both rope spellings, MoE and FP8 keys; an
// unsupported value (another rope type, scoring function, top-k method or quantization)
// gives Unimplemented naming the key; MTP layers are skipped (logged by the caller).
absl::StatusOr<ModelConfig> ParseModelConfigJson(const std::string& json_text);
// Serializes the keys above (for writing a preset to disk).
std::string ModelConfigToJson(const ModelConfig& c);
// Checks dimensions are positive and consistent (InvalidArgument naming the key; MoE: n_group
// divides n_routed_experts, topk_group <= n_group, top-k <= the kept groups' experts, ...).
absl::Status ValidateModelConfig(const ModelConfig& c);

// The attention softmax scale: 1 / sqrt(float(qk_head_dim)) without YaRN (the dense
// engines' value, unchanged); under YaRN with mscale_all_dim != 0 DeepSeek-V3's corrected
// qk_head_dim^-0.5 * get_mscale(factor, mscale_all_dim)^2 (double, rounded to float).
float AttentionSoftmaxScale(const ModelConfig& c);

// The YaRN parameters of a config with rope_scaling (kernels/yarn.h), for both
// engines' RoPE tables.
kernels::YarnParams YarnParamsOf(const ModelConfig& c);

}  // namespace verifyd::tp
