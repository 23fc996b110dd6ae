#include "server/service.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common.h"
#include "kernels/status.h"
#include "server/security.h"
#include "spdlog/spdlog.h"

namespace verifyd::server {
namespace {

namespace v1 = ::verify::v1;

// What identifies a Verify item for a retry: its draft tree (expected_committed_len is a
// precondition, not content: a retry may add it).
uint64_t ItemFingerprint(const v1::VerifyItem& item) {
  const std::vector<int32_t> tokens(item.tree().tokens().begin(), item.tree().tokens().end());
  const std::vector<int32_t> parents(item.tree().parents().begin(), item.tree().parents().end());
  return absl::Hash<std::tuple<std::vector<int32_t>, std::vector<int32_t>>>{}(
      std::make_tuple(tokens, parents));
}

std::string CodeName(grpc::StatusCode code) {
  // grpc::StatusCode and absl::StatusCode have the same values and names; a code neither
  // knows is "UNKNOWN".
  const std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? "UNKNOWN" : name;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& st, uint64_t request_id) {
  if (st.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(static_cast<int>(st.code()));
  switch (st.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      return grpc::Status(code, absl::StrCat("internal error (request id ", request_id, ")"));
    default:
      return grpc::Status(code, std::string(st.message()));
  }
}

void FillLogprobs(const std::vector<tp::RowLogprobs>& in,
                  google::protobuf::RepeatedPtrField<v1::TokenLogprobs>* out) {
  for (const tp::RowLogprobs& r : in) {
    v1::TokenLogprobs* t = out->Add();
    t->set_token(r.token);
    t->set_logprob(r.logprob);
    t->mutable_top_tokens()->Add(r.top_tokens.begin(), r.top_tokens.end());
    t->mutable_top_logprobs()->Add(r.top_logprobs.begin(), r.top_logprobs.end());
  }
}

void FillHiddenStates(const SessionConfig& config, int64_t hidden_size,
                      const std::vector<float>& hidden, v1::HiddenStates* out) {
  const int64_t per_token = static_cast<int64_t>(config.hidden_layers.size()) * hidden_size;
  out->mutable_layers()->Add(config.hidden_layers.begin(), config.hidden_layers.end());
  out->set_hidden_size(static_cast<int32_t>(hidden_size));
  out->set_num_tokens(
      per_token > 0 ? static_cast<int32_t>(static_cast<int64_t>(hidden.size()) / per_token) : 0);
  out->set_dtype(config.hidden_fp32 ? v1::HIDDEN_DTYPE_FP32 : v1::HIDDEN_DTYPE_BF16);
  std::string* data = out->mutable_data();
  const size_t width = config.hidden_fp32 ? 4 : 2;
  data->resize(hidden.size() * width);
  char* p = data->data();
  for (float f : hidden) {
    uint32_t bits;
    if (config.hidden_fp32) {
      std::memcpy(&bits, &f, 4);
    } else {
      bits = kernels::FloatToBf16(f);
    }
    for (size_t k = 0; k < width; ++k) *p++ = static_cast<char>((bits >> (8 * k)) & 0xffu);
  }
}

void FillStats(const SessionCounters& in, v1::SessionStats* out) {
  out->set_rounds(in.rounds);
  out->set_draft_tokens(in.draft_tokens);
  out->set_accepted_tokens(in.accepted_tokens);
  out->mutable_accepted_by_depth()->Add(in.accepted_by_depth.begin(), in.accepted_by_depth.end());
}

VerifyServiceImpl::VerifyServiceImpl(tp::Engine* engine, SessionManager* sessions,
                                     SlotAllocator* slots, Scheduler* scheduler, Metrics* metrics,
                                     ApiLimits limits, int max_sessions, std::string version)
    : engine_(engine),
      sessions_(sessions),
      slots_(slots),
      scheduler_(scheduler),
      metrics_(metrics),
      limits_(limits),
      max_sessions_(max_sessions),
      version_(std::move(version)) {}

void VerifyServiceImpl::SetCallPolicy(const Security* security, absl::Duration max_call_deadline) {
  security_ = security;
  max_call_deadline_ = max_call_deadline;
}

std::string VerifyServiceImpl::Owner(const grpc::ServerContext& ctx) const {
  if (security_ == nullptr || !security_->identities()) return "";
  return ClientIdentity(ctx, *security_);
}

absl::Time VerifyServiceImpl::Deadline(const grpc::ServerContext& ctx, absl::Time start) const {
  return std::min(absl::FromChrono(ctx.deadline()), start + max_call_deadline_);
}

WaitBounds VerifyServiceImpl::Bounds(grpc::ServerContext* ctx, absl::Time deadline) {
  WaitBounds b;
  b.deadline = deadline;
  b.cancelled = [ctx, deadline] { return ctx->IsCancelled() || absl::Now() >= deadline; };
  return b;
}

absl::StatusOr<std::shared_ptr<Session>> VerifyServiceImpl::AcquireSession(grpc::ServerContext* ctx,
                                                                           const std::string& id,
                                                                           const std::string& owner,
                                                                           absl::Time deadline,
                                                                           const char* field) {
  auto s = sessions_->Acquire(id, owner, Bounds(ctx, deadline));
  if (s.ok()) return s;
  if (s.status().code() == absl::StatusCode::kNotFound) return WithField(s.status(), field);
  return MapCancelled(s.status(), deadline);
}

absl::Status VerifyServiceImpl::MapCancelled(const absl::Status& st, absl::Time deadline) {
  if (st.code() == absl::StatusCode::kCancelled && absl::Now() >= deadline) {
    return absl::DeadlineExceededError(
        "deadline exceeded before the request finished (calls without a deadline get the "
        "server's maximum)");
  }
  return st;
}

grpc::Status VerifyServiceImpl::Finish(const char* method, uint64_t request_id,
                                       const absl::Status& st, absl::Time start,
                                       const std::string& detail) {
  grpc::Status g = ToGrpcStatus(st, request_id);
  const std::string code = CodeName(g.error_code());
  metrics_->CountRequest(method, code);
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (st.ok()) {
    spdlog::debug("rpc={} req={} code={} ms={:.3f} {}", method, request_id, code, ms,
                  ForLog(detail));
  } else if (g.error_code() == grpc::INTERNAL || g.error_code() == grpc::UNKNOWN) {
    spdlog::error("rpc={} req={} code={} ms={:.3f} error=\"{}\" {}", method, request_id, code, ms,
                  ForLog(st.message()), ForLog(detail));
  } else {
    spdlog::info("rpc={} req={} code={} ms={:.3f} error=\"{}\" {}", method, request_id, code, ms,
                 ForLog(st.message()), ForLog(detail));
  }
  return g;
}

grpc::Status VerifyServiceImpl::GetInfo(grpc::ServerContext*, const v1::GetInfoRequest*,
                                        v1::GetInfoResponse* resp) {
  const uint64_t id = next_request_id_++;
  const absl::Time start = absl::Now();
  const tp::ModelConfig& c = engine_->config();
  v1::ModelInfo* m = resp->mutable_model();
  m->set_name(c.name);
  m->set_vocab_size(c.vocab_size);
  m->set_hidden_size(c.hidden_size);
  m->set_num_hidden_layers(c.num_hidden_layers);
  m->set_num_attention_heads(c.num_attention_heads);
  m->set_q_lora_rank(c.q_lora_rank);
  m->set_kv_lora_rank(c.kv_lora_rank);
  m->set_qk_nope_head_dim(c.qk_nope_head_dim);
  m->set_qk_rope_head_dim(c.qk_rope_head_dim);
  m->set_v_head_dim(c.v_head_dim);
  m->set_intermediate_size(c.intermediate_size);
  m->set_max_position_embeddings(c.max_position_embeddings);
  resp->set_tp_size(engine_->tp_size());
  resp->set_backend(engine_->backend());
  resp->set_version(version_);
  resp->set_exact_lossless(engine_->batch_invariant());
  resp->set_kv_cache_dtype(engine_->kv_cache_dtype());
  // Only engines with device memory report it (the CPU and toy engines leave it zero).
  const tp::EngineMemory mem = engine_->memory();
  if (mem.device_bytes > 0) {
    v1::MemoryInfo* mi = resp->mutable_memory();
    mi->set_device_bytes(mem.device_bytes);
    mi->set_weight_bytes(mem.weight_bytes);
    mi->set_workspace_bytes(mem.workspace_bytes);
    mi->set_kv_cache_bytes(mem.kv_cache_bytes);
    mi->set_kv_bytes_per_token(mem.kv_bytes_per_token);
    mi->set_kv_tokens(mem.kv_tokens);
    mi->set_used_before_kv_bytes(mem.used_before_kv_bytes);
    mi->set_planned_before_kv_bytes(mem.planned_before_kv_bytes);
  }
  v1::Limits* l = resp->mutable_limits();
  l->set_max_draft_nodes(limits_.max_draft_nodes);
  l->set_max_context(limits_.max_context);
  l->set_max_batch(limits_.max_batch);
  l->set_kv_slots(slots_->kv_slots());
  l->set_max_sessions(max_sessions_);
  l->set_max_prompt_tokens(static_cast<int32_t>(limits_.max_context - 1));
  return Finish("GetInfo", id, absl::OkStatus(), start, "");
}

namespace {

// A Verify call's items against their sessions: the ones that run and the replays.
struct VerifyPlan {
  std::vector<VerifyWork> work;
  std::vector<int> work_of;            // item -> index in work (-1: replayed)
  std::vector<StoredResult> replayed;  // item -> stored result of an applied request id
};

// Each item against its session (held busy): a retry of an applied item is its stored result,
// nothing applied again; any other item becomes work once its committed_len precondition and
// the context limit hold.
absl::Status PlanItems(const v1::VerifyRequest& req,
                       const std::vector<std::shared_ptr<Session>>& sessions,
                       const ApiLimits& limits, VerifyPlan* plan) {
  const int n = req.items_size();
  plan->work_of.assign(n, -1);
  plan->replayed.resize(n);
  for (int i = 0; i < n; ++i) {
    const v1::VerifyItem& item = req.items(i);
    const std::string field = absl::StrCat("items[", i, "]");
    const std::shared_ptr<Session>& s = sessions[i];
    // The same request id with another tree is a client error, not a retry.
    const uint64_t fingerprint = item.request_id().empty() ? 0 : ItemFingerprint(item);
    if (const StoredResult* r = s->FindResult(item.request_id()); r != nullptr) {
      if (r->fingerprint != fingerprint) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".request_id: '", item.request_id(),
            "' was already applied on this session with another draft tree; a retry must resend "
            "the same tree"));
      }
      plan->replayed[i] = *r;
      continue;
    }
    if (item.has_expected_committed_len() && item.expected_committed_len() != s->committed_len()) {
      return absl::AbortedError(
          absl::StrCat(field, ".expected_committed_len: ", item.expected_committed_len(),
                       " differs from the session's committed_len ", s->committed_len(),
                       "; nothing was applied"));
    }
    VERIFYD_RETURN_IF_ERROR(
        CheckContext(s->committed_len(), item.tree().tokens_size(), limits, field + ".tree"));
    plan->work_of[i] = static_cast<int>(plan->work.size());
    VerifyWork& w = plan->work.emplace_back();
    w.session = s;
    w.draft_tokens.assign(item.tree().tokens().begin(), item.tree().tokens().end());
    w.draft_parents.assign(item.tree().parents().begin(), item.tree().parents().end());
    w.request_id = item.request_id();
    w.fingerprint = fingerprint;
  }
  return absl::OkStatus();
}

// The response must fit in one message: refuses a call whose worst case (every item accepting
// its deepest path) could not, before anything runs.
absl::Status CheckResponseBound(const v1::VerifyRequest& req,
                                const std::vector<std::shared_ptr<Session>>& sessions,
                                const VerifyPlan& plan, const ApiLimits& limits) {
  if (limits.max_response_bytes <= 0) return absl::OkStatus();
  int64_t total = 16;
  for (int i = 0; i < req.items_size(); ++i) {
    const v1::VerifyItem& item = req.items(i);
    SessionConfig cfg = sessions[i]->config;
    int depth = TreeDepth(item.tree());
    if (plan.work_of[i] < 0) {  // a replay: no hidden states
      cfg.hidden_layers.clear();
      depth = static_cast<int>(plan.replayed[i].accepted_tokens.size());
    }
    total += VerifyResultBytesBound(cfg, item.tree().tokens_size(), depth, item.session_id().size(),
                                    limits);
    if (total > limits.max_response_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "items[", i, "]: the response could reach ", total, " bytes (hidden states of up to ",
          depth + 1, " tokens x ", cfg.hidden_layers.size(), " layers x ", limits.hidden_size,
          " values for this item), over the server's "
          "--max_message_bytes ",
          limits.max_response_bytes,
          "; nothing was applied: send shallower trees or fewer items per call, or open the "
          "session with fewer hidden layers"));
    }
  }
  return absl::OkStatus();
}

