// `verifyctl bench`: a Verify benchmark whose timed part sends only the Verify rounds it
// reports.
//
// Setup (untimed, reported apart): GetInfo; `concurrency` sessions opened on random prompts
// (their OpenSession latencies are the time-to-first-token figures); with the oracle drafter,
// every session's true continuation (greedy, or seeded plain decoding with the same sampling
// parameters) is decoded ahead with empty trees, batched over the sessions, and the sessions
// are truncated back to their prompts. Timed part: each session sends one Verify at a time
// with a draft tree built locally (no server call): the oracle drafter's chain is the true
// continuation with probability `accuracy` per token (once wrong, random), with random
// siblings; the random drafter's trees are seeded random tokens. Closed loop (request_rate
// 0): every session sends its next round as soon as the last one returns. Open loop: rounds
// arrive as a Poisson process of `request_rate` per second and each is sent by an idle
// session (an arrival finding every session busy waits: counted in late_arrivals).
//
// Acceptance is vLLM's mean acceptance length: 1 + accepted draft tokens / drafts, where
// drafts are the rounds whose tree had at least one node.
//
// Thread-safety: RunBench uses its own sessions and threads; the client may be shared.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/verify_client.h"

namespace verifyd::client {

struct BenchOptions {
  std::string drafter = "oracle";  // oracle | random
  int concurrency = 8;             // sessions, one Verify in flight each
  double request_rate = 0;         // rounds/s (Poisson arrivals); 0 or inf = closed loop
  double duration_s = 0;           // timed part: this long, or
  int64_t num_rounds = 0;          // this many Verify rounds in all (exactly one is > 0)
  int depth = 6;                   // draft chain depth (0: plain decode steps, no drafts)
  int branches = 2;                // alternatives per depth
  double accuracy = 0.8;           // oracle: chance each chain token is the true one
  int prompt_len = 16;
  int64_t oracle_tokens = 0;  // oracle: tokens decoded ahead per session (0: from the rounds)
  uint64_t seed = 1;
  SessionOptions session;
};

// Milliseconds.
struct LatencySummary {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

// Nearest-rank percentiles of `ms` (sorted in place).
LatencySummary Summarize(std::vector<double>& ms);

struct BenchReport {
  std::string model, backend;  // from GetInfo
  int64_t rounds = 0;          // timed Verify rounds that succeeded
  int64_t errors = 0;
  std::map<std::string, int64_t> errors_by_code;
  int64_t drafts = 0;           // rounds whose tree had at least one node
  int64_t draft_tokens = 0;     // tree nodes sent
  int64_t accepted_tokens = 0;  // draft tokens accepted (bonus excluded)
  int64_t output_tokens = 0;    // accepted + one bonus per round
  double duration_s = 0;        // timed part, first send to last response
  double rounds_per_s = 0;
  double tokens_per_s = 0;
  std::optional<double> mean_acceptance_length;  // unset without drafts
  double acceptance_rate = 0;                    // accepted / draft tokens
  LatencySummary latency_ms;                     // one Verify round, send to response
  LatencySummary ttft_ms;                        // setup: OpenSession (prefill + first token)
  double mean_tpot_ms = 0;                       // sum of round latencies / output tokens
  // Setup, before the timed part (counted by the server's metrics, not in the figures above).
  int64_t setup_open_calls = 0, setup_verify_calls = 0, setup_truncate_calls = 0;
  double setup_s = 0;
  // Open loop: arrivals sent more than 1 ms after their time (every session busy).
  int64_t late_arrivals = 0;
  // Oracle: rounds past the decoded-ahead continuation (drafted randomly instead).
  int64_t oracle_exhausted_rounds = 0;
};

absl::StatusOr<BenchReport> RunBench(VerifyClient& client, const BenchOptions& options);

// The report as a table for a terminal, and as JSON (settings, vLLM benchmark_serving.py's
// field names where they correspond, verifyd's own figures).
std::string BenchTable(const BenchOptions& options, const BenchReport& report);
std::string BenchJson(const BenchOptions& options, const BenchReport& report,
                      const std::string& target);

}  // namespace verifyd::client
