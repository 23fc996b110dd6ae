// config.json (Hugging Face DeepSeek-V3 keys) <-> ModelConfig, and its consistency checks.
#include "tp/model_config.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/status.h"
#include "kernels/yarn.h"

namespace verifyd::tp {
namespace {

using json = nlohmann::json;

// Reads `key` into *out when present and not null; a value that is not `kind` (is_kind) is
// InvalidArgument naming the key; absent or null is an error only when `required`.
template <class T>
absl::Status ReadKey(const json& j, const char* key, T* out, bool (json::*is_kind)() const noexcept,
                     const char* kind, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required)
      return absl::InvalidArgumentError(absl::StrCat("config.json: missing key '", key, "'"));
    return absl::OkStatus();
  }
  if (!((*it).*is_kind)()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: key '", key, "' must be ", kind, ", got ", it->dump()));
  }
  *out = it->get<T>();
  return absl::OkStatus();
}

absl::Status ReadInt(const json& j, const char* key, int64_t* out, bool required) {
  return ReadKey(j, key, out, &json::is_number_integer, "an integer", required);
}
absl::Status ReadDouble(const json& j, const char* key, double* out) {
  return ReadKey(j, key, out, &json::is_number, "a number", false);
}
absl::Status ReadString(const json& j, const char* key, std::string* out) {
  return ReadKey(j, key, out, &json::is_string, "a string", false);
}
absl::Status ReadBool(const json& j, const char* key, bool* out) {
  return ReadKey(j, key, out, &json::is_boolean, "a boolean", false);
}

// The model types whose config.json this parser reads (Kimi-K2 ships the DeepSeek-V3
// architecture under its own model_type). Absent = accepted (hand-written configs).
absl::Status ParseModelType(const json& j) {
  std::string type;
  VERIFYD_RETURN_IF_ERROR(ReadString(j, "model_type", &type));
  if (type.empty() || type == "deepseek_v3" || type == "kimi_k2") return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat("config.json: 'model_type' = \"", type,
                                               "\" is not supported (deepseek_v3, kimi_k2)"));
}

// rope_parameters (transformers v5: also carries rope_theta) or rope_scaling (<= 4); the
// type under "rope_type" or "type". null / "default" = plain RoPE; "yarn" = YaRN.
absl::Status ParseRope(const json& j, ModelConfig* c) {
  const char* key = "rope_parameters";
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    key = "rope_scaling";
    it = j.find(key);
  }
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  const json& r = *it;
  if (!r.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: '", key, "' must be an object or null, got ", r.dump()));
  }
  auto sub = [key](const char* k) { return absl::StrCat(key, ".", k); };
  // Every nested key is read under its full name ("rope_scaling.factor"), so errors say where.
  json flat = json::object();
  for (auto e = r.begin(); e != r.end(); ++e) flat[sub(e.key().c_str())] = e.value();
  VERIFYD_RETURN_IF_ERROR(ReadDouble(flat, sub("rope_theta").c_str(), &c->rope_theta));
  std::string type;
  const std::string type_key = r.contains("rope_type") ? sub("rope_type") : sub("type");
  VERIFYD_RETURN_IF_ERROR(ReadString(flat, type_key.c_str(), &type));
  if (type.empty() || type == "default") return absl::OkStatus();
  if (type != "yarn") {
    return absl::UnimplementedError(absl::StrCat("config.json: '", type_key, "' = \"", type,
                                                 "\" is not supported (only yarn or default)"));
  }
  RopeScaling& y = c->rope_scaling;
  y.type = "yarn";
  if (!r.contains("factor") || r["factor"].is_null()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: missing key '", sub("factor"), "' (yarn)"));
  }
  VERIFYD_RETURN_IF_ERROR(ReadDouble(flat, sub("factor").c_str(), &y.factor));
  VERIFYD_RETURN_IF_ERROR(ReadInt(flat, sub("original_max_position_embeddings").c_str(),
                                  &y.original_max_position_embeddings, /*required=*/true));
  // transformers: `beta_fast or 32`, `beta_slow or 1`; mscale / mscale_all_dim absent = 0
  // (its `if mscale and mscale_all_dim` treats 0 and absent alike).
  y.beta_fast = 32.0;
  y.beta_slow = 1.0;
  y.mscale = 0.0;
  y.mscale_all_dim = 0.0;
  VERIFYD_RETURN_IF_ERROR(ReadDouble(flat, sub("beta_fast").c_str(), &y.beta_fast));
  VERIFYD_RETURN_IF_ERROR(ReadDouble(flat, sub("beta_slow").c_str(), &y.beta_slow));
  VERIFYD_RETURN_IF_ERROR(ReadDouble(flat, sub("mscale").c_str(), &y.mscale));
  VERIFYD_RETURN_IF_ERROR(ReadDouble(flat, sub("mscale_all_dim").c_str(), &y.mscale_all_dim));
  if (y.beta_fast == 0) y.beta_fast = 32.0;
  if (y.beta_slow == 0) y.beta_slow = 1.0;
  if (auto a = r.find("attention_factor"); a != r.end() && !a->is_null()) {
    return absl::UnimplementedError(absl::StrCat("config.json: '", sub("attention_factor"),
                                                 "' is not supported (derived from mscale)"));
  }
  if (auto t = r.find("truncate"); t != r.end() && !t->is_null() && *t != json(true)) {
    return absl::UnimplementedError(
        absl::StrCat("config.json: '", sub("truncate"), "' = ", t->dump(), " (only true)"));
  }
  return absl::OkStatus();
}

