#include "client/verify_client.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/generic/generic_stub.h"

namespace verifyd::client {
namespace v1 = ::verify::v1;

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(s.error_code())),
                      s.error_message());
}

VerifyClient::VerifyClient(const std::string& target, absl::Duration timeout, int max_message_bytes)
    : timeout_(timeout) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  channel_ = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  stub_ = v1::VerifyService::NewStub(channel_);
}

VerifyClient::VerifyClient(std::shared_ptr<grpc::Channel> channel, absl::Duration timeout)
    : channel_(std::move(channel)),
      stub_(v1::VerifyService::NewStub(channel_)),
      timeout_(timeout) {}

void VerifyClient::SetDeadline(grpc::ClientContext* ctx) const {
  if (timeout_ > absl::ZeroDuration()) {
    ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout_));
  }
}

absl::StatusOr<v1::GetInfoResponse> VerifyClient::GetInfo() {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetInfoResponse resp;
  if (auto st = FromGrpcStatus(stub_->GetInfo(&ctx, v1::GetInfoRequest(), &resp)); !st.ok()) {
    return st;
  }
  return resp;
}

absl::StatusOr<OpenResult> VerifyClient::Open(const std::vector<int32_t>& prompt,
                                              const std::string& prefix_session_id,
                                              const SessionOptions& options) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::OpenSessionRequest req;
  req.mutable_prompt_tokens()->Add(prompt.begin(), prompt.end());
  req.set_prefix_session_id(prefix_session_id);
  if (options.temperature != 0 || options.top_p || options.top_k != 0 || options.seed != 0) {
    v1::SamplingParams* sp = req.mutable_sampling();
    sp->set_temperature(options.temperature);
    if (options.top_p) sp->set_top_p(*options.top_p);
    sp->set_top_k(options.top_k);
    sp->set_seed(options.seed);
  }
  if (options.top_logprobs) req.set_top_logprobs(*options.top_logprobs);
  if (!options.hidden_layers.empty()) {
    v1::HiddenStatesRequest* h = req.mutable_hidden_states();
    h->mutable_layers()->Add(options.hidden_layers.begin(), options.hidden_layers.end());
    h->set_include_prompt(options.include_prompt);
    h->set_dtype(options.hidden_fp32 ? v1::HIDDEN_DTYPE_FP32 : v1::HIDDEN_DTYPE_BF16);
  }
  v1::OpenSessionResponse resp;
  if (auto st = FromGrpcStatus(stub_->OpenSession(&ctx, req, &resp)); !st.ok()) return st;
  OpenResult r{resp.session_id(), resp.next_token(), resp.committed_len()};
  r.logprobs.assign(resp.logprobs().begin(), resp.logprobs().end());
  r.hidden_states = resp.hidden_states();
  return r;
}

absl::StatusOr<std::vector<float>> DecodeHiddenStates(const v1::HiddenStates& h) {
  const size_t width = h.dtype() == v1::HIDDEN_DTYPE_FP32 ? 4 : 2;
  const size_t count = static_cast<size_t>(std::max(h.num_tokens(), 0)) *
                       static_cast<size_t>(h.layers_size()) *
                       static_cast<size_t>(std::max(h.hidden_size(), 0));
  if (h.data().size() != count * width) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden_states.data: ", h.data().size(), " bytes, expected ", count * width));
  }
  std::vector<float> out(count);
  const auto* p = reinterpret_cast<const unsigned char*>(h.data().data());
  for (size_t i = 0; i < count; ++i, p += width) {
    uint32_t bits = 0;
    for (size_t k = 0; k < width; ++k) bits |= static_cast<uint32_t>(p[k]) << (8 * k);
    if (width == 2) bits <<= 16;
    std::memcpy(&out[i], &bits, 4);
  }
  return out;
}

namespace {
VerifyOutcome ToOutcome(const v1::VerifyResult& r) {
  VerifyOutcome o;
  o.accepted_nodes.assign(r.accepted_nodes().begin(), r.accepted_nodes().end());
  o.accepted_tokens.assign(r.accepted_tokens().begin(), r.accepted_tokens().end());
  o.bonus_token = r.bonus_token();
  o.committed_len = r.committed_len();
  o.logprobs.assign(r.logprobs().begin(), r.logprobs().end());
  o.hidden_states = r.hidden_states();
  o.stats = r.stats();
  return o;
}

void FillItem(v1::VerifyItem* item, const std::string& session_id, const DraftTree& tree) {
  item->set_session_id(session_id);
  item->mutable_tree()->mutable_tokens()->Add(tree.tokens.begin(), tree.tokens.end());
  item->mutable_tree()->mutable_parents()->Add(tree.parents.begin(), tree.parents.end());
}
}  // namespace

absl::Status VerifyClient::VerifyRaw(const v1::VerifyRequest& req, v1::VerifyResponse* resp) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  return FromGrpcStatus(stub_->Verify(&ctx, req, resp));
}

