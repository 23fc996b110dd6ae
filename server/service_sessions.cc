// The session RPCs of VerifyServiceImpl: OpenSession (optionally on another session's
// prefix), CloseSession, TruncateSession and ForkSession. See server/service.h.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"
#include "server/service.h"

namespace verifyd::server {
namespace {

namespace v1 = ::verify::v1;

absl::Status SessionIdPresent(const std::string& id, const std::string& field) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifyServiceImpl::DoOpen(grpc::ServerContext* ctx, const v1::OpenSessionRequest& req,
                                       v1::OpenSessionResponse* resp) {
  const absl::Time deadline = Deadline(*ctx, absl::Now());
  const absl::Time start = absl::Now();
  VERIFYD_RETURN_IF_ERROR(ValidatePrompt(req, limits_));
  VERIFYD_ASSIGN_OR_RETURN(SessionConfig config, SessionConfigFromRequest(req, limits_));
  if (limits_.max_response_bytes > 0) {
    // Checked before anything runs: the prompt's hidden states, and one Verify round's.
    const int64_t open_bytes = OpenResponseBytesBound(config, req.prompt_tokens_size(), limits_);
    if (open_bytes > limits_.max_response_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "hidden_states.include_prompt: the prompt's hidden states (",
          HiddenStatesBytes(config, req.prompt_tokens_size(), limits_),
          " bytes) exceed the server's --max_message_bytes ", limits_.max_response_bytes,
          "; open without include_prompt, with fewer layers or a shorter prompt"));
    }
    const int64_t round_bytes = VerifyResultBytesBound(config, 0, 0, 64, limits_);
    if (round_bytes > limits_.max_response_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "hidden_states.layers: one token's hidden states (",
          HiddenStatesBytes(config, 1, limits_),
          " bytes) do not fit in the server's --max_message_bytes ", limits_.max_response_bytes));
    }
  }
  if (scheduler_->engine_failed()) return absl::UnavailableError("engine failed");
  const std::string owner = Owner(*ctx);
  const std::vector<int32_t> prompt(req.prompt_tokens().begin(), req.prompt_tokens().end());
  // A prefix session is held (busy) only until its slots are shared with the new session.
  std::shared_ptr<Session> prefix;
  if (!req.prefix_session_id().empty()) {
    auto p = AcquireSession(ctx, req.prefix_session_id(), owner, deadline, "prefix_session_id");
    if (!p.ok()) return p.status();
    prefix = *std::move(p);
    if (absl::Status st =
            CheckPrefixPrompt(prefix->committed_len(), static_cast<int>(prompt.size()), limits_);
        !st.ok()) {
      sessions_->Release(prefix);
      return st;
    }
  }
  std::vector<int32_t> prompt_slots;
  auto session =
      sessions_->Create(static_cast<int64_t>(prompt.size()), &prompt_slots, owner, prefix.get());
  if (prefix) sessions_->Release(prefix);
  if (!session.ok()) return session.status();
  (*session)->config = config;  // busy and not yet ready: only this handler sees it
  JobTiming timing;
  PrefillOutputs outputs;
  absl::StatusOr<int32_t> next = scheduler_->Prefill(*session, prompt, prompt_slots, &timing,
                                                     Bounds(ctx, deadline).cancelled, &outputs);
  if (!next.ok()) {
    sessions_->Discard(*session, prompt_slots);
    return MapCancelled(next.status(), deadline);
  }
  sessions_->MarkReady(*session);
  resp->set_session_id((*session)->id);
  resp->set_next_token(*next);
  resp->set_committed_len((*session)->committed_len());
  FillLogprobs(outputs.logprobs, resp->mutable_logprobs());
  if (config.include_prompt && !config.hidden_layers.empty()) {
    FillHiddenStates(config, limits_.hidden_size, outputs.hidden, resp->mutable_hidden_states());
  }
  sessions_->Release(*session);
  metrics_->ObservePrefill(timing.queue_s, timing.engine_s,
                           absl::ToDoubleSeconds(absl::Now() - start),
                           static_cast<int64_t>(prompt.size()), config.sampling.sampled());
  return absl::OkStatus();
}

