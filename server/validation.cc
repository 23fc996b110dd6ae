#include "server/validation.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "server/session_manager.h"

namespace verifyd::server {

absl::Status ValidatePrompt(const verify::v1::OpenSessionRequest& req, const ApiLimits& limits) {
  const int n = req.prompt_tokens_size();
  if (n == 0) return absl::InvalidArgumentError("prompt_tokens: must not be empty");
  if (n > limits.max_context - 1) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_tokens: length ", n,
                                                   " exceeds the limit ", limits.max_context - 1,
                                                   " (max_context - 1)"));
  }
  for (int i = 0; i < n; ++i) {
    const int32_t t = req.prompt_tokens(i);
    if (t < 0 || t >= limits.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt_tokens[", i, "]: token ", t,
                                                     " is outside [0, ", limits.vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionConfig> SessionConfigFromRequest(const verify::v1::OpenSessionRequest& req,
                                                       const ApiLimits& limits) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  SessionConfig cfg;
  if (req.has_sampling()) {
    const verify::v1::SamplingParams& sp = req.sampling();
    if (!(sp.temperature() >= 0.0f) || std::isinf(sp.temperature())) {
      return bad("sampling.temperature: ", sp.temperature(), " must be finite and >= 0");
    }
    if (sp.has_top_p() && !(sp.top_p() > 0.0f && sp.top_p() <= 1.0f)) {
      return bad("sampling.top_p: ", sp.top_p(), " is outside (0, 1] (leave it unset for 1)");
    }
    if (sp.top_k() < 0) return bad("sampling.top_k: ", sp.top_k(), " must be >= 0 (0 = off)");
    cfg.sampling.temperature = sp.temperature();
    cfg.sampling.top_p = sp.has_top_p() ? sp.top_p() : 1.0f;
    cfg.sampling.top_k = sp.top_k();
    cfg.sampling.seed = sp.seed();
  }
  if (req.has_top_logprobs()) {
    if (req.top_logprobs() < 0 || req.top_logprobs() > kernels::kMaxTopLogprobs) {
      return bad("top_logprobs: ", req.top_logprobs(), " is outside [0, ", kernels::kMaxTopLogprobs,
                 "]");
    }
    cfg.top_logprobs = req.top_logprobs();
  }
  if (req.has_hidden_states()) {
    const verify::v1::HiddenStatesRequest& h = req.hidden_states();
    if (h.layers_size() == 0) {
      return bad("hidden_states.layers: must name at least one layer (0 .. ",
                 limits.num_hidden_layers - 1, ")");
    }
    for (int i = 0; i < h.layers_size(); ++i) {
      const int32_t l = h.layers(i);
      if (l < 0 || l >= limits.num_hidden_layers) {
        return bad("hidden_states.layers[", i, "]: layer ", l, " is outside [0, ",
                   limits.num_hidden_layers, ") (0-based decoder layers)");
      }
      for (int j = 0; j < i; ++j) {
        if (h.layers(j) == l) {
          return bad("hidden_states.layers[", i, "]: layer ", l, " is listed twice");
        }
      }
      cfg.hidden_layers.push_back(l);
    }
    if (h.dtype() != verify::v1::HIDDEN_DTYPE_BF16 && h.dtype() != verify::v1::HIDDEN_DTYPE_FP32) {
      return bad("hidden_states.dtype: unknown value ", static_cast<int>(h.dtype()));
    }
    cfg.hidden_fp32 = h.dtype() == verify::v1::HIDDEN_DTYPE_FP32;
    cfg.include_prompt = h.include_prompt();
  }
  return cfg;
}

int64_t HiddenStatesBytes(const SessionConfig& config, int64_t tokens, const ApiLimits& limits) {
  return tokens * static_cast<int64_t>(config.hidden_layers.size()) * limits.hidden_size *
         (config.hidden_fp32 ? 4 : 2);
}

namespace {

// Generous upper bounds of the encoded sizes (a varint is at most 10 bytes, a tag at most 2,
// a length prefix at most 5).
int64_t LogprobsBound(const SessionConfig& c, int64_t tokens) {
  if (c.top_logprobs < 0) return 0;
  return tokens * (32 + int64_t{c.top_logprobs} * 20);
}

int64_t HiddenBound(const SessionConfig& c, int64_t tokens, const ApiLimits& limits) {
  if (c.hidden_layers.empty()) return 0;
  return 64 + 12 * static_cast<int64_t>(c.hidden_layers.size()) +
         HiddenStatesBytes(c, tokens, limits);
}

}  // namespace

int64_t VerifyResultBytesBound(const SessionConfig& config, int nodes, int depth, size_t id_bytes,
                               const ApiLimits& limits) {
  return 256 + static_cast<int64_t>(id_bytes) + int64_t{depth} * 24 +
         LogprobsBound(config, depth + 1) + HiddenBound(config, depth + 1, limits) +
         (64 + 12 * int64_t{std::max(nodes, limits.max_draft_nodes)});
}

int64_t OpenResponseBytesBound(const SessionConfig& config, int64_t prompt_len,
                               const ApiLimits& limits) {
  return 256 + LogprobsBound(config, 1) +
         (config.include_prompt ? HiddenBound(config, prompt_len, limits) : 0);
}

int TreeDepth(const verify::v1::DraftTree& tree) {
  std::vector<int> depth(tree.tokens_size(), 1);
  int deepest = 0;
  for (int i = 0; i < tree.tokens_size(); ++i) {
    const int p = tree.parents(i);
    if (p >= 0 && p < i) depth[i] = depth[p] + 1;
    deepest = std::max(deepest, depth[i]);
  }
  return deepest;
}

absl::Status ValidateTree(const verify::v1::DraftTree& tree, const ApiLimits& limits,
                          const std::string& field) {
  const int n = tree.tokens_size();
  if (tree.parents_size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".parents: size ", tree.parents_size(), " != tokens size ", n));
  }
  if (n > limits.max_draft_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".tokens: ", n, " nodes exceed the limit ", limits.max_draft_nodes));
  }
  for (int i = 0; i < n; ++i) {
    const int32_t t = tree.tokens(i);
    if (t < 0 || t >= limits.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".tokens[", i, "]: token ", t,
                                                     " is outside [0, ", limits.vocab_size, ")"));
    }
    const int32_t p = tree.parents(i);
    if (p < -1 || p >= i) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".parents[", i, "]: ", p,
          " must be -1 (child of the pending token) or an earlier node in [0, ", i, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateVerifyRequest(const verify::v1::VerifyRequest& req, const ApiLimits& limits) {
  const int n = req.items_size();
  if (n == 0) return absl::InvalidArgumentError("items: must not be empty");
  if (n > limits.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("items: ", n, " items exceed the limit ", limits.max_batch, " per call"));
  }
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < n; ++i) {
    const auto& item = req.items(i);
    const std::string field = absl::StrCat("items[", i, "]");
    if (item.session_id().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".session_id: must not be empty"));
    }
    if (!seen.insert(item.session_id()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".session_id: the same session appears twice in one call"));
    }
    if (item.request_id().size() > static_cast<size_t>(kMaxRequestIdBytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".request_id: ", item.request_id().size(), " bytes exceed the limit ",
                       kMaxRequestIdBytes));
    }
    if (absl::Status st = ValidateTree(item.tree(), limits, field + ".tree"); !st.ok()) return st;
    if (item.draft_probs_size() > 0) {
      return absl::UnimplementedError(absl::StrCat(
          field,
          ".draft_probs: multi-draft rejection sampling is not implemented; send no "
          "draft_probs (sampled sessions use coupled verification, which needs none)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPrefixPrompt(int64_t prefix_len, int prompt_len, const ApiLimits& limits) {
  if (prefix_len + prompt_len > limits.max_context - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_tokens: prefix length ", prefix_len, " + prompt length ", prompt_len,
                     " exceeds the limit ", limits.max_context - 1, " (max_context - 1)"));
  }
  return absl::OkStatus();
}

absl::Status WithField(const absl::Status& st, const std::string& field) {
  return absl::Status(st.code(), absl::StrCat(field, ": ", st.message()));
}

absl::Status CheckContext(int64_t committed_len, int nodes, const ApiLimits& limits,
                          const std::string& field) {
  if (committed_len + 1 + nodes > limits.max_context) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": context ", committed_len, " + 1 pending + ", nodes,
                     " nodes exceeds max_context ", limits.max_context));
  }
  return absl::OkStatus();
}

}  // namespace verifyd::server
