#include "server/validation.h"

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
