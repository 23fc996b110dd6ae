#include "server/toy_engine.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace verifyd::server::testing {

ToyEngine::ToyEngine(ToyEngineOptions options) : options_(options) {
  config_.name = "toy";
  config_.vocab_size = options.vocab_size;
  config_.hidden_size = 8;
  config_.num_hidden_layers = 1;
  config_.num_attention_heads = 8;
  config_.kv_lora_rank = 8;
  config_.qk_nope_head_dim = 8;
  config_.qk_rope_head_dim = 8;
  config_.v_head_dim = 8;
  config_.intermediate_size = 16;
  config_.max_position_embeddings = options.max_context;
  slots_.resize(static_cast<size_t>(options.kv_slots));
}

tp::EngineLimits ToyEngine::limits() const {
  tp::EngineLimits l;
  l.max_tail_rows = options_.max_tail_rows;
  l.max_batch = options_.max_batch;
  l.max_context = options_.max_context;
  return l;
}

uint64_t ToyEngine::Mix(uint64_t state, int32_t token, int64_t position) {
  // splitmix64 finalizer over the combined inputs.
  uint64_t z = state ^
               (static_cast<uint64_t>(static_cast<uint32_t>(token)) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(position) << 32);
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int32_t ToyEngine::Predict(uint64_t state) const {
  return static_cast<int32_t>(state % static_cast<uint64_t>(options_.vocab_size));
}

std::vector<int32_t> ToyEngine::Greedy(const ToyEngineOptions& options,
                                       const std::vector<int32_t>& prompt, int n) {
  ToyEngine e(ToyEngineOptions{options.vocab_size, 1, 1, 2, options.max_context, 1, options.seed});
  uint64_t state = options.seed;
  int64_t pos = 0;
  for (int32_t t : prompt) state = Mix(state, t, pos++);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t next = e.Predict(state);
    out.push_back(next);
    state = Mix(state, next, pos++);
  }
  return out;
}

void ToyEngine::set_step_delay(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  delay_ = d;
}
void ToyEngine::FailNextStep(absl::Status st) {
  absl::MutexLock lock(&mu_);
  fail_next_ = std::move(st);
}
void ToyEngine::Pause() {
  absl::MutexLock lock(&mu_);
  paused_ = true;
}
void ToyEngine::Resume() {
  absl::MutexLock lock(&mu_);
  paused_ = false;
}
void ToyEngine::FailPermanently() {
  absl::MutexLock lock(&mu_);
  fail_permanently_ = true;
}