// The tail slots of every work item (pending row, then nodes).
absl::Status AllocateTailSlots(SlotAllocator* slots, std::vector<VerifyWork>* work) {
  for (VerifyWork& w : *work) {
    auto tail = slots->Allocate(static_cast<int64_t>(w.draft_tokens.size()) + 1);
    if (!tail.ok()) return tail.status();
    w.tail_slots = *std::move(tail);
  }
  return absl::OkStatus();
}

// Undo for every exit: gives back tail slots still owned here and releases the sessions.
void ReleaseVerifyItems(SlotAllocator* slots, SessionManager* session_manager, uint64_t request_id,
                        std::vector<VerifyWork>* work,
                        const std::vector<std::shared_ptr<Session>>& sessions) {
  for (VerifyWork& w : *work) {
    if (!w.tail_slots.empty()) {
      if (absl::Status st = slots->Free(w.tail_slots); !st.ok()) {
        spdlog::error("req={} freeing tail slots: {}", request_id, st.ToString());
      }
      w.tail_slots.clear();
    }
  }
  for (const auto& s : sessions) session_manager->Release(s);
}

// One result per item, in item order: a replay from its stored result, a work item from its
// round (hidden states when its session asks for them).
void FillVerifyResults(const v1::VerifyRequest& req, const VerifyPlan& plan, int64_t hidden_size,
                       v1::VerifyResponse* resp) {
  for (int i = 0; i < req.items_size(); ++i) {
    v1::VerifyResult* r = resp->add_results();
    r->set_session_id(req.items(i).session_id());
    if (plan.work_of[i] < 0) {
      const StoredResult& x = plan.replayed[i];
      r->mutable_accepted_nodes()->Add(x.accepted_nodes.begin(), x.accepted_nodes.end());
      r->mutable_accepted_tokens()->Add(x.accepted_tokens.begin(), x.accepted_tokens.end());
      r->set_bonus_token(x.bonus_token);
      r->set_committed_len(x.committed_len);
      FillLogprobs(x.logprobs, r->mutable_logprobs());
      FillStats(x.stats, r->mutable_stats());
      continue;
    }
    const VerifyWork& w = plan.work[plan.work_of[i]];
    r->mutable_accepted_nodes()->Add(w.accepted_nodes.begin(), w.accepted_nodes.end());
    r->mutable_accepted_tokens()->Add(w.accepted_tokens.begin(), w.accepted_tokens.end());
    r->set_bonus_token(w.bonus);
    r->set_committed_len(w.committed_len);
    FillLogprobs(w.logprobs, r->mutable_logprobs());
    if (!w.session->config.hidden_layers.empty()) {
      FillHiddenStates(w.session->config, hidden_size, w.hidden, r->mutable_hidden_states());
    }
    FillStats(w.stats, r->mutable_stats());
  }
}

