#include "client/bench.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/demo_drafter.h"

namespace verifyd::client {

LatencySummary Summarize(std::vector<double>& ms) {
  LatencySummary s;
  s.count = static_cast<int64_t>(ms.size());
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  double sum = 0;
  for (double v : ms) sum += v;
  s.mean = sum / ms.size();
  auto pct = [&](double p) {
    const size_t i = static_cast<size_t>(p * (ms.size() - 1) + 0.5);
    return ms[std::min(i, ms.size() - 1)];
  };
  s.p50 = pct(0.5);
  s.p90 = pct(0.9);
  s.p99 = pct(0.99);
  s.max = ms.back();
  return s;
}

namespace {

// One benchmark session: its id, its prompt and, with the oracle, the continuation decoded
// ahead (truth[0] = the pending token after the prompt).
struct BenchSession {
  std::string id;
  std::vector<int32_t> truth;
  std::vector<int32_t> collected;  // pending token, then accepted + bonus of every round
  std::mt19937_64 rng;
  int64_t quota = -1;  // closed loop with num_rounds: this session's rounds (-1: shared)
};

// Poisson arrival times (seconds after the start) handed to idle sessions in order.
class Arrivals {
 public:
  Arrivals(double rate, uint64_t seed) : rate_(rate), rng_(seed) {}
  double Next() {
    std::lock_guard<std::mutex> lock(mu_);
    t_ += std::exponential_distribution<double>(rate_)(rng_);
    return t_;
  }

