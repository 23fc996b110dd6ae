// The model's weights as named float32 host tensors in the Hugging Face DeepSeek-V3 layout
// (dense and MoE layers), their expected names and shapes, and loading / writing checkpoint
// directories (config.json + safetensors; loading goes through tp/checkpoint_reader.h).
//
// Tensor names (Linear weights are [out, in]):
//   model.embed_tokens.weight                                 [vocab, hidden]
//   model.layers.{i}.input_layernorm.weight                   [hidden]
//   model.layers.{i}.self_attn.q_a_proj.weight                [q_lora, hidden]      (q_lora > 0)
//   model.layers.{i}.self_attn.q_a_layernorm.weight           [q_lora]              (q_lora > 0)
//   model.layers.{i}.self_attn.q_b_proj.weight                [heads*(nope+rope), q_lora]
//   model.layers.{i}.self_attn.q_proj.weight                  [heads*(nope+rope), hidden]
//                                                                                  (q_lora = 0)
//   model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight      [kv_lora+rope, hidden]
//   model.layers.{i}.self_attn.kv_a_layernorm.weight          [kv_lora]
//   model.layers.{i}.self_attn.kv_b_proj.weight               [heads*(nope+v), kv_lora]
//   model.layers.{i}.self_attn.o_proj.weight                  [hidden, heads*v]
//   model.layers.{i}.post_attention_layernorm.weight          [hidden]
//   model.layers.{i}.mlp.{gate_proj,up_proj}.weight           [intermediate, hidden]
//   model.layers.{i}.mlp.down_proj.weight                     [hidden, intermediate]
// MoE layers (config.IsMoeLayer(i)) instead of the dense mlp (E = n_routed_experts,
// I = moe_intermediate_size, S = I * n_shared_experts; no shared tensors when S = 0):
//   model.layers.{i}.mlp.gate.weight                          [E, hidden]
//   model.layers.{i}.mlp.gate.e_score_correction_bias         [E]
//   model.layers.{i}.mlp.experts.{e}.{gate_proj,up_proj}.weight [I, hidden]
//   model.layers.{i}.mlp.experts.{e}.down_proj.weight         [hidden, I]
//   model.layers.{i}.mlp.shared_experts.{gate_proj,up_proj}.weight [S, hidden]
//   model.layers.{i}.mlp.shared_experts.down_proj.weight      [hidden, S]
//   model.norm.weight                                         [hidden]
//   lm_head.weight                                            [vocab, hidden] (absent when tied)
// Thread-safety: value types and free functions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tp/model_config.h"
#include "tp/safetensors.h"

namespace verifyd::tp {

// One tensor the model needs, with the preset initialisation of its values:
// value = offset + scale * uniform[-1, 1) (see kernels/weight_init.h).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  float init_scale = 0;
  float init_offset = 0;
};

// Gain of the preset LM head over 1/sqrt(hidden): makes the random model's logits peaky
// (top-2 gaps large against float rounding) so greedy decoding is well defined.
inline constexpr float kPresetLmHeadGain = 4.0f;

// Every tensor of the model, in a fixed order (embeddings, layers, norm, lm_head).
std::vector<TensorSpec> ModelTensorSpecs(const ModelConfig& c);

std::string LayerTensorName(int64_t layer, const std::string& suffix);  // "model.layers.{i}.suffix"

// Whether a config with an FP8 quantization_config (c.quant.method == "fp8") stores tensor
// `name` in FP8, as DeepSeek-V3 / Kimi-K2 checkpoints do: every Linear weight of the decoder
// layers ("model.layers.*_proj.weight" and kv_a_proj_with_mqa: attention projections, dense
// MLPs, routed and shared experts); not the router (mlp.gate), norms, embeddings or lm_head. False
// without FP8 quant. Generated weights follow it (kernels/weight_init.h WeightFp8Input).
bool IsFp8QuantizedWeight(const ModelConfig& c, const std::string& name);

struct ModelWeights {
  ModelConfig config;
  TensorMap tensors;  // name -> float32 tensor

  // The tensor, or nullptr when absent.
  const HostTensor* Find(const std::string& name) const;
};

// Every tensor of ModelTensorSpecs present with its exact shape, values finite.
// NotFound / InvalidArgument naming the tensor.
absl::Status ValidateModelWeights(const ModelWeights& w);

// Every tensor of dir's model as float32: CheckpointWeightSource::Open(dir) (config.json,
// header-only validation naming file and tensor; FP8 rule in tp/checkpoint_reader.h) +
// LoadModelWeights. config.name = the directory's base name. Extra tensors (MTP layers, ...)
// are ignored; missing or mis-shaped ones are errors naming them. Host memory: the whole
// model in float32, so for small models, tests and tools; the engines read their slices
// through the source instead (EngineOptions::model / source).
absl::StatusOr<ModelWeights> LoadModelFromDirectory(const std::string& dir);

// Writes config.json and the tensors (BF16 by default; see WriteSafetensorsDirectory for
// max_shard_bytes).
absl::Status WriteModelToDirectory(const ModelWeights& w, const std::string& dir,
                                   SafetensorsDType dtype = SafetensorsDType::kBF16,
                                   int64_t max_shard_bytes = 0);

}  // namespace verifyd::tp
