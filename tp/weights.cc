// Tensor names / shapes of the DeepSeek-V3 layout (dense and MoE layers) and checkpoint
// directory I/O (loading through the streaming reader, tp/checkpoint_reader.h).
#include "tp/weights.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tp/checkpoint_reader.h"
#include "tp/weight_source.h"

namespace verifyd::tp {

std::string LayerTensorName(int64_t layer, const std::string& suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

bool IsFp8QuantizedWeight(const ModelConfig& c, const std::string& name) {
  return c.quant.method == "fp8" && absl::StartsWith(name, "model.layers.") &&
         (absl::EndsWith(name, "_proj.weight") ||
          absl::EndsWith(name, "kv_a_proj_with_mqa.weight"));
}

namespace {

// The MoE MLP of layer l: router, correction bias, routed experts, fused shared experts.
void AppendMoeSpecs(const ModelConfig& c, int64_t l, std::vector<TensorSpec>* s) {
  const int64_t hid = c.hidden_size, E = c.moe.n_routed_experts;
  const int64_t mi = c.moe.moe_intermediate_size, si = mi * c.moe.n_shared_experts;
  auto linear = [](std::string name, int64_t out, int64_t in) {
    return TensorSpec{std::move(name), {out, in}, 1.0f / std::sqrt(static_cast<float>(in)), 0.0f};
  };
  s->push_back(linear(LayerTensorName(l, "mlp.gate.weight"), E, hid));
  // The bias shifts the choice of experts (scores are in (0, 1)), not their weights.
  s->push_back({LayerTensorName(l, "mlp.gate.e_score_correction_bias"), {E}, 0.05f, 0.0f});
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = absl::StrCat("mlp.experts.", e, ".");
    s->push_back(linear(LayerTensorName(l, p + "gate_proj.weight"), mi, hid));
    s->push_back(linear(LayerTensorName(l, p + "up_proj.weight"), mi, hid));
    s->push_back(linear(LayerTensorName(l, p + "down_proj.weight"), hid, mi));
  }
  if (si > 0) {
    s->push_back(linear(LayerTensorName(l, "mlp.shared_experts.gate_proj.weight"), si, hid));
    s->push_back(linear(LayerTensorName(l, "mlp.shared_experts.up_proj.weight"), si, hid));
    s->push_back(linear(LayerTensorName(l, "mlp.shared_experts.down_proj.weight"), hid, si));
  }
}

}  // namespace

std::vector<TensorSpec> ModelTensorSpecs(const ModelConfig& c) {
  const int64_t H = c.num_attention_heads, hid = c.hidden_size;
  const int64_t qk = c.qk_head_dim();
  auto linear = [](std::string name, int64_t out, int64_t in, float gain = 1.0f) {
    return TensorSpec{std::move(name), {out, in}, gain / std::sqrt(static_cast<float>(in)), 0.0f};
  };
  auto norm = [](std::string name, int64_t n) {
    return TensorSpec{std::move(name), {n}, 0.1f, 1.0f};
  };
  std::vector<TensorSpec> s;
  s.push_back({"model.embed_tokens.weight", {c.vocab_size, hid}, 1.0f, 0.0f});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto n = [&](const char* suffix) { return LayerTensorName(l, suffix); };
    s.push_back(norm(n("input_layernorm.weight"), hid));
    if (c.q_lora_rank > 0) {
      s.push_back(linear(n("self_attn.q_a_proj.weight"), c.q_lora_rank, hid));
      s.push_back(norm(n("self_attn.q_a_layernorm.weight"), c.q_lora_rank));
      s.push_back(linear(n("self_attn.q_b_proj.weight"), H * qk, c.q_lora_rank));
    } else {
      s.push_back(linear(n("self_attn.q_proj.weight"), H * qk, hid));
    }
    s.push_back(linear(n("self_attn.kv_a_proj_with_mqa.weight"), c.latent_dim(), hid));
    s.push_back(norm(n("self_attn.kv_a_layernorm.weight"), c.kv_lora_rank));
    s.push_back(linear(n("self_attn.kv_b_proj.weight"), H * (c.qk_nope_head_dim + c.v_head_dim),
                       c.kv_lora_rank));
    s.push_back(linear(n("self_attn.o_proj.weight"), hid, H * c.v_head_dim));
    s.push_back(norm(n("post_attention_layernorm.weight"), hid));
    if (c.IsMoeLayer(l)) {
      AppendMoeSpecs(c, l, &s);
      continue;
    }
    s.push_back(linear(n("mlp.gate_proj.weight"), c.intermediate_size, hid));
    s.push_back(linear(n("mlp.up_proj.weight"), c.intermediate_size, hid));
    s.push_back(linear(n("mlp.down_proj.weight"), hid, c.intermediate_size));
  }
  s.push_back(norm("model.norm.weight", hid));
  if (!c.tie_word_embeddings) {
    s.push_back(linear("lm_head.weight", c.vocab_size, hid, kPresetLmHeadGain));
  }
  return s;
}

const HostTensor* ModelWeights::Find(const std::string& name) const {
  auto it = tensors.find(name);
  return it == tensors.end() ? nullptr : &it->second;
}

absl::Status ValidateModelWeights(const ModelWeights& w) {
  if (absl::Status s = ValidateModelConfig(w.config); !s.ok()) return s;
  for (const TensorSpec& spec : ModelTensorSpecs(w.config)) {
    const HostTensor* t = w.Find(spec.name);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat("weights: tensor '", spec.name, "' is missing"));
    }
    if (t->shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights: tensor '", spec.name, "' has shape [", absl::StrJoin(t->shape, ", "),
          "], expected [", absl::StrJoin(spec.shape, ", "), "]"));
    }
    if (static_cast<int64_t>(t->data.size()) != t->numel()) {
      return absl::InvalidArgumentError(
          absl::StrCat("weights: tensor '", spec.name, "' data size does not match its shape"));
    }
    for (size_t i = 0; i < t->data.size(); ++i) {
      if (!std::isfinite(t->data[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("weights: tensor '", spec.name, "' element ", i, " is not finite"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelWeights> LoadModelFromDirectory(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<CheckpointWeightSource>> src = CheckpointWeightSource::Open(dir);
  if (!src.ok()) return src.status();
  absl::StatusOr<ModelWeights> w = LoadModelWeights(**src);
  if (!w.ok() && !absl::StrContains(w.status().message(), dir)) {
    return absl::Status(w.status().code(), absl::StrCat(dir, ": ", w.status().message()));
  }
  return w;
}

absl::Status WriteModelToDirectory(const ModelWeights& w, const std::string& dir,
                                   SafetensorsDType dtype, int64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  if (absl::Status s = ValidateModelWeights(w); !s.ok()) return s;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::ofstream out((fs::path(dir) / "config.json").string(), std::ios::trunc);
  out << ModelConfigToJson(w.config) << "\n";
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", dir, "/config.json"));
  // Only the model's tensors (extra ones would be ignored on load anyway).
  TensorMap selected;
  for (const TensorSpec& spec : ModelTensorSpecs(w.config)) {
    selected.emplace(spec.name, *w.Find(spec.name));
  }
  return WriteSafetensorsDirectory(dir, selected, dtype, max_shard_bytes);
}

}  // namespace verifyd::tp
