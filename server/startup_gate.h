// GateService: the VerifyService verifyd registers with gRPC. It exists before the model is
// loaded, so the API port can listen (and answer) during a load that takes minutes:
//   loading   every call is UNAVAILABLE "model loading ..." (health says NOT_SERVING);
//   attached  every call is forwarded to the VerifyServiceImpl given to Attach();
//   refusing  after Refuse() (an engine failure, before the server shuts down): every call,
//             new or forwarded later, is UNAVAILABLE with the refusal's message.
// Every call whose metadata is over the soft limit is RESOURCE_EXHAUSTED by itself (gRPC 1.51's
// own limit fails the whole connection; server/server.h sets it higher). VerifyStream is
// registered over undecoded messages (VerifyServiceImpl::VerifyStreamRaw), so
// a malformed stream message ends its stream with INVALID_ARGUMENT instead of a silent OK.
//
// Thread-safety: Attach() and Refuse() may be called from any thread while calls run; the
// attached service must outlive the gRPC server.
#pragma once

#include <atomic>
#include <string>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "verify/v1/verify.grpc.pb.h"

namespace verifyd::server {

class VerifyServiceImpl;

// The message of calls answered while the model loads.
inline constexpr char kModelLoadingMessage[] =
    "model loading: verifyd is starting and serves once its model is loaded (health reports "
    "NOT_SERVING until then); retry later";

class GateService final : public verify::v1::VerifyService::Service {
 public:
  // `max_metadata_bytes`: the largest call metadata served (key + value + 32 bytes an entry).
  explicit GateService(size_t max_metadata_bytes);

  void Attach(VerifyServiceImpl* impl);
  void Refuse(const std::string& message);

  grpc::Status GetInfo(grpc::ServerContext* ctx, const verify::v1::GetInfoRequest* req,
                       verify::v1::GetInfoResponse* resp) override;
  grpc::Status OpenSession(grpc::ServerContext* ctx, const verify::v1::OpenSessionRequest* req,
                           verify::v1::OpenSessionResponse* resp) override;
  grpc::Status Verify(grpc::ServerContext* ctx, const verify::v1::VerifyRequest* req,
                      verify::v1::VerifyResponse* resp) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const verify::v1::CloseSessionRequest* req,
                            verify::v1::CloseSessionResponse* resp) override;
  grpc::Status TruncateSession(grpc::ServerContext* ctx,
                               const verify::v1::TruncateSessionRequest* req,
                               verify::v1::TruncateSessionResponse* resp) override;
  grpc::Status ForkSession(grpc::ServerContext* ctx, const verify::v1::ForkSessionRequest* req,
                           verify::v1::ForkSessionResponse* resp) override;

 private:
  // The service to forward the call to, or null with `*refusal` set to its status
  // (RESOURCE_EXHAUSTED for oversized metadata, else UNAVAILABLE).
  VerifyServiceImpl* Target(const grpc::ServerContext& ctx, grpc::Status* refusal);
  // `call(service)` when the call may be forwarded, else its refusal.
  template <typename Call>
  grpc::Status Forward(grpc::ServerContext* ctx, Call call);
  grpc::Status StreamRaw(grpc::ServerContext* ctx,
                         grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);

  const size_t max_metadata_bytes_;
  absl::Mutex mu_;
  VerifyServiceImpl* impl_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string refusal_ ABSL_GUARDED_BY(mu_);  // "" = not refusing
};

}  // namespace verifyd::server
