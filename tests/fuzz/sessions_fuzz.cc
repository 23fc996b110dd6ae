// Fuzz harness: the session state machine — sequences of open / verify / close / close-while-
// busy / expire / injected engine errors / cancelled calls — through the real SessionManager,
// SlotAllocator and Scheduler (its engine thread) on the ToyEngine, following the same steps
// as the gRPC handlers (server/service.cc).
//
// Invariants checked after every operation:
//   - slots used == sum of the live sessions' committed lengths (no leak, no double free:
//     a double free would also fail the allocator's Free and the toy engine's slot checks);
//   - active sessions == the live sessions of the model;
//   - every session's collected tokens (next_token, then accepted + bonus per round) equal
//     the toy model's plain greedy decoding (lossless; pool pressure, failures and other
//     sessions' traffic change nothing);
//   - a failed or cancelled call changes no session; statuses are the documented codes.
// At the end every session is closed and every slot is free.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/session_manager.h"
#include "server/slot_allocator.h"
#include "server/testing/toy_engine.h"
#include "server/validation.h"
#include "spdlog/spdlog.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using verifyd::fuzz::ByteReader;
namespace srv = verifyd::server;

struct ModelSession {
  std::vector<int32_t> prompt;
  std::vector<int32_t> collected;  // next_token, then accepted tokens + bonus per round
  int64_t committed = 0;           // prompt + 1 per round + accepted
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
      switch (in_.Range(0, 7)) {
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
    int64_t sum = 0;
    for (const auto& [id, m] : model_) sum += m.committed;
    FUZZ_CHECK(slots_->used() == sum);
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
    // As OpenSession: validate, create (allocates the prompt's slots), prefill, ready.
    verify::v1::OpenSessionRequest req;
    req.mutable_prompt_tokens()->Add(prompt.begin(), prompt.end());
    if (!srv::ValidatePrompt(req, limits_).ok()) {
      FUZZ_CHECK(len > opts_.max_context - 1);
      return;
    }
    const int64_t free_before = slots_->free_count();
    std::vector<int32_t> prompt_slots;
    auto s = sessions_->Create(len, &prompt_slots);
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
    ModelSession m;
    m.prompt = prompt;
    m.collected = {*next};
    m.committed = len;
    FUZZ_CHECK(m.collected == Truth(m, 1));
    model_[(*s)->id] = std::move(m);
  }

  // The toy model's greedy continuation of m.prompt, n tokens.
  std::vector<int32_t> Truth(const ModelSession& m, int64_t n) const {
    return srv::testing::ToyEngine::Greedy(opts_, m.prompt, static_cast<int>(n));
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
    // Trees: a path that follows the truth for a while, plus random siblings.
    std::vector<srv::VerifyWork> work(ids.size());
    std::vector<std::vector<int32_t>> truths(ids.size());
    // The handler checks items in order; the first bad one decides the status.
    absl::StatusCode expect = absl::StatusCode::kOk;
    for (size_t i = 0; i < ids.size(); ++i) {
      auto m = model_.find(ids[i]);
      const int n = static_cast<int>(in_.Range(0, opts_.max_tail_rows - 1));
      if (expect == absl::StatusCode::kOk) {
        if (m == model_.end()) {
          expect = absl::StatusCode::kNotFound;
        } else if (m->second.committed + 1 + n > opts_.max_context) {
          expect = absl::StatusCode::kInvalidArgument;
        }
      }
      if (m != model_.end()) {
        truths[i] = Truth(m->second, static_cast<int64_t>(m->second.collected.size()) + n + 1);
      }
      int32_t on_path = -1;  // last node of the true path
      for (int j = 0; j < n; ++j) {
        int32_t tok, parent;
        if (in_.Bool() && m != model_.end()) {
          parent = on_path;
          const size_t depth = on_path < 0 ? 0 : PathDepth(work[i].draft_parents, on_path);
          tok = truths[i][m->second.collected.size() + depth];
          on_path = j;
        } else {
          parent = static_cast<int32_t>(in_.Range(-1, j - 1));
          tok = static_cast<int32_t>(in_.Range(0, opts_.vocab_size - 1));
        }
        work[i].draft_tokens.push_back(tok);
        work[i].draft_parents.push_back(parent);
      }
    }
    const bool cancel = in_.Chance(16);
    bool inject = false;
    // As DoVerify: acquire every session, check the context, allocate tails, run, release.
    std::map<std::string, int64_t> before;
    for (const auto& [id, m] : model_) before[id] = m.committed;
    auto release_all = [&]() {
      for (srv::VerifyWork& w : work) {
        if (!w.tail_slots.empty()) {
          FUZZ_CHECK(slots_->Free(w.tail_slots).ok());
          w.tail_slots.clear();
        }
        if (w.session) sessions_->Release(w.session);
      }
    };
    absl::Status st;
    for (size_t i = 0; i < ids.size() && st.ok(); ++i) {
      auto s = sessions_->Acquire(ids[i]);
      if (!s.ok()) {
        st = s.status();
        break;
      }
      work[i].session = *s;
      st = srv::CheckContext((*s)->committed_len(), static_cast<int>(work[i].draft_tokens.size()),
                             limits_, "items[0].tree");
    }
    for (size_t i = 0; i < ids.size() && st.ok(); ++i) {
      auto tail = slots_->Allocate(static_cast<int64_t>(work[i].draft_tokens.size()) + 1);
      if (!tail.ok()) {
        st = tail.status();
        break;
      }
      work[i].tail_slots = *tail;
    }
    if (st.ok()) {
      inject = !cancel && MaybeInjectError();
      st = scheduler_->Verify(&work, nullptr, [cancel] { return cancel; });
    }
    release_all();

    if (expect != absl::StatusCode::kOk) {
      FUZZ_CHECK(st.code() == expect);
    } else if (st.code() == absl::StatusCode::kResourceExhausted) {
      // Pool pressure: fine, nothing changed.
    } else if (st.code() == absl::StatusCode::kCancelled) {
      FUZZ_CHECK(cancel);
    } else if (st.code() == absl::StatusCode::kInternal) {
      FUZZ_CHECK(inject);
    } else {
      FUZZ_CHECK(st.ok());
      FUZZ_CHECK(!cancel && !inject);
    }
    if (!st.ok()) {
      for (const auto& [id, m] : model_) FUZZ_CHECK(m.committed == before[id]);
      return;
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      ModelSession& m = model_[ids[i]];
      const srv::VerifyWork& w = work[i];
      FUZZ_CHECK(w.accepted_nodes.size() == w.accepted_tokens.size());
      for (size_t a = 0; a < w.accepted_nodes.size(); ++a) {
        FUZZ_CHECK(w.draft_tokens[w.accepted_nodes[a]] == w.accepted_tokens[a]);
      }
      m.collected.insert(m.collected.end(), w.accepted_tokens.begin(), w.accepted_tokens.end());
      m.collected.push_back(w.bonus);
      m.committed += 1 + static_cast<int64_t>(w.accepted_tokens.size());
      FUZZ_CHECK(w.committed_len == m.committed);
      FUZZ_CHECK(w.session->committed_len() == m.committed);
      FUZZ_CHECK(m.collected == Truth(m, static_cast<int64_t>(m.collected.size())));
    }
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
    FUZZ_CHECK(slots_->used() > 0 || it->second.committed == 0);
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
