// Tensor names / shapes of the DeepSeek-V3 dense layout and checkpoint directory I/O.
#include "tp/weights.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace verifyd::tp {

std::string LayerTensorName(int64_t layer, const std::string& suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

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
  namespace fs = std::filesystem;
  const fs::path cfg_path = fs::path(dir) / "config.json";
  std::ifstream in(cfg_path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", cfg_path.string()));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<ModelConfig> cfg = ParseModelConfigJson(ss.str());
  if (!cfg.ok()) {
    return absl::Status(cfg.status().code(),
                        absl::StrCat(cfg_path.string(), ": ", cfg.status().message()));
  }
  ModelWeights w;
  w.config = *cfg;
  fs::path p = fs::path(dir);
  if (!p.has_filename()) p = p.parent_path();  // "dir/" -> "dir"
  w.config.name = p.filename().string();
  absl::StatusOr<TensorMap> tensors = ReadSafetensorsDirectory(dir);
  if (!tensors.ok()) return tensors.status();
  w.tensors = std::move(*tensors);
  if (absl::Status s = ValidateModelWeights(w); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(dir, ": ", s.message()));
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
