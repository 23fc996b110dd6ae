#include "client/demo_drafter.h"

#include <algorithm>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/bench.h"

namespace verifyd::client {
double MeanAcceptanceLength(int64_t accepted, int64_t drafts) {
  return drafts > 0 ? 1.0 + static_cast<double>(accepted) / drafts : 0.0;
}

namespace {

int32_t RandomToken(int64_t vocab, std::mt19937_64& rng) {
  return static_cast<int32_t>(std::uniform_int_distribution<int64_t>(0, vocab - 1)(rng));
}

std::vector<int32_t> RandomPrompt(int len, int64_t vocab, std::mt19937_64& rng) {
  std::vector<int32_t> p(std::max(1, len));
  for (auto& t : p) t = RandomToken(vocab, rng);
  return p;
}

}  // namespace

DraftTree BuildDraftTree(const std::vector<int32_t>& guess, int depth, int branches,
                         int64_t vocab_size, int max_nodes, std::mt19937_64& rng) {
  DraftTree tree;
  int parent = -1;  // chain node of the previous depth
  for (int d = 0; d < depth; ++d) {
    if (static_cast<int>(tree.tokens.size()) >= max_nodes) break;
    const int32_t main =
        d < static_cast<int>(guess.size()) ? guess[d] : RandomToken(vocab_size, rng);
    const int chain_index = static_cast<int>(tree.tokens.size());
    tree.tokens.push_back(main);
    tree.parents.push_back(parent);
    for (int b = 1; b < branches && static_cast<int>(tree.tokens.size()) < max_nodes; ++b) {
      int32_t alt = RandomToken(vocab_size, rng);
      if (alt == main && vocab_size > 1) alt = static_cast<int32_t>((alt + 1) % vocab_size);
      tree.tokens.push_back(alt);
      tree.parents.push_back(parent);
    }
    parent = chain_index;
  }
  return tree;
}

std::vector<int32_t> NgramGuess(const std::vector<int32_t>& history, int depth) {
  const int h = static_cast<int>(history.size());
  for (int n = std::min(3, h - 1); n >= 1; --n) {
    // Latest earlier occurrence of the last n tokens.
    for (int start = h - n - 1; start >= 0; --start) {
      if (std::equal(history.begin() + start, history.begin() + start + n, history.end() - n)) {
        std::vector<int32_t> out;
        for (int k = start + n; k < h && static_cast<int>(out.size()) < depth; ++k) {
          out.push_back(history[k]);
        }
        return out;
      }
    }
  }
  return {};
}

namespace {

// One Verify round of a demo / load session: the draft tree and, when the Verify call
// succeeded, its outcome, with the call's latency.
struct Round {
  DraftTree tree;
  absl::StatusOr<VerifyOutcome> outcome;
  absl::Duration latency;
};

// One session's drafter: the oracle (a shadow session on the same server supplies the true
// continuation (greedy, or seeded plain decoding with the same sampling parameters); each
// chain token is true with probability `accuracy`) or the n-gram
// prompt lookup. Used by RunDemo and by every RunLoad session.
class SessionDrafter {
 public:
  SessionDrafter(VerifyClient& client, const DemoOptions& o, int64_t vocab, int max_nodes)
      : client_(client), o_(o), vocab_(vocab), max_nodes_(max_nodes) {}
  SessionDrafter(const SessionDrafter&) = delete;
  SessionDrafter& operator=(const SessionDrafter&) = delete;
  ~SessionDrafter() {
    if (!shadow_id_.empty()) (void)client_.Close(shadow_id_);
  }

  // Starts the collected tokens at the session's `next_token` after `prompt`; oracle only:
  // opens the shadow session on the same prompt.
  absl::Status Start(const std::vector<int32_t>& prompt, int32_t next_token) {
    collected_ = {next_token};
    history_ = prompt;
    history_.push_back(next_token);
    if (!o_.oracle) return absl::OkStatus();
    // Plain decoding with the same sampling parameters and seed (no logprobs / hidden states).
    SessionOptions plain;
    plain.temperature = o_.session.temperature;
    plain.top_p = o_.session.top_p;
    plain.top_k = o_.session.top_k;
    plain.seed = o_.session.seed;
    auto shadow = client_.Open(prompt, "", plain);
    if (!shadow.ok()) return shadow.status();
    shadow_id_ = shadow->session_id;
    truth_.push_back(shadow->next_token);
    return absl::OkStatus();
  }

