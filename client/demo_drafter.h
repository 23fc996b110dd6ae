// The demo drafting frontend of verifyctl, and its load generator.
//
// The served model is random, so no real draft model predicts it. The demo drafts trees
// that mix a guess of the true continuation with random branches:
//   - oracle: the true continuation comes from a *shadow* session on the same server (same
//     prompt, plain decode steps with empty trees); each chain token is the true one with
//     probability `accuracy` (once wrong, the chain continues randomly);
//   - ngram:  prompt lookup: the tokens that followed the latest earlier occurrence of the
//     last 1..3 tokens so far (random models often fall into loops, which this catches).
// At every depth `branches - 1` random siblings are added. With the oracle, the demo and each
// load session also check losslessness: the collected tokens must equal the shadow session's
// tokens. Sessions open with `session` (sampling, logprobs, hidden states); the shadow session
// gets the same sampling parameters and seed, so for temperature > 0 the check compares the
// seeded speculative session with seeded plain decoding (coupled sampled verification emits
// exactly those tokens).
//
// Thread-safety: RunDemo/RunLoad use their own sessions; BuildDraftTree is a pure function.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/verify_client.h"

namespace verifyd::client {

struct RoundReport {
  int round = 0;
  int nodes = 0;
  int depth = 0;
  int accepted = 0;
  std::vector<int32_t> accepted_tokens;
  int32_t bonus = -1;
  double latency_ms = 0;
};

struct DemoOptions {
  bool oracle = true;
  int rounds = 16;
  int depth = 6;
  int branches = 2;
  double accuracy = 0.8;
  int prompt_len = 16;
  uint64_t seed = 1;
  SessionOptions session;  // how the sessions draw tokens and what they return
  std::function<void(const RoundReport&)> on_round;  // optional per-round callback
};

struct DemoReport {
  int rounds = 0;
  int64_t tokens = 0;  // tokens emitted by Verify rounds (accepted + bonus)
  // vLLM's mean acceptance length: 1 + accepted draft tokens / drafts (rounds whose tree had
  // at least one node); 0 without drafts.
  double mean_acceptance_length = 0;
  double tokens_per_round = 0;
  double verify_seconds = 0;       // time spent in the main session's Verify calls
  double tokens_per_second = 0;    // tokens / verify_seconds (shadow calls excluded)
  bool lossless = false;           // oracle only: collected tokens == the shadow's tokens
  std::vector<int32_t> collected;  // next_token, then accepted + bonus of every round
};

struct LoadReport {
  int64_t calls = 0;
  int64_t errors = 0;
  std::map<std::string, int64_t> errors_by_code;
  int64_t tokens = 0;
  double wall_s = 0;
  double tokens_per_second = 0;
  double calls_per_second = 0;
  double mean_acceptance_length = 0;  // as DemoReport's
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0;
  // Oracle drafter only: the shadow sessions' plain decode calls (not counted in calls,
  // tokens or latencies above, but load on the server), and the sessions whose collected
  // tokens differed from plain (greedy or seeded) decoding (must be 0: lossless).
  int64_t shadow_calls = 0;
  int64_t lossless_mismatches = 0;
};

// Builds one draft tree. `guess`: the proposed chain (true continuation or n-gram), at most
// `depth` tokens used; shorter guesses are padded with random tokens. Node count is capped
// at `max_nodes`. Parents are topological (-1 = the pending token).
DraftTree BuildDraftTree(const std::vector<int32_t>& guess, int depth, int branches,
                         int64_t vocab_size, int max_nodes, std::mt19937_64& rng);

// vLLM's mean acceptance length: 1 + accepted / drafts (0 when drafts == 0).
double MeanAcceptanceLength(int64_t accepted, int64_t drafts);

// Prompt-lookup n-gram guess from `history` (the tokens so far, pending token last).
std::vector<int32_t> NgramGuess(const std::vector<int32_t>& history, int depth);

absl::StatusOr<DemoReport> RunDemo(VerifyClient& client, const DemoOptions& options);
// `sessions` concurrent sessions, each `options.rounds` rounds with the drafter of
// `options.oracle` (oracle: every session has a shadow session and is checked for
// losslessness; ngram: prompt lookup).
absl::StatusOr<LoadReport> RunLoad(VerifyClient& client, const DemoOptions& options, int sessions);

}  // namespace verifyd::client