 private:
  std::mutex mu_;
  const double rate_;
  std::mt19937_64 rng_;
  double t_ = 0;
};

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonLatency(const LatencySummary& s) {
  return absl::StrFormat(
      "{\"count\": %d, \"mean\": %.4f, \"p50\": %.4f, \"p90\": %.4f, \"p99\": %.4f, "
      "\"max\": %.4f}",
      s.count, s.mean, s.p50, s.p90, s.p99, s.max);
}

bool ClosedLoop(const BenchOptions& o) {
  return !(o.request_rate > 0) || std::isinf(o.request_rate);
}

// What the setup and the timed part share.
struct BenchRun {
  VerifyClient& client;
  const BenchOptions& o;
  bool oracle = false, closed = false;
  int64_t vocab = 0;
  int max_nodes = 0, max_batch = 1;
  int64_t max_context = 0;
  std::vector<BenchSession> sessions;
  std::vector<std::vector<int32_t>> prompts;
  BenchReport rep;
  void CloseAll() {
    for (auto& s : sessions) {
      if (!s.id.empty()) (void)client.Close(s.id);
    }
  }
};

// Opens o.concurrency sessions with random prompts, in parallel (their OpenSession latency is
// the report's TTFT).
absl::Status OpenSessions(BenchRun& b) {
  const BenchOptions& o = b.o;
  std::vector<double> ttft_ms(o.concurrency, 0);
  std::vector<absl::Status> open_status(o.concurrency);
  b.sessions.resize(o.concurrency);
  b.prompts.resize(o.concurrency);
  std::vector<std::thread> threads;
  for (int s = 0; s < o.concurrency; ++s) {
    b.sessions[s].rng.seed(o.seed * 1000003 + s);
    b.prompts[s].resize(std::max(1, o.prompt_len));
    for (auto& t : b.prompts[s]) {
      t = static_cast<int32_t>(
          std::uniform_int_distribution<int64_t>(0, b.vocab - 1)(b.sessions[s].rng));
    }
    threads.emplace_back([&, s] {
      const absl::Time t0 = absl::Now();
      auto r = b.client.Open(b.prompts[s], "", o.session);
      ttft_ms[s] = absl::ToDoubleMilliseconds(absl::Now() - t0);
      if (!r.ok()) {
        open_status[s] = r.status();
        return;
      }
      b.sessions[s].id = r->session_id;
      b.sessions[s].truth = {r->next_token};
    });
  }
  for (auto& t : threads) t.join();
  b.rep.setup_open_calls = o.concurrency;
  for (const auto& st : open_status) {
    if (!st.ok()) return st;
  }
  b.rep.ttft_ms = Summarize(ttft_ms);
  return absl::OkStatus();
}

// The oracle's continuations: decodes ahead with empty trees (max_batch sessions a call), then
// truncates every session back to its prompt.
absl::Status DecodeOracle(BenchRun& b) {
  const BenchOptions& o = b.o;
  auto& sessions = b.sessions;
  int64_t horizon = o.oracle_tokens;
  if (horizon <= 0) {
    // Rounds a session may run: its quota (closed loop), else a generous share.
    const int64_t share = (o.num_rounds + o.concurrency - 1) / o.concurrency;
    const int64_t rounds = o.num_rounds <= 0 ? 512 / (o.depth + 1) + 1
                           : b.closed        ? share
                                             : std::min<int64_t>(o.num_rounds, 2 * share + 4);
    horizon = rounds * (o.depth + 1) + o.depth + 1;
  }
  horizon = std::min<int64_t>(horizon, b.max_context - o.prompt_len - 1);
  for (int64_t k = 1; k < horizon; ++k) {
    for (int first = 0; first < o.concurrency; first += b.max_batch) {
      const int n = std::min(b.max_batch, o.concurrency - first);
      std::vector<std::string> ids;
      for (int s = first; s < first + n; ++s) ids.push_back(sessions[s].id);
      auto r = b.client.VerifyMany(ids, std::vector<DraftTree>(n));
      ++b.rep.setup_verify_calls;
      if (!r.ok()) return r.status();
      for (int i = 0; i < n; ++i) sessions[first + i].truth.push_back((*r)[i].bonus_token);
    }
  }
  for (int s = 0; s < o.concurrency; ++s) {
    auto r = b.client.Truncate(sessions[s].id, static_cast<int64_t>(b.prompts[s].size()));
    ++b.rep.setup_truncate_calls;
    if (r.ok() && r->next_token != sessions[s].truth[0]) {
      r = absl::InternalError("TruncateSession did not restore the pending token");
    }
    if (!r.ok()) return r.status();
  }
  return absl::OkStatus();
}

// The timed part: one thread a session sends its rounds (closed loop, or at Poisson arrivals);
// fills the report's counters, latencies and duration.
void RunTimedRounds(BenchRun& b) {
  const BenchOptions& o = b.o;
  const bool oracle = b.oracle, closed = b.closed;
  const int64_t vocab = b.vocab;
  const int max_nodes = b.max_nodes;
  VerifyClient& client = b.client;
  BenchReport& rep = b.rep;
  std::mutex mu;
  std::vector<double> latencies_ms;
  double latency_sum_ms = 0;
  std::atomic<int64_t> issued{0};
  Arrivals arrivals(closed ? 1.0 : o.request_rate, o.seed ^ 0x9e3779b97f4a7c15ULL);
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(o.duration_s);
  absl::Time last_response = start;
  auto worker = [&](BenchSession& s) {
    for (int64_t done = 0;; ++done) {
      if (s.quota >= 0 && done >= s.quota) return;
      if (o.num_rounds > 0 && s.quota < 0 && issued.fetch_add(1) >= o.num_rounds) return;
      bool late = false;
      if (!closed) {
        const absl::Time due = start + absl::Seconds(arrivals.Next());
        if (o.duration_s > 0 && due >= end) return;
        absl::SleepFor(due - absl::Now());
        late = absl::Now() - due > absl::Milliseconds(1);
      } else if (o.duration_s > 0 && absl::Now() >= end) {
        return;
      }
      // The draft tree, built locally.
      const size_t from = s.collected.size();
      std::vector<int32_t> guess;
      bool exhausted = false;
      if (oracle) {
        exhausted = from + o.depth > s.truth.size();
        bool correct = !exhausted;
        for (int d = 0; d < o.depth && !exhausted; ++d) {
          correct = correct && std::uniform_real_distribution<double>(0, 1)(s.rng) < o.accuracy;
          if (!correct) break;
          guess.push_back(s.truth[from + d]);
        }
      }
      const DraftTree tree = BuildDraftTree(guess, o.depth, o.branches, vocab, max_nodes, s.rng);
      const absl::Time t0 = absl::Now();
      auto r = client.Verify(s.id, tree);
      const absl::Time t1 = absl::Now();
      std::lock_guard<std::mutex> lock(mu);
      last_response = std::max(last_response, t1);
      rep.late_arrivals += late;
      if (!r.ok()) {
        rep.errors++;
        rep.errors_by_code[absl::StatusCodeToString(r.status().code())]++;
        return;  // the session's state is unknown now
      }
      const double ms = absl::ToDoubleMilliseconds(t1 - t0);
      latencies_ms.push_back(ms);
      latency_sum_ms += ms;
      rep.rounds++;
      rep.oracle_exhausted_rounds += exhausted;
      rep.drafts += !tree.tokens.empty();
      rep.draft_tokens += static_cast<int64_t>(tree.tokens.size());
      rep.accepted_tokens += static_cast<int64_t>(r->accepted_tokens.size());
      rep.output_tokens += static_cast<int64_t>(r->accepted_tokens.size()) + 1;
      s.collected.insert(s.collected.end(), r->accepted_tokens.begin(), r->accepted_tokens.end());
      s.collected.push_back(r->bonus_token);
    }
  };
  {
    std::vector<std::thread> threads;
    for (auto& s : b.sessions) threads.emplace_back(worker, std::ref(s));
    for (auto& t : threads) t.join();
  }
  rep.duration_s = absl::ToDoubleSeconds(last_response - start);
  b.rep.latency_ms = Summarize(latencies_ms);
  if (b.rep.duration_s > 0) {
    b.rep.rounds_per_s = b.rep.rounds / b.rep.duration_s;
    b.rep.tokens_per_s = b.rep.output_tokens / b.rep.duration_s;
  }
  if (b.rep.drafts > 0) {
    b.rep.mean_acceptance_length = MeanAcceptanceLength(b.rep.accepted_tokens, b.rep.drafts);
  }
  if (b.rep.draft_tokens > 0) {
    b.rep.acceptance_rate = static_cast<double>(b.rep.accepted_tokens) / b.rep.draft_tokens;
  }
  if (b.rep.output_tokens > 0) b.rep.mean_tpot_ms = latency_sum_ms / b.rep.output_tokens;
}

}  // namespace

absl::StatusOr<BenchReport> RunBench(VerifyClient& client, const BenchOptions& o) {
  if (o.concurrency < 1) return absl::InvalidArgumentError("--concurrency: must be >= 1");
  if ((o.duration_s > 0) == (o.num_rounds > 0)) {
    return absl::InvalidArgumentError("give one of --duration_s and --num_rounds (> 0)");
  }
  if (o.drafter != "oracle" && o.drafter != "random") {
    return absl::InvalidArgumentError("--drafter: oracle or random");
  }
  auto info = client.GetInfo();
  if (!info.ok()) return info.status();
  BenchRun b{client, o};
  b.oracle = o.drafter == "oracle";
  b.closed = ClosedLoop(o);
  b.rep.model = info->model().name();
  b.rep.backend = info->backend();
  b.vocab = info->model().vocab_size();
  b.max_nodes = info->limits().max_draft_nodes();
  b.max_batch = std::max(1, info->limits().max_batch());
  b.max_context = info->limits().max_context();

  // Setup (untimed): sessions, prefill, the oracle's continuations.
  const absl::Time setup_start = absl::Now();
  absl::Status st = OpenSessions(b);
  if (st.ok() && b.closed && o.num_rounds > 0) {
    for (int s = 0; s < o.concurrency; ++s) {
      b.sessions[s].quota = o.num_rounds / o.concurrency + (s < o.num_rounds % o.concurrency);
    }
  }
  if (st.ok() && b.oracle) st = DecodeOracle(b);
  if (!st.ok()) {
    b.CloseAll();
    return st;
  }
  for (auto& s : b.sessions) s.collected = {s.truth[0]};
  b.rep.setup_s = absl::ToDoubleSeconds(absl::Now() - setup_start);

  RunTimedRounds(b);
  b.CloseAll();
  return b.rep;
}

std::string BenchTable(const BenchOptions& o, const BenchReport& r) {
  std::string out;
  auto row = [&](const std::string& k, const std::string& v) {
    absl::StrAppend(&out, absl::StrFormat("%-38s %s\n", k, v));
  };
  const std::string mode = ClosedLoop(o)
                               ? absl::StrCat("closed loop, concurrency ", o.concurrency)
                               : absl::StrFormat("open loop, %g rounds/s (Poisson), concurrency %d",
                                                 o.request_rate, o.concurrency);
  absl::StrAppend(&out, "============ verifyctl bench ============\n");
  row("Model / backend:", absl::StrCat(r.model, " / ", r.backend));
  row("Mode:", mode);
  row("Drafter:",
      absl::StrFormat("%s, depth %d, branches %d%s", o.drafter, o.depth, o.branches,
                      o.drafter == "oracle" ? absl::StrFormat(", accuracy %g", o.accuracy) : ""));
  row("Verify rounds (timed):", absl::StrCat(r.rounds));
  row("Errors:", absl::StrCat(r.errors));
  row("Duration (s):", absl::StrFormat("%.3f", r.duration_s));
  row("Verify rounds/s (request_throughput):", absl::StrFormat("%.2f", r.rounds_per_s));
  row("Output tokens/s (output_throughput):", absl::StrFormat("%.2f", r.tokens_per_s));
  row("Mean acceptance length:", r.mean_acceptance_length
                                     ? absl::StrFormat("%.3f", *r.mean_acceptance_length)
                                     : std::string("- (no drafts)"));
  row("Acceptance rate (accepted/draft):", absl::StrFormat("%.3f", r.acceptance_rate));
  absl::StrAppend(&out, "---------- Verify round latency (ms) ----------\n");
  row("Mean / p50 / p90 / p99 / max:",
      absl::StrFormat("%.2f / %.2f / %.2f / %.2f / %.2f", r.latency_ms.mean, r.latency_ms.p50,
                      r.latency_ms.p90, r.latency_ms.p99, r.latency_ms.max));
  row("Mean per output token (TPOT):", absl::StrFormat("%.2f", r.mean_tpot_ms));
  absl::StrAppend(&out, "---------- Setup (untimed) ----------\n");
  row("OpenSession / TTFT ms mean, p50, p99:",
      absl::StrFormat("%.2f, %.2f, %.2f (%d sessions)", r.ttft_ms.mean, r.ttft_ms.p50,
                      r.ttft_ms.p99, r.setup_open_calls));
  row("Setup Verify / Truncate calls:",
      absl::StrCat(r.setup_verify_calls, " / ", r.setup_truncate_calls));
  if (r.late_arrivals > 0) row("Late arrivals (all sessions busy):", absl::StrCat(r.late_arrivals));
  if (r.oracle_exhausted_rounds > 0) {
    row("Rounds past the oracle's tokens:", absl::StrCat(r.oracle_exhausted_rounds));
  }
  absl::StrAppend(&out, "=========================================\n");
  return out;
}

std::string BenchJson(const BenchOptions& o, const BenchReport& r, const std::string& target) {
  std::string errors;
  for (const auto& [code, n] : r.errors_by_code) {
    absl::StrAppend(&errors, errors.empty() ? "" : ", ", JsonString(code), ": ", n);
  }
  const std::string rate = ClosedLoop(o) ? "null" : absl::StrFormat("%g", o.request_rate);
  const std::string mal =
      r.mean_acceptance_length ? absl::StrFormat("%.6f", *r.mean_acceptance_length) : "null";
  std::string out = "{\n";
  auto field = [&](const std::string& k, const std::string& v) {
    absl::StrAppend(&out, "  ", JsonString(k), ": ", v, ",\n");
  };
  field("settings",
        absl::StrFormat(
            "{\"target\": %s, \"model\": %s, \"backend\": %s, \"mode\": %s, "
            "\"request_rate\": %s, \"concurrency\": %d, \"duration_s\": %g, \"num_rounds\": %d, "
            "\"drafter\": %s, \"depth\": %d, \"branches\": %d, \"accuracy\": %g, "
            "\"prompt_len\": %d, \"seed\": %d, \"temperature\": %g}",
            JsonString(target), JsonString(r.model), JsonString(r.backend),
            JsonString(ClosedLoop(o) ? "closed" : "open"), rate, o.concurrency, o.duration_s,
            o.num_rounds, JsonString(o.drafter), o.depth, o.branches, o.accuracy, o.prompt_len,
            o.seed, o.session.temperature));
  field("completed", absl::StrCat(r.rounds));
  field("errors", absl::StrCat(r.errors));
  field("errors_by_code", absl::StrCat("{", errors, "}"));
  field("duration_s", absl::StrFormat("%.6f", r.duration_s));
  field("verify_rounds_per_s", absl::StrFormat("%.4f", r.rounds_per_s));
  field("tokens_per_s", absl::StrFormat("%.4f", r.tokens_per_s));
  field("mean_acceptance_length", mal);
  field("acceptance_rate", absl::StrFormat("%.6f", r.acceptance_rate));
  field("drafts", absl::StrCat(r.drafts));
  field("draft_tokens", absl::StrCat(r.draft_tokens));
  field("accepted_tokens", absl::StrCat(r.accepted_tokens));
  field("latency_ms", JsonLatency(r.latency_ms));
  field("ttft_ms", JsonLatency(r.ttft_ms));
  // vLLM benchmark_serving.py's names for the corresponding figures (README, "verifyctl").
  field("request_throughput", absl::StrFormat("%.4f", r.rounds_per_s));
  field("output_throughput", absl::StrFormat("%.4f", r.tokens_per_s));
  field("total_output_tokens", absl::StrCat(r.output_tokens));
  field("mean_ttft_ms", absl::StrFormat("%.4f", r.ttft_ms.mean));
  field("median_ttft_ms", absl::StrFormat("%.4f", r.ttft_ms.p50));
  field("p99_ttft_ms", absl::StrFormat("%.4f", r.ttft_ms.p99));
  field("mean_itl_ms", absl::StrFormat("%.4f", r.latency_ms.mean));
  field("median_itl_ms", absl::StrFormat("%.4f", r.latency_ms.p50));
  field("p99_itl_ms", absl::StrFormat("%.4f", r.latency_ms.p99));
  field("mean_tpot_ms", absl::StrFormat("%.4f", r.mean_tpot_ms));
  field("setup", absl::StrFormat("{\"open_calls\": %d, \"verify_calls\": %d, "
                                 "\"truncate_calls\": %d, \"seconds\": %.4f}",
                                 r.setup_open_calls, r.setup_verify_calls, r.setup_truncate_calls,
                                 r.setup_s));
  field("late_arrivals", absl::StrCat(r.late_arrivals));
  absl::StrAppend(&out, "  \"oracle_exhausted_rounds\": ", r.oracle_exhausted_rounds, "\n}\n");
  return out;
}

}  // namespace verifyd::client