  // One round on session `session_id`: the guess (Guess) as a draft tree (BuildDraftTree),
  // verified; a verified round's accepted tokens and bonus join collected(). A failed guess
  // is the error; a failed Verify call is the round's outcome.
  absl::StatusOr<Round> Play(const std::string& session_id, std::mt19937_64& rng) {
    auto guess = Guess(rng);
    if (!guess.ok()) return guess.status();
    Round round;
    round.tree = BuildDraftTree(*guess, o_.depth, o_.branches, vocab_, max_nodes_, rng);
    const absl::Time t0 = absl::Now();
    round.outcome = client_.Verify(session_id, round.tree);
    round.latency = absl::Now() - t0;
    if (round.outcome.ok()) {
      for (std::vector<int32_t>* tokens : {&collected_, &history_}) {
        tokens->insert(tokens->end(), round.outcome->accepted_tokens.begin(),
                       round.outcome->accepted_tokens.end());
        tokens->push_back(round.outcome->bonus_token);
      }
    }
    return round;
  }

  // Oracle only: whether collected() equals plain decoding (the shadow's tokens).
  absl::StatusOr<bool> Lossless() {
    if (auto st = ExtendTruth(collected_.size()); !st.ok()) return st;
    return std::equal(collected_.begin(), collected_.end(), truth_.begin());
  }

  // next_token, then the accepted tokens and bonus of every verified round.
  const std::vector<int32_t>& collected() const { return collected_; }

  int64_t shadow_calls() const { return shadow_calls_; }

 private:
  // The guessed chain after the pending token (collected_ and history_ so far).
  absl::StatusOr<std::vector<int32_t>> Guess(std::mt19937_64& rng) {
    if (!o_.oracle) return NgramGuess(history_, o_.depth);
    const size_t from = collected_.size();
    if (auto st = ExtendTruth(from + o_.depth); !st.ok()) return st;
    std::vector<int32_t> guess;
    bool correct = true;
    for (int d = 0; d < o_.depth; ++d) {
      correct = correct && std::uniform_real_distribution<double>(0, 1)(rng) < o_.accuracy;
      guess.push_back(correct ? truth_[from + d] : RandomToken(vocab_, rng));
    }
    return guess;
  }

  absl::Status ExtendTruth(size_t n) {
    while (truth_.size() < n) {
      auto r = client_.Verify(shadow_id_, DraftTree{});
      if (!r.ok()) return r.status();
      ++shadow_calls_;
      truth_.push_back(r->bonus_token);
    }
    return absl::OkStatus();
  }

