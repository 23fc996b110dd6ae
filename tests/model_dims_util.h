// Test helper shared by the tests that make their own small models: a ModelConfig's attention
// and dense-MLP dimensions set from one row (as tp/presets.cc states its presets' shapes).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "tp/model_config.h"

namespace verifyd::test_util {

// The fields of a ModelDims row, in its order.
inline constexpr int64_t tp::ModelConfig::*kModelDimFields[] = {
    &tp::ModelConfig::vocab_size,        &tp::ModelConfig::hidden_size,
    &tp::ModelConfig::num_hidden_layers, &tp::ModelConfig::num_attention_heads,
    &tp::ModelConfig::q_lora_rank,       &tp::ModelConfig::kv_lora_rank,
    &tp::ModelConfig::qk_nope_head_dim,  &tp::ModelConfig::qk_rope_head_dim,
    &tp::ModelConfig::v_head_dim,        &tp::ModelConfig::intermediate_size};

// vocab, hidden, layers, heads, q_lora, kv_lora, nope, rope, v, intermediate.
using ModelDims = std::array<int64_t, std::size(kModelDimFields)>;

// `c` with the dimensions `d`; its other fields unchanged.
inline tp::ModelConfig WithDims(tp::ModelConfig c, const ModelDims& d) {
  for (size_t i = 0; i < d.size(); ++i) c.*kModelDimFields[i] = d[i];
  return c;
}

}  // namespace verifyd::test_util
