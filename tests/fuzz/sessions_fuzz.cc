// Fuzz harness: the session state machine — sequences of open (optionally on another
// session's prefix) / verify (with request ids, retries of applied ids, expected lengths) /
// truncate / fork / close / close-while-busy / expire / injected engine errors / cancelled
// calls — through the real SessionManager, SlotAllocator and Scheduler (its engine thread) on
// the ToyEngine, following the same steps as the gRPC handlers (server/service.cc,
// server/service_sessions.cc).
//
// Invariants checked after every operation:
//   - slots used == the number of distinct slots in the live sessions' contexts, and each
//     slot's reference count == the number of live sessions holding it (no leak, no double
//     free: a double free would also fail the allocator's Free and the toy engine's checks);
//   - every session's committed length and token history are the model's;
//   - active sessions == the live sessions of the model;
//   - every session's tokens (next_token, then accepted + bonus per round) equal the toy
//     model's plain greedy decoding of the session's history so far (lossless; truncation,
//     forks, shared prefixes, pool pressure, failures and other sessions' traffic change
//     nothing);
//   - a retry of an applied request id returns the stored result and changes nothing;
//   - a failed or cancelled call changes no session; statuses are the documented codes.
// At the end every session is closed and every slot is free.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/session_manager.h"
#include "server/slot_allocator.h"
#include "server/toy_engine.h"
#include "server/validation.h"
#include "spdlog/spdlog.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using verifyd::fuzz::ByteReader;
namespace srv = verifyd::server;

struct ModelSession {
  std::vector<int32_t> hist;  // committed tokens, then the pending token
  std::shared_ptr<srv::Session> handle;
  std::deque<srv::StoredResult> results;  // the last kStoredResultsPerSession applied ids
  int64_t committed() const { return static_cast<int64_t>(hist.size()) - 1; }
};

class Harness {
 public:
  explicit Harness(ByteReader& in) : in_(in) {
    opts_.vocab_size = in.Range(2, 12);  // small vocab: drafts often match
    opts_.kv_slots = in.Range(4, 160);
    opts_.max_batch = 4;
    opts_.max_tail_rows = static_cast<int>(in.Range(2, 9));
    opts_.max_context = in.Range(8, 96);
    opts_.seed = in.Byte();
    limits_.vocab_size = opts_.vocab_size;
    limits_.max_draft_nodes = opts_.max_tail_rows - 1;
    limits_.max_context = opts_.max_context;
    limits_.max_batch = opts_.max_batch;
    max_sessions_ = static_cast<int>(in.Range(1, 8));
    engine_ = std::make_unique<srv::testing::ToyEngine>(opts_);
    slots_ = std::make_unique<srv::SlotAllocator>(opts_.kv_slots);
    sessions_ = std::make_unique<srv::SessionManager>(slots_.get(), max_sessions_, absl::Hours(1));
    metrics_ = std::make_unique<srv::Metrics>(1, "fuzz", "toy");
    srv::SchedulerOptions so;
    so.max_batch = opts_.max_batch;
    so.max_queue = 8;
    so.prefill_chunk = opts_.max_tail_rows;
    scheduler_ = std::make_unique<srv::Scheduler>(engine_.get(), sessions_.get(), slots_.get(),
                                                  metrics_.get(), so, nullptr);
    scheduler_->Start();
  }

  ~Harness() { scheduler_->Stop(); }

  void Run() {
    for (int op = 0; op < 64 && !in_.empty(); ++op) {
      switch (in_.Range(0, 10)) {
        case 0:
        case 1:
          Open();
          break;
        case 2:
        case 3:
        case 4:
          Verify();
          break;
        case 5:
          Close();
          break;
        case 6:
          CloseWhileBusy();
          break;
        case 7:
          Expire();
          break;
        case 8:
          Truncate();
          break;
        case 9:
          Fork();
          break;
        case 10:
          Verify();
          break;
      }
      CheckPool();
    }
    for (auto& [id, m] : model_) FUZZ_CHECK(sessions_->Close(id).ok());
    model_.clear();
    CheckPool();
    FUZZ_CHECK(slots_->used() == 0);
    FUZZ_CHECK(sessions_->active() == 0);
  }