// The MoE keys. Absent keys take transformers' DeepseekV3Config defaults (top-k 8, 1 shared
// expert, moe_intermediate_size 2048, first_k_dense_replace 3, n_group 8, topk_group 4,
// norm_topk_prob true, routed_scaling_factor 2.5), since transformers reads them so.
absl::Status ParseMoe(const json& j, MoeConfig* m) {
  int64_t n_routed = 0;
  VERIFYD_RETURN_IF_ERROR(ReadInt(j, "n_routed_experts", &n_routed, false));
  if (n_routed <= 0) {
    *m = MoeConfig();  // dense model (null / absent / 0)
    if (n_routed < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: 'n_routed_experts' must be >= 0, got ", n_routed));
    }
    return absl::OkStatus();
  }
  m->n_routed_experts = n_routed;
  m->num_experts_per_tok = 8;
  m->n_shared_experts = 1;
  m->moe_intermediate_size = 2048;
  m->first_k_dense_replace = 3;
  m->moe_layer_freq = 1;
  m->n_group = 8;
  m->topk_group = 4;
  m->norm_topk_prob = true;
  m->routed_scaling_factor = 2.5;
  VERIFYD_RETURN_IF_ERROR(ReadInt(j, "num_experts_per_tok", &m->num_experts_per_tok, false));
  VERIFYD_RETURN_IF_ERROR(ReadInt(j, "n_shared_experts", &m->n_shared_experts, false));
  VERIFYD_RETURN_IF_ERROR(ReadInt(j, "moe_intermediate_size", &m->moe_intermediate_size, false));
  VERIFYD_RETURN_IF_ERROR(ReadInt(j, "first_k_dense_replace", &m->first_k_dense_replace, false));
  VERIFYD_RETURN_IF_ERROR(ReadInt(j, "moe_layer_freq", &m->moe_layer_freq, false));
  VERIFYD_RETURN_IF_ERROR(ReadInt(j, "n_group", &m->n_group, false));
  VERIFYD_RETURN_IF_ERROR(ReadInt(j, "topk_group", &m->topk_group, false));
  VERIFYD_RETURN_IF_ERROR(ReadBool(j, "norm_topk_prob", &m->norm_topk_prob));
  VERIFYD_RETURN_IF_ERROR(ReadDouble(j, "routed_scaling_factor", &m->routed_scaling_factor));
  VERIFYD_RETURN_IF_ERROR(ReadString(j, "scoring_func", &m->scoring_func));
  VERIFYD_RETURN_IF_ERROR(ReadString(j, "topk_method", &m->topk_method));
  if (m->scoring_func != "sigmoid") {
    return absl::UnimplementedError(absl::StrCat("config.json: 'scoring_func' = \"",
                                                 m->scoring_func, "\" is not supported (sigmoid)"));
  }
  if (m->topk_method != "noaux_tc") {
    return absl::UnimplementedError(absl::StrCat("config.json: 'topk_method' = \"", m->topk_method,
                                                 "\" is not supported (noaux_tc)"));
  }
  return absl::OkStatus();
}

