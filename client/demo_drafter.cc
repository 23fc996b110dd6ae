#include "client/demo_drafter.h"

#include <algorithm>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace verifyd::client {
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
    const int32_t main = d < static_cast<int>(guess.size()) ? guess[d] : RandomToken(vocab_size, rng);
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
      if (std::equal(history.begin() + start, history.begin() + start + n,
                     history.end() - n)) {
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

absl::StatusOr<DemoReport> RunDemo(VerifyClient& client, const DemoOptions& o) {
  auto info = client.GetInfo();
  if (!info.ok()) return info.status();
  const int64_t vocab = info->model().vocab_size();
  const int max_nodes = info->limits().max_draft_nodes();
  std::mt19937_64 rng(o.seed);
  const std::vector<int32_t> prompt = RandomPrompt(o.prompt_len, vocab, rng);

  auto main = client.Open(prompt);
  if (!main.ok()) return main.status();
  std::string shadow_id;
  std::vector<int32_t> truth;  // greedy tokens after the prompt, from the shadow session
  if (o.oracle) {
    auto shadow = client.Open(prompt);
    if (!shadow.ok()) {
      (void)client.Close(main->session_id);
      return shadow.status();
    }
    shadow_id = shadow->session_id;
    truth.push_back(shadow->next_token);
  }
  auto extend_truth = [&](size_t n) -> absl::Status {
    while (truth.size() < n) {
      auto r = client.Verify(shadow_id, DraftTree{});
      if (!r.ok()) return r.status();
      truth.push_back(r->bonus_token);
    }
    return absl::OkStatus();
  };

  DemoReport rep;
  rep.collected.push_back(main->next_token);
  std::vector<int32_t> history = prompt;
  history.push_back(main->next_token);
  int64_t accepted_total = 0;
  absl::Status status;
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<int32_t> guess;
    if (o.oracle) {
      // The draft continues after the pending token: truth[emitted .. emitted + depth).
      const size_t from = rep.collected.size();
      if (status = extend_truth(from + o.depth); !status.ok()) break;
      bool correct = true;
      for (int d = 0; d < o.depth; ++d) {
        correct = correct && std::uniform_real_distribution<double>(0, 1)(rng) < o.accuracy;
        guess.push_back(correct ? truth[from + d] : RandomToken(vocab, rng));
      }
    } else {
      guess = NgramGuess(history, o.depth);
    }
    DraftTree tree = BuildDraftTree(guess, o.depth, o.branches, vocab, max_nodes, rng);
    const absl::Time t0 = absl::Now();
    auto r = client.Verify(main->session_id, tree);
    const double dt = absl::ToDoubleSeconds(absl::Now() - t0);
    if (!r.ok()) {
      status = r.status();
      break;
    }
    rep.verify_seconds += dt;
    rep.rounds++;
    accepted_total += static_cast<int64_t>(r->accepted_tokens.size());
    rep.tokens += static_cast<int64_t>(r->accepted_tokens.size()) + 1;
    for (int32_t t : r->accepted_tokens) rep.collected.push_back(t);
    rep.collected.push_back(r->bonus_token);
    history.insert(history.end(), r->accepted_tokens.begin(), r->accepted_tokens.end());
    history.push_back(r->bonus_token);
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
    status = extend_truth(rep.collected.size());
    if (status.ok()) {
      rep.lossless = std::equal(rep.collected.begin(), rep.collected.end(), truth.begin());
    }
  }
  (void)client.Close(main->session_id);
  if (o.oracle) (void)client.Close(shadow_id);
  if (!status.ok()) return status;
  rep.mean_accepted = rep.rounds ? static_cast<double>(accepted_total) / rep.rounds : 0;
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
  int64_t accepted_total = 0;
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
      std::vector<int32_t> history = RandomPrompt(o.prompt_len, vocab, rng);
      auto open = client.Open(history);
      if (!open.ok()) return record_error(open.status());
      history.push_back(open->next_token);
      for (int round = 0; round < o.rounds; ++round) {
        DraftTree tree = BuildDraftTree(NgramGuess(history, o.depth), o.depth, o.branches,
                                        vocab, max_nodes, rng);
        const absl::Time t0 = absl::Now();
        auto r = client.Verify(open->session_id, tree);
        const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
        if (!r.ok()) {
          record_error(r.status());
          continue;
        }
        history.insert(history.end(), r->accepted_tokens.begin(), r->accepted_tokens.end());
        history.push_back(r->bonus_token);
        std::lock_guard<std::mutex> lock(mu);
        rep.calls++;
        latencies_ms.push_back(ms);
        accepted_total += static_cast<int64_t>(r->accepted_tokens.size());
        rep.tokens += static_cast<int64_t>(r->accepted_tokens.size()) + 1;
      }
      if (auto st = client.Close(open->session_id); !st.ok()) record_error(st);
    });
  }
  for (auto& t : threads) t.join();
  rep.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  rep.tokens_per_second = rep.wall_s > 0 ? rep.tokens / rep.wall_s : 0;
  rep.calls_per_second = rep.wall_s > 0 ? rep.calls / rep.wall_s : 0;
  rep.mean_accepted = rep.calls ? static_cast<double>(accepted_total) / rep.calls : 0;
  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto pct = [&](double p) {
    if (latencies_ms.empty()) return 0.0;
    size_t i = static_cast<size_t>(p * (latencies_ms.size() - 1) + 0.5);
    return latencies_ms[std::min(i, latencies_ms.size() - 1)];
  };
  rep.p50_ms = pct(0.5);
  rep.p90_ms = pct(0.9);
  rep.p99_ms = pct(0.99);
  rep.max_ms = latencies_ms.empty() ? 0 : latencies_ms.back();
  return rep;
}

}  // namespace verifyd::client