 private:
  void CheckPool() {
    std::map<int32_t, int32_t> holders;  // slot -> live sessions holding it
    for (const auto& [id, m] : model_) {
      FUZZ_CHECK(m.handle->committed_len() == m.committed());
      FUZZ_CHECK(m.handle->history == m.hist);
      FUZZ_CHECK(m.handle->pending == m.hist.back());
      for (int32_t slot : m.handle->context_slots) ++holders[slot];
    }
    FUZZ_CHECK(slots_->used() == static_cast<int64_t>(holders.size()));
    int64_t shared = 0;
    for (const auto& [slot, n] : holders) {
      FUZZ_CHECK(slots_->refs(slot) == n);
      shared += n > 1 ? 1 : 0;
    }
    FUZZ_CHECK(slots_->shared() == shared);
    FUZZ_CHECK(sessions_->active() == static_cast<int>(model_.size()));
  }

  // Optionally makes the next engine step fail (not permanently); returns whether it did.
  // Called only right before a call that certainly runs a step (this harness is the only
  // client), so the injected error is always consumed by that call.
  bool MaybeInjectError() {
    if (!in_.Chance(20)) return false;
    engine_->FailNextStep(absl::InternalError("injected"));
    return true;
  }

  void Open() {
    const int64_t len = in_.Range(1, 40);
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < len; ++i)
      prompt.push_back(static_cast<int32_t>(in_.Range(0, opts_.vocab_size - 1)));
    // Sometimes on another session's committed prefix (OpenSessionRequest.prefix_session_id).
    const std::string prefix_id = in_.Chance(64) ? PickId() : "";
    // As OpenSession: validate, hold the prefix, create (allocates the prompt's slots, shares
    // the prefix's), release the prefix, prefill, ready.
    verify::v1::OpenSessionRequest req;
    req.mutable_prompt_tokens()->Add(prompt.begin(), prompt.end());
    if (!srv::ValidatePrompt(req, limits_).ok()) {
      FUZZ_CHECK(len > opts_.max_context - 1);
      return;
    }
    std::shared_ptr<srv::Session> prefix;
    std::vector<int32_t> full;  // the new session's committed tokens after the prefill
    if (!prefix_id.empty()) {
      auto p = sessions_->Acquire(prefix_id);
      auto m = model_.find(prefix_id);
      if (m == model_.end()) {
        FUZZ_CHECK(p.status().code() == absl::StatusCode::kNotFound);
        return;
      }
      FUZZ_CHECK(p.ok());
      prefix = *p;
      if (!srv::CheckPrefixPrompt(prefix->committed_len(), static_cast<int>(len), limits_).ok()) {
        FUZZ_CHECK(m->second.committed() + len > opts_.max_context - 1);
        sessions_->Release(prefix);
        return;
      }
      full.assign(m->second.hist.begin(), m->second.hist.end() - 1);
    }
    full.insert(full.end(), prompt.begin(), prompt.end());
    const int64_t free_before = slots_->free_count();
    std::vector<int32_t> prompt_slots;
    auto s = sessions_->Create(len, &prompt_slots, "", prefix.get());
    if (prefix) sessions_->Release(prefix);
    if (!s.ok()) {
      FUZZ_CHECK(s.status().code() == absl::StatusCode::kResourceExhausted);
      FUZZ_CHECK(static_cast<int>(model_.size()) >= max_sessions_ || free_before < len);
      FUZZ_CHECK(slots_->free_count() == free_before);
      return;
    }
    FUZZ_CHECK(static_cast<int>(model_.size()) < max_sessions_ && free_before >= len);
    const bool inject = MaybeInjectError();
    absl::StatusOr<int32_t> next = scheduler_->Prefill(*s, prompt, prompt_slots, nullptr);
    if (!next.ok()) {
      FUZZ_CHECK(inject);
      FUZZ_CHECK(next.status().code() == absl::StatusCode::kInternal);
      sessions_->Discard(*s, prompt_slots);
      return;
    }
    sessions_->MarkReady(*s);
    sessions_->Release(*s);
    FUZZ_CHECK(*next == Greedy(full, 1)[0]);
    ModelSession m;
    m.hist = std::move(full);
    m.hist.push_back(*next);
    m.handle = *s;
    model_[(*s)->id] = std::move(m);
  }

  // The toy model's greedy continuation of `tokens`, n tokens.
  std::vector<int32_t> Greedy(const std::vector<int32_t>& tokens, int64_t n) const {
    return srv::testing::ToyEngine::Greedy(opts_, tokens, static_cast<int>(n));
  }

  // A live session id, or (sometimes) one the server does not know.
  std::string PickId() {
    if (model_.empty() || in_.Chance(16)) return in_.Bool() ? "no-such-session" : last_closed_;
    auto it = model_.begin();
    std::advance(it, in_.Range(0, static_cast<int64_t>(model_.size()) - 1));
    return it->first;
  }

  void Verify() {
    const int k = static_cast<int>(in_.Range(1, opts_.max_batch));
    std::vector<std::string> ids;
    for (int i = 0; i < k; ++i) {
      std::string id = PickId();
      bool dup = id.empty();
      for (const auto& o : ids) dup |= (o == id);
      if (!dup) ids.push_back(id);
    }
    if (ids.empty()) return;
    const size_t n_items = ids.size();
    // Per item: a tree (a path that follows the truth for a while, plus random siblings), a
    // request id (none, fresh, or a retry of one the session applied) and maybe an expected
    // committed length (sometimes wrong).
    std::vector<srv::VerifyWork> items(n_items);
    std::vector<std::optional<int64_t>> expected(n_items);
    std::vector<const srv::StoredResult*> retry_of(n_items, nullptr);
    for (size_t i = 0; i < n_items; ++i) {
      auto m = model_.find(ids[i]);
      const int n = static_cast<int>(in_.Range(0, opts_.max_tail_rows - 1));
      std::vector<int32_t> truth;
      if (m != model_.end()) truth = Greedy(m->second.hist, n + 1);
      int32_t on_path = -1;  // last node of the true path
      for (int j = 0; j < n; ++j) {
        int32_t tok, parent;
        if (in_.Bool() && m != model_.end()) {
          parent = on_path;
          const size_t depth = on_path < 0 ? 0 : PathDepth(items[i].draft_parents, on_path);
          tok = truth[depth];
          on_path = j;
        } else {
          parent = static_cast<int32_t>(in_.Range(-1, j - 1));
          tok = static_cast<int32_t>(in_.Range(0, opts_.vocab_size - 1));
        }
        items[i].draft_tokens.push_back(tok);
        items[i].draft_parents.push_back(parent);
      }
      const int64_t rid = in_.Range(0, 3);
      if (rid == 1) {
        items[i].request_id = absl::StrCat("r", next_request_id_++);
      } else if (rid >= 2 && m != model_.end() && !m->second.results.empty()) {
        const auto& rs = m->second.results;
        retry_of[i] = &rs[in_.Range(0, static_cast<int64_t>(rs.size()) - 1)];
        items[i].request_id = retry_of[i]->request_id;
      }
      if (in_.Chance(64) && m != model_.end()) {
        expected[i] = m->second.committed() + (in_.Chance(64) ? in_.Range(-2, 2) : 0);
      }
    }
    // The documented status: NotFound for any unknown session (all are acquired first), then
    // per item in order: a retry is answered from the store; ABORTED for a wrong expected
    // length; INVALID_ARGUMENT for a context overflow.
    absl::StatusCode expect = absl::StatusCode::kOk;
    for (size_t i = 0; i < n_items; ++i) {
      if (!(model_.count(ids[i]) != 0)) expect = absl::StatusCode::kNotFound;
    }
    for (size_t i = 0; i < n_items && expect == absl::StatusCode::kOk; ++i) {
      const ModelSession& m = model_[ids[i]];
      if (retry_of[i] != nullptr) continue;
      if (expected[i] && *expected[i] != m.committed()) {
        expect = absl::StatusCode::kAborted;
      } else if (m.committed() + 1 + static_cast<int64_t>(items[i].draft_tokens.size()) >
                 opts_.max_context) {
        expect = absl::StatusCode::kInvalidArgument;
      }
    }
    const bool cancel = in_.Chance(16);
    bool inject = false;
    std::map<std::string, std::vector<int32_t>> before;
    for (const auto& [id, m] : model_) before[id] = m.hist;

    // As DoVerify: acquire every session, answer retries from the store, check expected
    // lengths and the context, allocate tails, run the rest, release.
    absl::Status st;
    int missing = -1;
    auto acquired = sessions_->AcquireAll(ids, "", srv::WaitBounds{}, &missing);
    std::vector<srv::VerifyWork> work;
    std::vector<int> work_of(n_items, -1);
    std::vector<srv::StoredResult> replayed(n_items);
    if (!acquired.ok()) {
      st = acquired.status();
      FUZZ_CHECK(missing >= 0 && !(model_.count(ids[missing]) != 0));
    } else {
      for (size_t i = 0; i < n_items && st.ok(); ++i) {
        const auto& s = (*acquired)[i];
        if (const srv::StoredResult* r = s->FindResult(items[i].request_id); r != nullptr) {
          replayed[i] = *r;
          continue;
        }
        if (expected[i] && *expected[i] != s->committed_len()) {
          st = absl::AbortedError("expected_committed_len");
          break;
        }
        st = srv::CheckContext(s->committed_len(), static_cast<int>(items[i].draft_tokens.size()),
                               limits_, "items[0].tree");
        if (!st.ok()) break;
        work_of[i] = static_cast<int>(work.size());
        items[i].session = s;
        work.push_back(items[i]);
      }
      for (srv::VerifyWork& w : work) {
        if (!st.ok()) break;
        auto tail = slots_->Allocate(static_cast<int64_t>(w.draft_tokens.size()) + 1);
        if (!tail.ok()) {
          st = tail.status();
          break;
        }
        w.tail_slots = *tail;
      }
      if (st.ok() && !work.empty()) {
        inject = !cancel && MaybeInjectError();
        st = scheduler_->Verify(&work, nullptr, [cancel] { return cancel; });
      }
      for (srv::VerifyWork& w : work) {
        if (!w.tail_slots.empty()) {
          FUZZ_CHECK(slots_->Free(w.tail_slots).ok());
          w.tail_slots.clear();
        }
      }
      for (const auto& s : *acquired) sessions_->Release(s);
    }

    if (expect != absl::StatusCode::kOk) {
      FUZZ_CHECK(st.code() == expect);
    } else if (st.code() == absl::StatusCode::kResourceExhausted) {
      // Pool pressure: fine, nothing changed.
    } else if (st.code() == absl::StatusCode::kCancelled) {
      FUZZ_CHECK(cancel && !work.empty());
    } else if (st.code() == absl::StatusCode::kInternal) {
      FUZZ_CHECK(inject);
    } else {
      FUZZ_CHECK(st.ok());
      FUZZ_CHECK(!inject && (!cancel || work.empty()));
    }
    if (!st.ok()) {
      for (const auto& [id, m] : model_) FUZZ_CHECK(m.hist == before[id]);
      return;
    }
    for (size_t i = 0; i < n_items; ++i) {
      ModelSession& m = model_[ids[i]];
      if (work_of[i] < 0) {
        // A retry: the stored result, unchanged session.
        FUZZ_CHECK(retry_of[i] != nullptr);
        FUZZ_CHECK(replayed[i].accepted_tokens == retry_of[i]->accepted_tokens);
        FUZZ_CHECK(replayed[i].bonus_token == retry_of[i]->bonus_token);
        FUZZ_CHECK(replayed[i].committed_len == retry_of[i]->committed_len);
        FUZZ_CHECK(m.hist == before[ids[i]]);
        continue;
      }
      const srv::VerifyWork& w = work[work_of[i]];
      FUZZ_CHECK(w.accepted_nodes.size() == w.accepted_tokens.size());
      for (size_t a = 0; a < w.accepted_nodes.size(); ++a) {
        FUZZ_CHECK(w.draft_tokens[w.accepted_nodes[a]] == w.accepted_tokens[a]);
      }
      std::vector<int32_t> got = w.accepted_tokens;
      got.push_back(w.bonus);
      FUZZ_CHECK(got == Greedy(m.hist, static_cast<int64_t>(got.size())));  // lossless
      m.hist.insert(m.hist.end(), got.begin(), got.end());
      FUZZ_CHECK(w.committed_len == m.committed());
      if (!w.request_id.empty()) {
        m.results.push_back(srv::StoredResult{w.request_id, w.fingerprint, w.accepted_nodes,
                                              w.accepted_tokens, w.bonus, w.committed_len});
        if (m.results.size() > static_cast<size_t>(srv::kStoredResultsPerSession)) {
          m.results.pop_front();
        }
      }
    }
  }

  // As TruncateSession: committed_len checked (>= 1 first, then <= the session's length).
  void Truncate() {
    const std::string id = PickId();
    if (id.empty()) return;
    auto m = model_.find(id);
    const int64_t len = in_.Range(0, m == model_.end() ? 4 : m->second.committed() + 1);
    if (len < 1) return;  // INVALID_ARGUMENT before the session is looked up
    auto s = sessions_->Acquire(id);
    if (m == model_.end()) {
      FUZZ_CHECK(s.status().code() == absl::StatusCode::kNotFound);
      return;
    }
    FUZZ_CHECK(s.ok());
    if (len > (*s)->committed_len()) {
      FUZZ_CHECK(len > m->second.committed());
      sessions_->Release(*s);
      return;
    }
    sessions_->Truncate(*s, len);
    sessions_->Release(*s);
    m->second.hist.resize(static_cast<size_t>(len) + 1);
    m->second.results.clear();
    FUZZ_CHECK((*s)->pending == m->second.hist[len]);
  }

  // As ForkSession: hold the parent, fork (shares its slots), release.
  void Fork() {
    const std::string id = PickId();
    if (id.empty()) return;
    auto m = model_.find(id);
    auto p = sessions_->Acquire(id);
    if (m == model_.end()) {
      FUZZ_CHECK(p.status().code() == absl::StatusCode::kNotFound);
      return;
    }
    FUZZ_CHECK(p.ok());
    const int64_t used = slots_->used();
    auto child = sessions_->Fork(*p, "");
    sessions_->Release(*p);
    FUZZ_CHECK(slots_->used() == used);
    if (!child.ok()) {
      FUZZ_CHECK(child.status().code() == absl::StatusCode::kResourceExhausted);
      FUZZ_CHECK(static_cast<int>(model_.size()) >= max_sessions_);
      return;
    }
    ModelSession c;
    c.hist = m->second.hist;
    c.handle = *child;
    model_[(*child)->id] = std::move(c);
  }

  static size_t PathDepth(const std::vector<int32_t>& parents, int32_t node) {
    size_t d = 0;
    for (int32_t c = node; c >= 0; c = parents[c]) ++d;
    return d;
  }

  void Close() {
    const std::string id = PickId();
    if (id.empty()) return;
    const absl::Status st = sessions_->Close(id);
    if (model_.erase(id) == 1) {
      FUZZ_CHECK(st.ok());
      last_closed_ = id;
    } else {
      FUZZ_CHECK(st.code() == absl::StatusCode::kNotFound);
    }
  }

  // A close that arrives while a request holds the session: it disappears at once and its
  // slots are freed when the request releases it.
  void CloseWhileBusy() {
    if (model_.empty()) return;
    const std::string id = PickId();
    auto it = model_.find(id);
    if (it == model_.end()) return;
    auto s = sessions_->Acquire(id);
    FUZZ_CHECK(s.ok());
    FUZZ_CHECK(sessions_->Acquire(id).status().code() == absl::StatusCode::kFailedPrecondition);
    FUZZ_CHECK(sessions_->Close(id).ok());
    FUZZ_CHECK(sessions_->Acquire(id).status().code() == absl::StatusCode::kNotFound);
    FUZZ_CHECK(slots_->used() > 0 || it->second.committed() == 0);
    sessions_->Release(*s);
    model_.erase(it);
    last_closed_ = id;
  }

  // All idle sessions expire (the clock is pushed past the TTL), or none (clock now).
  void Expire() {
    if (in_.Bool()) {
      FUZZ_CHECK(sessions_->ExpireIdle(absl::Now()) == 0);
      return;
    }
    const int n = sessions_->ExpireIdle(absl::Now() + absl::Hours(2));
    FUZZ_CHECK(n == static_cast<int>(model_.size()));
    if (!model_.empty()) last_closed_ = model_.begin()->first;
    model_.clear();
  }

  ByteReader& in_;
  srv::testing::ToyEngineOptions opts_;
  srv::ApiLimits limits_;
  int max_sessions_ = 1;
  std::unique_ptr<srv::testing::ToyEngine> engine_;
  std::unique_ptr<srv::SlotAllocator> slots_;
  std::unique_ptr<srv::SessionManager> sessions_;
  std::unique_ptr<srv::Metrics> metrics_;
  std::unique_ptr<srv::Scheduler> scheduler_;
  std::map<std::string, ModelSession> model_;
  std::string last_closed_ = "closed-before";
  int64_t next_request_id_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);  // injected errors log at error level
    return true;
  }();
  (void)quiet;
  ByteReader in(data, size);
  Harness h(in);
  h.Run();
  return 0;
}