// quantization_config: only DeepSeek-V3's block-wise FP8 (e4m3, dynamic activations).
absl::Status ParseQuant(const json& j, QuantConfig* q) {
  auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) {
    return absl::InvalidArgumentError("config.json: 'quantization_config' must be an object");
  }
  json flat = json::object();
  for (auto e = it->begin(); e != it->end(); ++e) {
    flat[absl::StrCat("quantization_config.", e.key())] = e.value();
  }
  std::string method, fmt = "e4m3", activation = "dynamic";
  VERIFYD_RETURN_IF_ERROR(ReadString(flat, "quantization_config.quant_method", &method));
  if (method != "fp8") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: 'quantization_config.quant_method' = \"", method,
                     "\" is not supported (only fp8)"));
  }
  VERIFYD_RETURN_IF_ERROR(ReadString(flat, "quantization_config.fmt", &fmt));
  if (fmt != "e4m3") {
    return absl::UnimplementedError(absl::StrCat("config.json: 'quantization_config.fmt' = \"", fmt,
                                                 "\" is not supported (only e4m3)"));
  }
  VERIFYD_RETURN_IF_ERROR(ReadString(flat, "quantization_config.activation_scheme", &activation));
  if (activation != "dynamic") {
    return absl::UnimplementedError(
        absl::StrCat("config.json: 'quantization_config.activation_scheme' = \"", activation,
                     "\" is not supported (only dynamic)"));
  }
  auto bs = it->find("weight_block_size");
  if (bs == it->end() || !bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() ||
      !(*bs)[1].is_number_integer()) {
    return absl::UnimplementedError(
        "config.json: 'quantization_config.weight_block_size' must be [rows, cols] (block-wise "
        "FP8 only)");
  }
  q->method = "fp8";
  q->fmt = fmt;
  q->block_rows = (*bs)[0].get<int64_t>();
  q->block_cols = (*bs)[1].get<int64_t>();
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

  VERIFYD_RETURN_IF_ERROR(ParseModelType(j));
  VERIFYD_RETURN_IF_ERROR(ParseRope(j, &c));
  VERIFYD_RETURN_IF_ERROR(ParseMoe(j, &c.moe));
  VERIFYD_RETURN_IF_ERROR(ParseQuant(j, &c.quant));
  VERIFYD_RETURN_IF_ERROR(
      ReadInt(j, "num_nextn_predict_layers", &c.num_nextn_predict_layers, false));
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
  if (c.rope_scaling.type.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    const RopeScaling& y = c.rope_scaling;
    json r = {{"type", y.type},
              {"rope_type", y.type},
              {"factor", y.factor},
              {"original_max_position_embeddings", y.original_max_position_embeddings},
              {"beta_fast", y.beta_fast},
              {"beta_slow", y.beta_slow}};
    if (y.mscale != 0) r["mscale"] = y.mscale;
    if (y.mscale_all_dim != 0) r["mscale_all_dim"] = y.mscale_all_dim;
    j["rope_scaling"] = r;
  }
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.moe.n_routed_experts > 0) {
    const MoeConfig& m = c.moe;
    j["n_routed_experts"] = m.n_routed_experts;
    j["num_experts_per_tok"] = m.num_experts_per_tok;
    j["n_shared_experts"] = m.n_shared_experts;
    j["moe_intermediate_size"] = m.moe_intermediate_size;
    j["first_k_dense_replace"] = m.first_k_dense_replace;
    j["moe_layer_freq"] = m.moe_layer_freq;
    j["scoring_func"] = m.scoring_func;
    j["topk_method"] = m.topk_method;
    j["n_group"] = m.n_group;
    j["topk_group"] = m.topk_group;
    j["norm_topk_prob"] = m.norm_topk_prob;
    j["routed_scaling_factor"] = m.routed_scaling_factor;
  } else {
    j["n_routed_experts"] = nullptr;
  }
  if (c.quant.method == "fp8") {
    j["quantization_config"] = {{"quant_method", c.quant.method},
                                {"fmt", c.quant.fmt},
                                {"weight_block_size", {c.quant.block_rows, c.quant.block_cols}},
                                {"activation_scheme", "dynamic"}};
  }
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "bfloat16";
  return j.dump(2);
}

namespace {

absl::Status Invalid(const char* key, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("model config: '", key, "' ", why));
}

