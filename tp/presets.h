// Preset models: the MLA architecture with deterministic random weights from a seed.
//
//   tiny          vocab 512, hidden 128, 2 layers, 8 heads, q_lora 64, kv_lora 64, rope 16,
//                 nope 32, v 32, intermediate 256, max_position 4096. Tests and the demo.
//   small         vocab 2048, hidden 256, 4 layers, 16 heads, q_lora 128, kv_lora 128,
//                 rope 32, nope 64, v 64, intermediate 512, max_position 8192.
//   kimi-k2-attn  the real Kimi-K2 attention shapes: hidden 7168, 64 heads, q_lora 1536,
//                 kv_lora 512, rope 64, nope 128, v 128, intermediate 18432, max_position
//                 262144; vocab 32000 (smaller than Kimi-K2's 163840, to keep the LM head
//                 cheap); 2 layers unless a layer count is given. Meant for the GPU engine
//                 (the CPU engine can run it, slowly, and needs ~4 GB per layer).
//   tiny-moe      tiny's attention and vocab with the DeepSeek-V3 MLP stack: 3 layers, layer 0
//                 dense (intermediate 256), layers 1-2 MoE (16 routed experts in 4 groups,
//                 top-2 groups, top-4 experts, 1 shared expert, moe_intermediate 64,
//                 routed_scaling_factor 2.5), YaRN factor 4 over 1024 original positions
//                 (mscale 1, mscale_all_dim 0.8). CPU tests of MoE / YaRN without torch.
//
// Every value is WeightValue(WeightTensorKey(seed, WeightNameHash(name)), flat index,
// spec.init_scale, spec.init_offset) (kernels/weight_init.h), i.e. bf16-exact; a GPU engine
// generates the same bits on the device from ModelTensorSpecs.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tp/model_config.h"
#include "tp/weights.h"

namespace verifyd::tp {

std::vector<std::string> PresetNames();

// The preset's config; num_layers > 0 overrides its layer count. NotFound for unknown names.
absl::StatusOr<ModelConfig> PresetConfig(const std::string& name, int64_t num_layers = 0);

// Generates every tensor of ModelTensorSpecs(config) from the seed (any valid config).
absl::StatusOr<ModelWeights> GenerateRandomWeights(const ModelConfig& config, uint64_t seed);

// PresetConfig + GenerateRandomWeights.
absl::StatusOr<ModelWeights> MakePresetWeights(const std::string& name, uint64_t seed,
                                               int64_t num_layers = 0);

// Generates a preset and writes it as a checkpoint directory (config.json + BF16
// safetensors, which hold the preset values exactly).
absl::Status WritePresetToDirectory(const std::string& name, uint64_t seed, const std::string& dir,
                                    int64_t max_shard_bytes = 0);

}  // namespace verifyd::tp
