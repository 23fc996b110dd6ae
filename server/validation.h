// Request validation for the verify API, independent of the transport: every check names the
// offending field ("items[2].tree.parents[5]: ...") in an InvalidArgument status.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/session_manager.h"
#include "verify/v1/verify.pb.h"

namespace verifyd::server {

struct ApiLimits {
  int64_t vocab_size = 0;
  int max_draft_nodes = 64;  // nodes per tree (engine max_tail_rows - 1)
  int64_t max_context = 0;   // committed_len + 1 + nodes <= max_context
  int max_batch = 64;        // items per Verify call
  int64_t num_hidden_layers = 0;
  int64_t hidden_size = 0;
  int64_t max_response_bytes = 0;  // largest response message (--max_message_bytes); 0: none
};

// Prompt: non-empty, tokens in [0, vocab), length <= max_context - 1 (room for the pending
// token's row).
absl::Status ValidatePrompt(const verify::v1::OpenSessionRequest& req, const ApiLimits& limits);

// The sampling, logprobs and hidden-state options of an OpenSession as a SessionConfig:
// temperature finite and >= 0, top_p in (0, 1] when set, top_k >= 0, top_logprobs in
// [0, kMaxTopLogprobs] when set, hidden layers non-empty, distinct and in
// [0, num_hidden_layers), a known dtype. InvalidArgument naming the field.
absl::StatusOr<SessionConfig> SessionConfigFromRequest(const verify::v1::OpenSessionRequest& req,
                                                       const ApiLimits& limits);

// Bytes of the hidden states of `tokens` tokens for `config` (0 without hidden states).
int64_t HiddenStatesBytes(const SessionConfig& config, int64_t tokens, const ApiLimits& limits);

// An upper bound of the serialized size of one VerifyResult of a session with `config` for a
// tree of `nodes` nodes and depth `depth` (at most depth accepted tokens, depth + 1 emitted
// and committed ones), session id of `id_bytes` bytes, including its framing in the response.
int64_t VerifyResultBytesBound(const SessionConfig& config, int nodes, int depth, size_t id_bytes,
                               const ApiLimits& limits);
// The same for an OpenSessionResponse with a prompt of `prompt_len` tokens.
int64_t OpenResponseBytesBound(const SessionConfig& config, int64_t prompt_len,
                               const ApiLimits& limits);

// Depth of the deepest node of a tree (0 for an empty tree); the tree must be valid.
int TreeDepth(const verify::v1::DraftTree& tree);

// One tree: sizes, node count, tokens in range, parents -1 or in [0, i). `field` prefixes
// the messages (e.g. "items[3].tree").
absl::Status ValidateTree(const verify::v1::DraftTree& tree, const ApiLimits& limits,
                          const std::string& field);

// The whole request: 1..max_batch items, session ids present and distinct, request ids at
// most kMaxRequestIdBytes, every tree valid; a non-empty draft_probs is Unimplemented (no
// multi-draft rejection sampling).
// Context length needs the session and is checked by the caller (CheckContext).
absl::Status ValidateVerifyRequest(const verify::v1::VerifyRequest& req, const ApiLimits& limits);

// With OpenSessionRequest.prefix_session_id: prefix + prompt tokens <= max_context - 1.
absl::Status CheckPrefixPrompt(int64_t prefix_len, int prompt_len, const ApiLimits& limits);

// Prefixes a status message with a field name ("items[0].session_id: ..."), keeping the code.
absl::Status WithField(const absl::Status& st, const std::string& field);

// committed_len + 1 (pending row) + nodes must not exceed max_context.
absl::Status CheckContext(int64_t committed_len, int nodes, const ApiLimits& limits,
                          const std::string& field);

}  // namespace verifyd::server
