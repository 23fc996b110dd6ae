#include "server/startup_gate.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "server/service.h"

namespace verifyd::server {
namespace {

namespace v1 = ::verify::v1;

// VerifyStream's position among the service's methods (proto order: GetInfo, OpenSession,
// Verify, VerifyStream, ...; the malformed-stream test fails if it moves).
constexpr int kVerifyStreamIndex = 3;

}  // namespace

template <typename Call>
grpc::Status GateService::Forward(grpc::ServerContext* ctx, Call call) {
  grpc::Status refusal;
  VerifyServiceImpl* s = Target(*ctx, &refusal);
  return s != nullptr ? call(s) : refusal;
}

GateService::GateService(size_t max_metadata_bytes) : max_metadata_bytes_(max_metadata_bytes) {
  using Raw = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
  MarkMethodStreamed(
      kVerifyStreamIndex,
      new grpc::internal::BidiStreamingHandler<GateService, grpc::ByteBuffer, grpc::ByteBuffer>(
          [](GateService* self, grpc::ServerContext* ctx, Raw* stream) {
            return self->StreamRaw(ctx, stream);
          },
          this));
}

void GateService::Attach(VerifyServiceImpl* impl) {
  absl::MutexLock lock(&mu_);
  impl_ = impl;
}

void GateService::Refuse(const std::string& message) {
  absl::MutexLock lock(&mu_);
  refusal_ = message;
}

VerifyServiceImpl* GateService::Target(const grpc::ServerContext& ctx, grpc::Status* refusal) {
  size_t metadata = 0;
  for (const auto& [key, value] : ctx.client_metadata()) metadata += key.size() + value.size() + 32;
  if (metadata > max_metadata_bytes_) {
    *refusal = grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("request metadata of ", metadata, " bytes is over the server's limit of ",
                     max_metadata_bytes_, " bytes (key + value + 32 an entry)"));
    return nullptr;
  }
  absl::MutexLock lock(&mu_);
  if (!refusal_.empty()) {
    *refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, refusal_);
    return nullptr;
  }
  if (impl_ == nullptr) {
    *refusal = grpc::Status(grpc::StatusCode::UNAVAILABLE, kModelLoadingMessage);
  }
  return impl_;
}

grpc::Status GateService::GetInfo(grpc::ServerContext* ctx, const v1::GetInfoRequest* req,
                                  v1::GetInfoResponse* resp) {
  return Forward(ctx, [&](VerifyServiceImpl* s) { return s->GetInfo(ctx, req, resp); });
}

grpc::Status GateService::OpenSession(grpc::ServerContext* ctx, const v1::OpenSessionRequest* req,
                                      v1::OpenSessionResponse* resp) {
  return Forward(ctx, [&](VerifyServiceImpl* s) { return s->OpenSession(ctx, req, resp); });
}

grpc::Status GateService::Verify(grpc::ServerContext* ctx, const v1::VerifyRequest* req,
                                 v1::VerifyResponse* resp) {
  return Forward(ctx, [&](VerifyServiceImpl* s) { return s->Verify(ctx, req, resp); });
}

grpc::Status GateService::CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* req,
                                       v1::CloseSessionResponse* resp) {
  return Forward(ctx, [&](VerifyServiceImpl* s) { return s->CloseSession(ctx, req, resp); });
}

grpc::Status GateService::TruncateSession(grpc::ServerContext* ctx,
                                          const v1::TruncateSessionRequest* req,
                                          v1::TruncateSessionResponse* resp) {
  return Forward(ctx, [&](VerifyServiceImpl* s) { return s->TruncateSession(ctx, req, resp); });
}

grpc::Status GateService::ForkSession(grpc::ServerContext* ctx, const v1::ForkSessionRequest* req,
                                      v1::ForkSessionResponse* resp) {
  return Forward(ctx, [&](VerifyServiceImpl* s) { return s->ForkSession(ctx, req, resp); });
}

grpc::Status GateService::StreamRaw(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  return Forward(ctx, [&](VerifyServiceImpl* s) { return s->VerifyStreamRaw(ctx, stream); });
}

}  // namespace verifyd::server