absl::Status ValidateRope(const ModelConfig& c) {
  const RopeScaling& y = c.rope_scaling;
  if (y.type.empty()) return absl::OkStatus();
  if (y.type != "yarn") {
    return absl::UnimplementedError(
        absl::StrCat("model config: 'rope_scaling.type' = \"", y.type, "\" (only yarn)"));
  }
  if (!(y.factor >= 1.0) || !std::isfinite(y.factor)) {
    return Invalid("rope_scaling.factor", absl::StrCat("must be >= 1, got ", y.factor));
  }
  if (y.original_max_position_embeddings <= 0) {
    return Invalid("rope_scaling.original_max_position_embeddings",
                   absl::StrCat("must be > 0, got ", y.original_max_position_embeddings));
  }
  if (!(y.beta_fast > 0) || !(y.beta_slow > 0)) {
    return Invalid("rope_scaling.beta_fast", "and 'beta_slow' must be > 0");
  }
  if (!(y.mscale >= 0) || !(y.mscale_all_dim >= 0)) {
    return Invalid("rope_scaling.mscale", "and 'mscale_all_dim' must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateMoe(const MoeConfig& m) {
  if (m.n_routed_experts < 0) return Invalid("n_routed_experts", "must be >= 0");
  if (m.n_routed_experts == 0) return absl::OkStatus();
  const int64_t E = m.n_routed_experts;
  if (m.num_experts_per_tok < 1 || m.num_experts_per_tok > E) {
    return Invalid("num_experts_per_tok", absl::StrCat("must be in [1, n_routed_experts = ", E,
                                                       "], got ", m.num_experts_per_tok));
  }
  if (m.moe_intermediate_size <= 0) {
    return Invalid("moe_intermediate_size",
                   absl::StrCat("must be > 0, got ", m.moe_intermediate_size));
  }
  if (m.n_shared_experts < 0) return Invalid("n_shared_experts", "must be >= 0");
  if (m.first_k_dense_replace < 0) return Invalid("first_k_dense_replace", "must be >= 0");
  if (m.moe_layer_freq < 1) return Invalid("moe_layer_freq", "must be >= 1");
  if (m.n_group < 1 || E % m.n_group != 0) {
    return Invalid("n_group",
                   absl::StrCat("must divide n_routed_experts = ", E, ", got ", m.n_group));
  }
  if (E / m.n_group < 2) {
    return Invalid("n_group", "leaves fewer than 2 experts per group (group score = top-2 sum)");
  }
  if (m.topk_group < 1 || m.topk_group > m.n_group) {
    return Invalid("topk_group",
                   absl::StrCat("must be in [1, n_group = ", m.n_group, "], got ", m.topk_group));
  }
  if (m.num_experts_per_tok > m.topk_group * (E / m.n_group)) {
    return Invalid(
        "num_experts_per_tok",
        absl::StrCat("exceeds the experts of the kept groups (topk_group * ", E / m.n_group, ")"));
  }
  if (!(m.routed_scaling_factor > 0) || !std::isfinite(m.routed_scaling_factor)) {
    return Invalid("routed_scaling_factor", "must be > 0");
  }
  if (m.scoring_func != "sigmoid") {
    return absl::UnimplementedError("model config: 'scoring_func' must be sigmoid");
  }
  if (m.topk_method != "noaux_tc") {
    return absl::UnimplementedError("model config: 'topk_method' must be noaux_tc");
  }
  return absl::OkStatus();
}

absl::Status ValidateQuant(const QuantConfig& q) {
  if (q.method.empty()) return absl::OkStatus();
  if (q.method != "fp8") {
    return absl::UnimplementedError(
        absl::StrCat("model config: 'quantization_config.quant_method' = \"", q.method, "\""));
  }
  if (q.fmt != "e4m3") {
    return absl::UnimplementedError(
        absl::StrCat("model config: 'quantization_config.fmt' = \"", q.fmt, "\""));
  }
  if (q.block_rows <= 0 || q.block_cols <= 0) {
    return Invalid("quantization_config.weight_block_size", "entries must be > 0");
  }
  return absl::OkStatus();
}

}  // namespace

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
  if (c.num_nextn_predict_layers < 0) {
    return absl::InvalidArgumentError("model config: 'num_nextn_predict_layers' must be >= 0");
  }
  VERIFYD_RETURN_IF_ERROR(ValidateRope(c));
  // The MoE keys matter only when some layer is MoE (a config with n_routed_experts but
  // first_k_dense_replace >= num_hidden_layers is dense).
  if (c.moe.n_routed_experts > 0 && c.moe.moe_layer_freq < 1) {
    return Invalid("moe_layer_freq", absl::StrCat("must be >= 1, got ", c.moe.moe_layer_freq));
  }
  bool any_moe = false;
  for (int64_t l = 0; l < c.num_hidden_layers && !any_moe; ++l) any_moe = c.IsMoeLayer(l);
  if (c.moe.n_routed_experts < 0 || any_moe) VERIFYD_RETURN_IF_ERROR(ValidateMoe(c.moe));
  return ValidateQuant(c.quant);
}

}  // namespace verifyd::tp

namespace verifyd::tp {

float AttentionSoftmaxScale(const ModelConfig& c) {
  if (c.rope_scaling.type == "yarn" && c.rope_scaling.mscale_all_dim != 0) {
    return static_cast<float>(kernels::YarnSoftmaxScale(YarnParamsOf(c), c.qk_head_dim()));
  }
  return 1.0f / std::sqrt(static_cast<float>(c.qk_head_dim()));
}

kernels::YarnParams YarnParamsOf(const ModelConfig& c) {
  kernels::YarnParams p;
  p.rope_dim = c.qk_rope_head_dim;
  p.theta = c.rope_theta;
  p.factor = c.rope_scaling.factor;
  p.original_max_position_embeddings = c.rope_scaling.original_max_position_embeddings;
  p.beta_fast = c.rope_scaling.beta_fast;
  p.beta_slow = c.rope_scaling.beta_slow;
  p.mscale = c.rope_scaling.mscale;
  p.mscale_all_dim = c.rope_scaling.mscale_all_dim;
  return p;
}

}  // namespace verifyd::tp