grpc::Status VerifyServiceImpl::OpenSession(grpc::ServerContext* ctx,
                                            const v1::OpenSessionRequest* req,
                                            v1::OpenSessionResponse* resp) {
  return Handle(
      "OpenSession", [&] { return DoOpen(ctx, *req, resp); },
      [&] {
        return absl::StrCat("prompt_len=", req->prompt_tokens_size(),
                            " prefix=", req->prefix_session_id(), " session=", resp->session_id());
      });
}

grpc::Status VerifyServiceImpl::CloseSession(grpc::ServerContext* ctx,
                                             const v1::CloseSessionRequest* req,
                                             v1::CloseSessionResponse*) {
  auto close = [&] {
    absl::Status st = SessionIdPresent(req->session_id(), "session_id");
    if (st.ok()) st = sessions_->Close(req->session_id(), Owner(*ctx));
    if (!st.ok() && st.code() == absl::StatusCode::kNotFound) st = WithField(st, "session_id");
    return st;
  };
  return Handle("CloseSession", close, [&] { return absl::StrCat("session=", req->session_id()); });
}

absl::Status VerifyServiceImpl::DoTruncate(grpc::ServerContext* ctx,
                                           const v1::TruncateSessionRequest& req,
                                           v1::TruncateSessionResponse* resp) {
  const absl::Time deadline = Deadline(*ctx, absl::Now());
  VERIFYD_RETURN_IF_ERROR(SessionIdPresent(req.session_id(), "session_id"));
  if (req.committed_len() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("committed_len: ", req.committed_len(), " must be >= 1"));
  }
  auto s = AcquireSession(ctx, req.session_id(), Owner(*ctx), deadline, "session_id");
  if (!s.ok()) return s.status();
  const int64_t len = (*s)->committed_len();
  if (req.committed_len() > len) {
    sessions_->Release(*s);
    return absl::InvalidArgumentError(absl::StrCat("committed_len: ", req.committed_len(),
                                                   " exceeds the session's committed_len ", len));
  }
  sessions_->Truncate(*s, req.committed_len());
  resp->set_next_token((*s)->pending);
  resp->set_committed_len((*s)->committed_len());
  sessions_->Release(*s);
  return absl::OkStatus();
}

grpc::Status VerifyServiceImpl::TruncateSession(grpc::ServerContext* ctx,
                                                const v1::TruncateSessionRequest* req,
                                                v1::TruncateSessionResponse* resp) {
  return Handle(
      "TruncateSession", [&] { return DoTruncate(ctx, *req, resp); },
      [&] { return absl::StrCat("session=", req->session_id(), " len=", req->committed_len()); });
}

absl::Status VerifyServiceImpl::DoFork(grpc::ServerContext* ctx, const v1::ForkSessionRequest& req,
                                       v1::ForkSessionResponse* resp) {
  const absl::Time deadline = Deadline(*ctx, absl::Now());
  VERIFYD_RETURN_IF_ERROR(SessionIdPresent(req.session_id(), "session_id"));
  const std::string owner = Owner(*ctx);
  auto parent = AcquireSession(ctx, req.session_id(), owner, deadline, "session_id");
  if (!parent.ok()) return parent.status();
  auto child = sessions_->Fork(*parent, owner);
  if (child.ok()) {
    // Read from the parent while we still hold it (the child is already idle and could, in
    // principle, be expired by a very short TTL); the child starts from the same point.
    resp->set_session_id((*child)->id);
    resp->set_next_token((*parent)->pending);
    resp->set_committed_len((*parent)->committed_len());
  }
  sessions_->Release(*parent);
  if (!child.ok()) return child.status();
  return absl::OkStatus();
}

grpc::Status VerifyServiceImpl::ForkSession(grpc::ServerContext* ctx,
                                            const v1::ForkSessionRequest* req,
                                            v1::ForkSessionResponse* resp) {
  return Handle(
      "ForkSession", [&] { return DoFork(ctx, *req, resp); },
      [&] { return absl::StrCat("parent=", req->session_id(), " session=", resp->session_id()); });
}

}  // namespace verifyd::server