absl::StatusOr<std::vector<tp::StepResult>> ToyEngine::Step(
    const std::vector<tp::StepRequest>& batch, tp::StepTiming* timing) {
  const absl::Time start = absl::Now();
  if (failed_) return absl::UnavailableError("toy engine failed");
  absl::Duration delay;
  ++steps_entered_;
  {
    absl::MutexLock lock(&mu_);
    auto running = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !paused_; };
    mu_.Await(absl::Condition(&running));
    delay = delay_;
    if (fail_permanently_) {
      failed_ = true;
      return absl::UnavailableError("toy engine: injected rank failure");
    }
    if (fail_next_) {
      absl::Status st = *fail_next_;
      fail_next_.reset();
      return st;
    }
  }
  if (batch.empty() || static_cast<int>(batch.size()) > options_.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("batch size ", batch.size()));
  }
  // Validate everything before writing anything.
  absl::flat_hash_set<int32_t> tails;
  for (size_t b = 0; b < batch.size(); ++b) {
    const tp::StepRequest& r = batch[b];
    const std::string f = absl::StrCat("batch[", b, "]");
    const size_t n = r.tokens.size();
    if (n < 1 || static_cast<int>(n) > options_.max_tail_rows || r.parents.size() != n ||
        r.tail_slots.size() != n) {
      return absl::InvalidArgumentError(absl::StrCat(f, ": bad row counts"));
    }
    if (static_cast<int64_t>(r.context_slots.size() + n) > options_.max_context) {
      return absl::InvalidArgumentError(absl::StrCat(f, ": context over the limit"));
    }
    for (size_t t = 0; t < n; ++t) {
      if (r.tokens[t] < 0 || r.tokens[t] >= options_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(f, ".tokens[", t, "] out of range"));
      }
      if (t == 0 ? r.parents[t] != -1 : (r.parents[t] < 0 || r.parents[t] >= static_cast<int>(t))) {
        return absl::InvalidArgumentError(absl::StrCat(f, ".parents[", t, "] invalid"));
      }
      const int32_t s = r.tail_slots[t];
      if (s < 0 || s >= options_.kv_slots || !tails.insert(s).second) {
        return absl::InvalidArgumentError(absl::StrCat(f, ".tail_slots[", t, "] invalid/dup"));
      }
    }
    uint64_t prev = options_.seed;
    for (size_t i = 0; i < r.context_slots.size(); ++i) {
      const int32_t s = r.context_slots[i];
      if (s < 0 || s >= options_.kv_slots) {
        return absl::InvalidArgumentError(absl::StrCat(f, ".context_slots[", i, "] range"));
      }
      const SlotState& st = slots_[s];
      if (!st.written || st.position != static_cast<int64_t>(i) || st.prev != prev) {
        return absl::InvalidArgumentError(absl::StrCat(f, ".context_slots[", i, "]: slot ", s,
                                                       " does not hold position ", i,
                                                       " of this sequence"));
      }
      prev = st.state;
    }
  }
  for (const auto& r : batch) {
    for (int32_t s : r.context_slots) {
      if (tails.contains(s)) return absl::InvalidArgumentError("tail slot is a context slot");
    }
  }
  if (delay > absl::ZeroDuration()) absl::SleepFor(delay);

  std::vector<tp::StepResult> out(batch.size());
  for (size_t b = 0; b < batch.size(); ++b) {
    const tp::StepRequest& r = batch[b];
    tp::StepResult& res = out[b];
    const size_t n = r.tokens.size();
    const int64_t committed = static_cast<int64_t>(r.context_slots.size());
    const uint64_t base =
        r.context_slots.empty() ? options_.seed : slots_[r.context_slots.back()].state;
    std::vector<uint64_t> state(n);
    std::vector<int64_t> depth(n, 0);
    for (size_t t = 0; t < n; ++t) {
      const uint64_t prev = t == 0 ? base : state[r.parents[t]];
      depth[t] = t == 0 ? 0 : depth[r.parents[t]] + 1;
      const int64_t pos = committed + depth[t];
      state[t] = Mix(prev, r.tokens[t], pos);
      slots_[r.tail_slots[t]] = SlotState{true, pos, prev, r.tokens[t], state[t]};
      res.predictions.push_back(Predict(state[t]));
    }
    if (!r.accept) continue;
    // Greedy walk: follow the first child whose token equals the prediction.
    int cur = 0;
    for (;;) {
      int next = -1;
      for (size_t c = cur + 1; c < n; ++c) {
        if (r.parents[c] == cur && r.tokens[c] == res.predictions[cur]) {
          next = static_cast<int>(c);
          break;
        }
      }
      if (next < 0) break;
      res.accepted_rows.push_back(next);
      cur = next;
    }
    res.bonus = res.predictions[cur];
    std::vector<bool> keep(n, false);
    keep[0] = true;
    for (int row : res.accepted_rows) keep[row] = true;
    res.kept_slots.push_back(r.tail_slots[0]);
    for (int row : res.accepted_rows) res.kept_slots.push_back(r.tail_slots[row]);
    for (size_t t = 0; t < n; ++t) {
      if (!keep[t]) {
        res.freed_slots.push_back(r.tail_slots[t]);
        slots_[r.tail_slots[t]] = SlotState{};  // poison
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    last_first_slots_.clear();
    for (const tp::StepRequest& r : batch) {
      last_first_slots_.push_back(r.context_slots.empty() ? -1 : r.context_slots[0]);
    }
  }
  int seen = max_batch_seen_.load();
  while (static_cast<int>(batch.size()) > seen &&
         !max_batch_seen_.compare_exchange_weak(seen, static_cast<int>(batch.size()))) {
  }
  ++steps_;
  if (timing) {
    timing->total_s = absl::ToDoubleSeconds(absl::Now() - start);
    timing->per_rank_s.assign(options_.tp_size, timing->total_s);
  }
  return out;
}

std::vector<int32_t> ToyEngine::last_first_context_slots() const {
  absl::MutexLock lock(&mu_);
  return last_first_slots_;
}

}  // namespace verifyd::server::testing