// The bound CheckResponseBound sets makes this unreachable; a safety net, never a truncated
// message: an over-size response is cleared and the call fails.
absl::Status CheckResponseSize(const ApiLimits& limits, v1::VerifyResponse* resp) {
  if (limits.max_response_bytes > 0 &&
      static_cast<int64_t>(resp->ByteSizeLong()) > limits.max_response_bytes) {
    const int64_t size = static_cast<int64_t>(resp->ByteSizeLong());
    resp->Clear();
    return absl::ResourceExhaustedError(
        absl::StrCat("the response of ", size, " bytes exceeds the server's --max_message_bytes ",
                     limits.max_response_bytes,
                     "; the round was applied: retry with the same request_id for its tokens"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifyServiceImpl::DoVerify(const v1::VerifyRequest& req, v1::VerifyResponse* resp,
                                         uint64_t request_id, grpc::ServerContext* ctx) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = Deadline(*ctx, start);
  VERIFYD_RETURN_IF_ERROR(ValidateVerifyRequest(req, limits_));
  if (scheduler_->engine_failed()) return absl::UnavailableError("engine failed");

  // Every session of the call at once; a session busy with an earlier call (one whose client
  // may have gone away) is waited for within this call's deadline.
  std::vector<std::string> ids;
  for (const v1::VerifyItem& item : req.items()) ids.push_back(item.session_id());
  int missing = 0;
  auto sessions = sessions_->AcquireAll(ids, Owner(*ctx), Bounds(ctx, deadline), &missing);
  if (!sessions.ok()) {
    if (sessions.status().code() == absl::StatusCode::kNotFound) {
      return WithField(sessions.status(), absl::StrCat("items[", missing, "].session_id"));
    }
    return MapCancelled(sessions.status(), deadline);
  }

  VerifyPlan plan;
  absl::Status st = PlanItems(req, *sessions, limits_, &plan);
  if (st.ok()) st = CheckResponseBound(req, *sessions, plan, limits_);
  if (st.ok()) st = AllocateTailSlots(slots_, &plan.work);
  if (!st.ok()) {
    ReleaseVerifyItems(slots_, sessions_, request_id, &plan.work, *sessions);
    return st;
  }
  JobTiming timing;
  if (!plan.work.empty()) {
    st = MapCancelled(scheduler_->Verify(&plan.work, &timing, Bounds(ctx, deadline).cancelled),
                      deadline);
  }
  if (st.ok()) {
    FillVerifyResults(req, plan, limits_.hidden_size, resp);
    if (!plan.work.empty()) {
      metrics_->ObserveVerifyLatency(timing.queue_s, timing.engine_s,
                                     absl::ToDoubleSeconds(absl::Now() - start));
    }
    st = CheckResponseSize(limits_, resp);
  }
  ReleaseVerifyItems(slots_, sessions_, request_id, &plan.work, *sessions);
  return st;
}

grpc::Status VerifyServiceImpl::Verify(grpc::ServerContext* ctx, const v1::VerifyRequest* req,
                                       v1::VerifyResponse* resp) {
  const uint64_t id = next_request_id_++;
  const absl::Time start = absl::Now();
  absl::Status st = DoVerify(*req, resp, id, ctx);
  int nodes = 0;
  for (const auto& item : req->items()) nodes += item.tree().tokens_size();
  return Finish("Verify", id, st, start,
                absl::StrCat("items=", req->items_size(), " nodes=", nodes));
}

template <typename ReadFn, typename WriteFn>
grpc::Status VerifyServiceImpl::StreamLoop(grpc::ServerContext* ctx, ReadFn read, WriteFn write) {
  const uint64_t stream_id = next_request_id_++;
  const absl::Time stream_start = absl::Now();
  v1::VerifyRequest req;
  int64_t messages = 0;
  for (;;) {
    const StreamRead got = read(&req);
    if (got == StreamRead::kEnd) break;
    const uint64_t id = next_request_id_++;
    const absl::Time start = absl::Now();
    v1::VerifyResponse resp;
    absl::Status st =
        got == StreamRead::kMalformed
            ? absl::InvalidArgumentError(absl::StrCat(
                  "VerifyStream message ", messages,
                  " (0-based) does not parse as a verify.v1.VerifyRequest; the stream ends here"))
            : DoVerify(req, &resp, id, ctx);
    ++messages;
    // Each message counts as one VerifyStream request in the metrics.
    grpc::Status g = Finish("VerifyStream", id, st, start,
                            absl::StrCat("stream=", stream_id, " items=", req.items_size()));
    if (!st.ok()) {
      spdlog::info("stream={} ended code={} messages={} s={:.3f}", stream_id,
                   CodeName(g.error_code()), messages,
                   absl::ToDoubleSeconds(absl::Now() - stream_start));
      return g;
    }
    if (!write(resp)) break;  // client went away
  }
  spdlog::debug("stream={} ended code=OK messages={} s={:.3f}", stream_id, messages,
                absl::ToDoubleSeconds(absl::Now() - stream_start));
  return grpc::Status::OK;
}

grpc::Status VerifyServiceImpl::VerifyStream(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::VerifyResponse, v1::VerifyRequest>* stream) {
  return StreamLoop(
      ctx,
      [stream](v1::VerifyRequest* req) {
        return stream->Read(req) ? StreamRead::kMessage : StreamRead::kEnd;
      },
      [stream](const v1::VerifyResponse& resp) { return stream->Write(resp); });
}

grpc::Status VerifyServiceImpl::VerifyStreamRaw(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  return StreamLoop(
      ctx,
      [stream](v1::VerifyRequest* req) {
        grpc::ByteBuffer buf;
        if (!stream->Read(&buf)) return StreamRead::kEnd;
        req->Clear();
        return grpc::GenericDeserialize<grpc::ProtoBufferReader, v1::VerifyRequest>(&buf, req).ok()
                   ? StreamRead::kMessage
                   : StreamRead::kMalformed;
      },
      [stream](const v1::VerifyResponse& resp) {
        grpc::ByteBuffer buf;
        bool own = false;
        if (!grpc::GenericSerialize<grpc::ProtoBufferWriter, v1::VerifyResponse>(resp, &buf, &own)
                 .ok()) {
          return false;
        }
        return stream->Write(buf);
      });
}

}  // namespace verifyd::server
