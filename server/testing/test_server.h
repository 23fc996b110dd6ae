// Test helpers for the server: an in-process verifyd on loopback (picked ports), a plain
// greedy reference driven straight through tp::Engine::Step, random draft trees that
// sometimes contain the true continuation, and a minimal HTTP GET for scraping /metrics.
// Thread-safety: TestServer's client is thread-safe; the free functions are reentrant
// (GreedyViaEngine needs exclusive use of the engine it is given).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/verify_client.h"
#include "server/server.h"
#include "tp/engine.h"

namespace verifyd::server::testing {

struct TestServer {
  std::unique_ptr<Server> server;
  std::unique_ptr<client::VerifyClient> client;
  std::string target;  // 127.0.0.1:port
};

// Starts `engine` on 127.0.0.1:0 (and metrics on 127.0.0.1:0 unless options.metrics_listen
// is "" on purpose: pass metrics=false).
absl::StatusOr<TestServer> StartTestServer(ServerOptions options,
                                           std::unique_ptr<tp::Engine> engine, bool metrics = true);

// Plain greedy decoding through Engine::Step on slots [0, prompt + n): prefill in chunks of
// max_tail_rows rows (accept = false), then one row per step. Returns the n tokens after the
// prompt (the first is the pending token after the prompt). With `sampling`: plain seeded
// decoding (every step's request carries it).
absl::StatusOr<std::vector<int32_t>> GreedyViaEngine(tp::Engine* engine,
                                                     const std::vector<int32_t>& prompt, int n,
                                                     const kernels::SamplingParams& sampling = {});

// A random draft tree of at most max_nodes nodes: a path of random depth whose node at depth
// d is truth[d] with probability `hit` (until the first miss), hidden among random siblings,
// plus random extra nodes hanging anywhere. Sometimes empty.
client::DraftTree RandomTree(const std::vector<int32_t>& truth, int64_t vocab, int max_nodes,
                             double hit, std::mt19937_64& rng);

// The accepted nodes greedy acceptance must give for `tree` when the target's continuation
// after the pending token is `truth_ahead`: from the pending token, repeatedly the
// lowest-index child whose token is the next true token (kernels/tree_accept.h's rule).
std::vector<int32_t> ExpectedAcceptedNodes(const client::DraftTree& tree,
                                           const std::vector<int32_t>& truth_ahead);

// GET http://127.0.0.1:port/path; returns the body (Unavailable on socket errors).
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

}  // namespace verifyd::server::testing