absl::StatusOr<VerifyOutcome> VerifyClient::Verify(const std::string& session_id,
                                                   const DraftTree& tree,
                                                   const VerifyOptions& options) {
  v1::VerifyRequest req;
  v1::VerifyItem* item = req.add_items();
  FillItem(item, session_id, tree);
  item->set_request_id(options.request_id);
  if (options.expected_committed_len) {
    item->set_expected_committed_len(*options.expected_committed_len);
  }
  v1::VerifyResponse resp;
  if (auto st = VerifyRaw(req, &resp); !st.ok()) return st;
  if (resp.results_size() != 1) {
    return absl::InternalError("server returned a wrong number of results");
  }
  return ToOutcome(resp.results(0));
}

absl::StatusOr<OpenResult> VerifyClient::Truncate(const std::string& session_id,
                                                  int64_t committed_len) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::TruncateSessionRequest req;
  req.set_session_id(session_id);
  req.set_committed_len(committed_len);
  v1::TruncateSessionResponse resp;
  if (auto st = FromGrpcStatus(stub_->TruncateSession(&ctx, req, &resp)); !st.ok()) return st;
  return OpenResult{session_id, resp.next_token(), resp.committed_len()};
}

absl::StatusOr<OpenResult> VerifyClient::Fork(const std::string& session_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::ForkSessionRequest req;
  req.set_session_id(session_id);
  v1::ForkSessionResponse resp;
  if (auto st = FromGrpcStatus(stub_->ForkSession(&ctx, req, &resp)); !st.ok()) return st;
  return OpenResult{resp.session_id(), resp.next_token(), resp.committed_len()};
}

absl::StatusOr<std::vector<VerifyOutcome>> VerifyClient::VerifyMany(
    const std::vector<std::string>& session_ids, const std::vector<DraftTree>& trees) {
  if (session_ids.size() != trees.size()) {
    return absl::InvalidArgumentError("trees: one tree per session id");
  }
  v1::VerifyRequest req;
  for (size_t i = 0; i < trees.size(); ++i) FillItem(req.add_items(), session_ids[i], trees[i]);
  v1::VerifyResponse resp;
  if (auto st = VerifyRaw(req, &resp); !st.ok()) return st;
  if (resp.results_size() != req.items_size()) {
    return absl::InternalError("server returned a wrong number of results");
  }
  std::vector<VerifyOutcome> out;
  for (const auto& r : resp.results()) out.push_back(ToOutcome(r));
  return out;
}

absl::Status VerifyClient::Close(const std::string& session_id) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::CloseSessionRequest req;
  req.set_session_id(session_id);
  v1::CloseSessionResponse resp;
  return FromGrpcStatus(stub_->CloseSession(&ctx, req, &resp));
}

absl::StatusOr<HealthStatus> VerifyClient::Health(const std::string& service) {
  // HealthCheckRequest {string service = 1;} and HealthCheckResponse {enum status = 1;} in
  // protobuf wire format, so the client needs no copy of health.proto.
  std::string request;
  if (!service.empty()) {
    if (service.size() > 127) return absl::InvalidArgumentError("service: name too long");
    request.push_back(0x0A);
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  grpc::Slice slice(request);
  grpc::ByteBuffer req_buf(&slice, 1);
  grpc::ByteBuffer resp_buf;
  grpc::GenericStub stub(channel_);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req_buf, &resp_buf,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (auto st = FromGrpcStatus(status); !st.ok()) return st;
  std::vector<grpc::Slice> slices;
  if (!resp_buf.Dump(&slices).ok()) return absl::InternalError("health: unreadable response");
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes.empty()) return HealthStatus::kUnknown;  // status 0 is not serialized
  if (bytes.size() != 2 || bytes[0] != 0x08 || bytes[1] < 0 || bytes[1] > 3) {
    return absl::InternalError("health: unexpected response");
  }
  return static_cast<HealthStatus>(bytes[1]);
}

std::unique_ptr<VerifyStreamClient> VerifyClient::OpenStream() {
  return std::make_unique<VerifyStreamClient>(stub_.get());
}

VerifyStreamClient::VerifyStreamClient(v1::VerifyService::Stub* stub)
    : stream_(stub->VerifyStream(&ctx_)) {}

absl::StatusOr<v1::VerifyResponse> VerifyStreamClient::RoundTrip(const v1::VerifyRequest& req) {
  if (done_) return absl::FailedPreconditionError("stream already finished");
  v1::VerifyResponse resp;
  if (!stream_->Write(req) || !stream_->Read(&resp)) {
    done_ = true;
    absl::Status st = FromGrpcStatus(stream_->Finish());
    return st.ok() ? absl::UnavailableError("stream closed by the server") : st;
  }
  return resp;
}

absl::Status VerifyStreamClient::Finish() {
  if (done_) return absl::OkStatus();
  done_ = true;
  stream_->WritesDone();
  return FromGrpcStatus(stream_->Finish());
}

absl::StatusOr<std::vector<int32_t>> ParseIntList(const std::string& text,
                                                  const std::string& field) {
  std::vector<int32_t> out;
  if (absl::StripAsciiWhitespace(text).empty()) return out;
  int i = 0;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: '", part, "' is not an integer"));
    }
    out.push_back(v);
    ++i;
  }
  return out;
}

}  // namespace verifyd::client
