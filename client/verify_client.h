// verifyd_client: a thin C++ wrapper over the VerifyService stub with absl::Status results
// (gRPC codes map one to one to absl codes; messages are the server's), plus the standard
// grpc.health.v1 check (done through a generic stub, so no health proto is needed here).
//
// Thread-safety: a VerifyClient may be shared by threads (gRPC stubs are thread-safe); a
// VerifyStreamClient is for one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "verify/v1/verify.grpc.pb.h"

namespace verifyd::client {

struct OpenResult {
  std::string session_id;
  int32_t next_token = -1;  // the pending token
  int64_t committed_len = 0;
  std::vector<verify::v1::TokenLogprobs> logprobs;  // with top_logprobs: next_token's
  verify::v1::HiddenStates hidden_states;           // with include_prompt
};

struct VerifyOutcome {
  std::vector<int32_t> accepted_nodes;
  std::vector<int32_t> accepted_tokens;
  int32_t bonus_token = -1;
  int64_t committed_len = 0;
  std::vector<verify::v1::TokenLogprobs> logprobs;  // accepted tokens, then the bonus
  verify::v1::HiddenStates hidden_states;           // the tokens the round committed
  verify::v1::SessionStats stats;
};

// How a session draws its tokens and what it returns (OpenSessionRequest's options).
struct SessionOptions {
  float temperature = 0;                // 0: greedy
  std::optional<float> top_p;           // unset: 1
  int32_t top_k = 0;                    // 0: off
  uint64_t seed = 0;                    // sampling seed
  std::optional<int32_t> top_logprobs;  // unset: no logprobs
  std::vector<int32_t> hidden_layers;   // empty: no hidden states
  bool include_prompt = false;
  bool hidden_fp32 = false;  // else bf16
  bool sampled() const { return temperature > 0; }
};

// The float32 values of a HiddenStates message ([num_tokens][layers][hidden_size]).
absl::StatusOr<std::vector<float>> DecodeHiddenStates(const verify::v1::HiddenStates& h);

struct DraftTree {
  std::vector<int32_t> tokens;
  std::vector<int32_t> parents;  // -1 = child of the pending token, else an earlier index
};

// Per-item options of a Verify (see the retry recipe in verify.proto).
struct VerifyOptions {
  std::string request_id;                         // "" = no deduplication
  std::optional<int64_t> expected_committed_len;  // unset = no check
};

enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

absl::Status FromGrpcStatus(const grpc::Status& s);

class VerifyStreamClient;

class VerifyClient {
 public:
  // `target`: host:port. `timeout`: per-call deadline (<= 0: none).
  explicit VerifyClient(const std::string& target, absl::Duration timeout = absl::Seconds(60),
                        int max_message_bytes = 16 << 20);
  explicit VerifyClient(std::shared_ptr<grpc::Channel> channel,
                        absl::Duration timeout = absl::Seconds(60));

  absl::StatusOr<verify::v1::GetInfoResponse> GetInfo();
  // `prefix_session_id` (optional): start from that session's committed tokens.
  absl::StatusOr<OpenResult> Open(const std::vector<int32_t>& prompt,
                                  const std::string& prefix_session_id = "",
                                  const SessionOptions& options = {});
  // One session, one tree.
  absl::StatusOr<VerifyOutcome> Verify(const std::string& session_id, const DraftTree& tree,
                                       const VerifyOptions& options = {});
  // Rolls the session back to its first `committed_len` tokens; returns the new pending token
  // (next_token) and committed_len (session_id is the given one).
  absl::StatusOr<OpenResult> Truncate(const std::string& session_id, int64_t committed_len);
  // A new session continuing from the same point as `session_id` (shared KV).
  absl::StatusOr<OpenResult> Fork(const std::string& session_id);
  // Several sessions in one call (results in item order).
  absl::StatusOr<std::vector<VerifyOutcome>> VerifyMany(const std::vector<std::string>& session_ids,
                                                        const std::vector<DraftTree>& trees);
  absl::Status Close(const std::string& session_id);
  // grpc.health.v1.Health/Check for `service` ("" = the whole server).
  absl::StatusOr<HealthStatus> Health(const std::string& service = "");
  // Opens a VerifyStream (no deadline).
  std::unique_ptr<VerifyStreamClient> OpenStream();

  // Raw call (tests send malformed requests on purpose).
  absl::Status VerifyRaw(const verify::v1::VerifyRequest& req, verify::v1::VerifyResponse* resp);

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }

 private:
  void SetDeadline(grpc::ClientContext* ctx) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<verify::v1::VerifyService::Stub> stub_;
  absl::Duration timeout_;
};

// One bidirectional VerifyStream: Send a request, Receive its response, in order.
class VerifyStreamClient {
 public:
  explicit VerifyStreamClient(verify::v1::VerifyService::Stub* stub);
  // One round trip: writes `req` and reads its response. After an error the stream is over
  // and the status is the server's.
  absl::StatusOr<verify::v1::VerifyResponse> RoundTrip(const verify::v1::VerifyRequest& req);
  // Half-closes and returns the final status.
  absl::Status Finish();

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<verify::v1::VerifyRequest, verify::v1::VerifyResponse>>
      stream_;
  bool done_ = false;
};

// "1,2,3" -> {1,2,3} (InvalidArgument naming `field` on a bad number).
absl::StatusOr<std::vector<int32_t>> ParseIntList(const std::string& text,
                                                  const std::string& field);

}  // namespace verifyd::client
