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
//   kimi-k2       Kimi-K2 at its published size (config.json of moonshotai/Kimi-K2-Instruct):
//                 61 layers (layer 0 dense, intermediate 18432), hidden 7168, 64 heads, q_lora
//                 1536, kv_lora 512, rope 64, nope 128, v 128, 384 routed experts top-8 (n_group
//                 1, topk_group 1), 1 shared expert, moe_intermediate 2048, routed_scaling
//                 2.827, vocab 163840, rope_theta 50000, YaRN factor 32 over 4096 (beta_fast 1,
//                 beta_slow 1, mscale 1, mscale_all_dim 1), max_position 131072, FP8 e4m3
//                 weights in 128 x 128 blocks (quantization_config). About 1.03T parameters.
//   deepseek-v3   DeepSeek-V3 at its published size (deepseek-ai/DeepSeek-V3 config.json): as
//                 kimi-k2 but 128 heads, layers 0-2 dense, 256 routed experts (n_group 8,
//                 topk_group 4), routed_scaling 2.5, vocab 129280, rope_theta 10000, YaRN factor
//                 40 (beta_fast 32), max_position 163840, one MTP layer listed (not run).
//                 About 671B parameters.
// The real-size presets exist for sizing (tp/memory_plan.h) and for the GPU engine: their host
// weights (several TB of float32) are never generated: GenerateRandomWeights refuses any model
// above kMaxGeneratedHostWeightBytes (ResourceExhausted naming it and its size), and with it the
// CPU backend and WritePresetToDirectory.
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

// Largest model GenerateRandomWeights makes: float32 bytes of all of ModelTensorSpecs.
inline constexpr int64_t kMaxGeneratedHostWeightBytes = int64_t{64} * 1000 * 1000 * 1000;

// float32 bytes of every tensor of ModelTensorSpecs(config) (what generating it takes).
int64_t HostWeightBytes(const ModelConfig& config);

// Generates every tensor of ModelTensorSpecs(config) from the seed (any valid config up to
// kMaxGeneratedHostWeightBytes; above it ResourceExhausted naming config.name and its size).
absl::StatusOr<ModelWeights> GenerateRandomWeights(const ModelConfig& config, uint64_t seed);

// PresetConfig + GenerateRandomWeights.
absl::StatusOr<ModelWeights> MakePresetWeights(const std::string& name, uint64_t seed,
                                               int64_t num_layers = 0);

// Generates a preset and writes it as a checkpoint directory (config.json + BF16
// safetensors, which hold the preset values exactly).
absl::Status WritePresetToDirectory(const std::string& name, uint64_t seed, const std::string& dir,
                                    int64_t max_shard_bytes = 0);

}  // namespace verifyd::tp
