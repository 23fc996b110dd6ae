// The gRPC VerifyService: thin handlers that validate, hand work to the scheduler, wait for
// their own result and map absl::Status to grpc::Status (the only place that does), with
// messages that name the offending field and leak no internals (Internal errors become a
// generic message with the request id; details go to the log). GetInfo and the Verify
// calls live in service.cc; the session RPCs (open, close, truncate, fork) in
// service_sessions.cc.
//
// Thread-safety: handlers run concurrently on gRPC's threads; all shared state lives in the
// thread-safe SessionManager, SlotAllocator, Scheduler and Metrics.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/security.h"
#include "server/session_manager.h"
#include "server/slot_allocator.h"
#include "server/validation.h"
#include "tp/engine.h"
#include "verify/v1/verify.grpc.pb.h"

namespace verifyd::server {

// absl -> grpc at the RPC edge. Internal/Unknown/DataLoss messages are replaced.
grpc::Status ToGrpcStatus(const absl::Status& st, uint64_t request_id);

// Engine outputs as API messages.
void FillLogprobs(const std::vector<tp::RowLogprobs>& in,
                  google::protobuf::RepeatedPtrField<verify::v1::TokenLogprobs>* out);
// `hidden`: [tokens][layers][hidden_size] float32 -> little-endian bf16 (round to nearest
// even) or float32 bytes, as the session's config asks.
void FillHiddenStates(const SessionConfig& config, int64_t hidden_size,
                      const std::vector<float>& hidden, verify::v1::HiddenStates* out);
void FillStats(const SessionCounters& in, verify::v1::SessionStats* out);

class VerifyServiceImpl final : public verify::v1::VerifyService::Service {
 public:
  VerifyServiceImpl(tp::Engine* engine, SessionManager* sessions, SlotAllocator* slots,
                    Scheduler* scheduler, Metrics* metrics, ApiLimits limits, int max_sessions,
                    std::string version);

  grpc::Status GetInfo(grpc::ServerContext* ctx, const verify::v1::GetInfoRequest* req,
                       verify::v1::GetInfoResponse* resp) override;
  grpc::Status OpenSession(grpc::ServerContext* ctx, const verify::v1::OpenSessionRequest* req,
                           verify::v1::OpenSessionResponse* resp) override;
  grpc::Status Verify(grpc::ServerContext* ctx, const verify::v1::VerifyRequest* req,
                      verify::v1::VerifyResponse* resp) override;
  grpc::Status VerifyStream(grpc::ServerContext* ctx,
                            grpc::ServerReaderWriter<verify::v1::VerifyResponse,
                                                     verify::v1::VerifyRequest>* stream) override;
  // VerifyStream over undecoded messages (what the server registers, server/startup_gate.h):
  // a message that does not parse as a VerifyRequest ends the stream with INVALID_ARGUMENT
  // naming its position, where the typed stream's Read() would report it as the client's
  // half-close and end with OK.
  grpc::Status VerifyStreamRaw(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);
  grpc::Status CloseSession(grpc::ServerContext* ctx, const verify::v1::CloseSessionRequest* req,
                            verify::v1::CloseSessionResponse* resp) override;
  grpc::Status TruncateSession(grpc::ServerContext* ctx,
                               const verify::v1::TruncateSessionRequest* req,
                               verify::v1::TruncateSessionResponse* resp) override;
  grpc::Status ForkSession(grpc::ServerContext* ctx, const verify::v1::ForkSessionRequest* req,
                           verify::v1::ForkSessionResponse* resp) override;

  // Transport-independent core of Verify (used by Verify and VerifyStream).
  absl::Status DoVerify(const verify::v1::VerifyRequest& req, verify::v1::VerifyResponse* resp,
                        uint64_t request_id, grpc::ServerContext* ctx);

  // Call policy, set once before serving: `security` (not owned; null = no identities) binds
  // sessions to the caller's identity; `max_call_deadline` caps the time a call may wait and
  // run (calls without a deadline get this one; an earlier client deadline wins).
  void SetCallPolicy(const Security* security, absl::Duration max_call_deadline);

 private:
  // The caller's identity sessions are bound to ("" when the API has none).
  std::string Owner(const grpc::ServerContext& ctx) const;
  // The effective deadline of a call (or of one stream message) that started at `start`.
  absl::Time Deadline(const grpc::ServerContext& ctx, absl::Time start) const;
  // How long a call may wait for a busy session: until `deadline`, or until the caller goes.
  static WaitBounds Bounds(grpc::ServerContext* ctx, absl::Time deadline);
  // Transport-independent cores of the session RPCs (server/service_sessions.cc).
  absl::Status DoOpen(grpc::ServerContext* ctx, const verify::v1::OpenSessionRequest& req,
                      verify::v1::OpenSessionResponse* resp);
  absl::Status DoTruncate(grpc::ServerContext* ctx, const verify::v1::TruncateSessionRequest& req,
                          verify::v1::TruncateSessionResponse* resp);
  absl::Status DoFork(grpc::ServerContext* ctx, const verify::v1::ForkSessionRequest& req,
                      verify::v1::ForkSessionResponse* resp);
  // Cancelled from the scheduler becomes DeadlineExceeded once `deadline` has passed.
  static absl::Status MapCancelled(const absl::Status& st, absl::Time deadline);
  // SessionManager::Acquire of session `id` (named `field` in the request) for `owner`,
  // waiting at most until `deadline`: NOT_FOUND names the field, a cancelled wait maps as
  // MapCancelled.
  absl::StatusOr<std::shared_ptr<Session>> AcquireSession(grpc::ServerContext* ctx,
                                                          const std::string& id,
                                                          const std::string& owner,
                                                          absl::Time deadline, const char* field);

  // The VerifyStream loop: `read` fills the request and returns kMessage, kEnd (half-close or
  // the client went) or kMalformed; `write` sends a response (false: the client went).
  enum class StreamRead { kMessage, kEnd, kMalformed };
  template <typename ReadFn, typename WriteFn>
  grpc::Status StreamLoop(grpc::ServerContext* ctx, ReadFn read, WriteFn write);

  grpc::Status Finish(const char* method, uint64_t request_id, const absl::Status& st,
                      absl::Time start, const std::string& detail);
  // One unary RPC: a request id and start time, `core()` (the status), then Finish with
  // `detail()`, read after the core (it may name what the core created).
  template <typename Core, typename Detail>
  grpc::Status Handle(const char* method, Core core, Detail detail) {
    const uint64_t id = next_request_id_++;
    const absl::Time start = absl::Now();
    const absl::Status st = core();
    return Finish(method, id, st, start, detail());
  }

  tp::Engine* const engine_;
  SessionManager* const sessions_;
  SlotAllocator* const slots_;
  Scheduler* const scheduler_;
  Metrics* const metrics_;
  const ApiLimits limits_;
  const int max_sessions_;
  const std::string version_;
  const Security* security_ = nullptr;
  absl::Duration max_call_deadline_ = absl::InfiniteDuration();
  std::atomic<uint64_t> next_request_id_{1};
};

}  // namespace verifyd::server