  VerifyClient& client_;
  const DemoOptions& o_;
  const int64_t vocab_;
  const int max_nodes_;
  std::vector<int32_t> collected_;
  std::vector<int32_t> history_;  // the prompt, then collected_
  std::string shadow_id_;
  std::vector<int32_t> truth_;  // plain decoding after the prompt, from the shadow session
  int64_t shadow_calls_ = 0;
};

}  // namespace

absl::StatusOr<DemoReport> RunDemo(VerifyClient& client, const DemoOptions& o) {
  auto info = client.GetInfo();
  if (!info.ok()) return info.status();
  const int64_t vocab = info->model().vocab_size();
  const int max_nodes = info->limits().max_draft_nodes();
  std::mt19937_64 rng(o.seed);
  const std::vector<int32_t> prompt = RandomPrompt(o.prompt_len, vocab, rng);

  auto main = client.Open(prompt, "", o.session);
  if (!main.ok()) return main.status();
  SessionDrafter drafter(client, o, vocab, max_nodes);
  absl::Status status = drafter.Start(prompt, main->next_token);

  DemoReport rep;
  int64_t accepted_total = 0, drafts = 0;
  for (int round = 0; status.ok() && round < o.rounds; ++round) {
    auto played = drafter.Play(main->session_id, rng);
    status = played.ok() ? played->outcome.status() : played.status();
    if (!status.ok()) break;
    const DraftTree& tree = played->tree;
    const absl::StatusOr<VerifyOutcome>& r = played->outcome;
    const double dt = absl::ToDoubleSeconds(played->latency);
    rep.verify_seconds += dt;
    rep.rounds++;
    drafts += !tree.tokens.empty();
    accepted_total += static_cast<int64_t>(r->accepted_tokens.size());
    rep.tokens += static_cast<int64_t>(r->accepted_tokens.size()) + 1;
    if (o.on_round) {
      RoundReport rr;
      rr.round = round;
      rr.nodes = static_cast<int>(tree.tokens.size());
      rr.depth = std::min<int>(o.depth, static_cast<int>(tree.tokens.size()));
      rr.accepted = static_cast<int>(r->accepted_tokens.size());
      rr.accepted_tokens = r->accepted_tokens;
      rr.bonus = r->bonus_token;
      rr.latency_ms = dt * 1e3;
      o.on_round(rr);
    }
  }
  if (status.ok() && o.oracle) {
    auto lossless = drafter.Lossless();
    if (lossless.ok()) rep.lossless = *lossless;
    status = lossless.status();
  }
  (void)client.Close(main->session_id);
  if (!status.ok()) return status;
  rep.collected = drafter.collected();
  rep.mean_acceptance_length = MeanAcceptanceLength(accepted_total, drafts);
  rep.tokens_per_round = rep.rounds ? static_cast<double>(rep.tokens) / rep.rounds : 0;
  rep.tokens_per_second = rep.verify_seconds > 0 ? rep.tokens / rep.verify_seconds : 0;
  return rep;
}

absl::StatusOr<LoadReport> RunLoad(VerifyClient& client, const DemoOptions& o, int sessions) {
  auto info = client.GetInfo();
  if (!info.ok()) return info.status();
  const int64_t vocab = info->model().vocab_size();
  const int max_nodes = info->limits().max_draft_nodes();

  std::mutex mu;
  LoadReport rep;
  std::vector<double> latencies_ms;
  int64_t accepted_total = 0, drafts = 0;
  auto record_error = [&](const absl::Status& st) {
    std::lock_guard<std::mutex> lock(mu);
    rep.errors++;
    rep.errors_by_code[absl::StatusCodeToString(st.code())]++;
  };
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int s = 0; s < sessions; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937_64 rng(o.seed * 1000003 + s);
      const std::vector<int32_t> prompt = RandomPrompt(o.prompt_len, vocab, rng);
      auto open = client.Open(prompt, "", o.session);
      if (!open.ok()) return record_error(open.status());
      SessionDrafter drafter(client, o, vocab, max_nodes);
      if (auto st = drafter.Start(prompt, open->next_token); !st.ok()) {
        record_error(st);
        if (auto cst = client.Close(open->session_id); !cst.ok()) record_error(cst);
        return;
      }
      bool broken = false;  // a failed round leaves the collected tokens incomplete
      for (int round = 0; round < o.rounds; ++round) {
        auto played = drafter.Play(open->session_id, rng);
        if (!played.ok()) {
          record_error(played.status());
          broken = true;
          break;
        }
        const absl::StatusOr<VerifyOutcome>& r = played->outcome;
        if (!r.ok()) {
          record_error(r.status());
          broken = true;
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        rep.calls++;
        drafts += !played->tree.tokens.empty();
        latencies_ms.push_back(absl::ToDoubleMilliseconds(played->latency));
        accepted_total += static_cast<int64_t>(r->accepted_tokens.size());
        rep.tokens += static_cast<int64_t>(r->accepted_tokens.size()) + 1;
      }
      if (o.oracle && !broken) {
        auto lossless = drafter.Lossless();
        std::lock_guard<std::mutex> lock(mu);
        if (!lossless.ok()) {
          rep.errors++;
          rep.errors_by_code[absl::StatusCodeToString(lossless.status().code())]++;
        } else if (!*lossless) {
          rep.lossless_mismatches++;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        rep.shadow_calls += drafter.shadow_calls();
      }
      if (auto st = client.Close(open->session_id); !st.ok()) record_error(st);
    });
  }
  for (auto& t : threads) t.join();
  rep.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  rep.tokens_per_second = rep.wall_s > 0 ? rep.tokens / rep.wall_s : 0;
  rep.calls_per_second = rep.wall_s > 0 ? rep.calls / rep.wall_s : 0;
  rep.mean_acceptance_length = MeanAcceptanceLength(accepted_total, drafts);
  const LatencySummary lat = Summarize(latencies_ms);
  rep.p50_ms = lat.p50;
  rep.p90_ms = lat.p90;
  rep.p99_ms = lat.p99;
  rep.max_ms = lat.max;
  return rep;
}

}  // namespace verifyd::client
