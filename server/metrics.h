// Prometheus metrics of verifyd (names and label sets are part of the operations contract:
// deploy/ dashboards and alerts use them). No per-session labels: every label has a small
// fixed value set (stage, rank < tp, depth 1..64, method, gRPC code name). Every verifyd_
// series carries the served model's name as `model_name` (vLLM's label name) when one is
// given.
//
// Thread-safety: prometheus-cpp metric objects are thread-safe; the tokens/s window has its
// own mutex. Metrics outlives the exposer that reads its registry.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace verifyd::server {

inline constexpr int kMaxDepthLabel = 64;  // depth labels 1..64 (deeper trees clamp to 64)

class Metrics {
 public:
  // `model_name`: the served model's name, a constant `model_name` label on every verifyd_
  // series ("" = no such label).
  Metrics(int tp_size, const std::string& version, const std::string& backend,
          const std::string& model_name = "");

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // Verify latency stages (seconds).
  void ObserveVerifyLatency(double queue_s, double engine_s, double total_s);
  void ObserveEngineStep(double total_s, const std::vector<double>& per_rank_s);
  void ObserveBatchSize(int n);
  // One verified tree: `depths` = depth (1-based) of every draft node; `accepted` = accepted
  // path length (the accepted node at position k is at depth k + 1); `sampled`: the session
  // draws its tokens (else greedy).
  void ObserveTree(const std::vector<int>& node_depths, int accepted, bool sampled = false);
  // One completed OpenSession prefill of `prompt_tokens` tokens: latency by stage (seconds),
  // and whether the session samples.
  void ObservePrefill(double queue_s, double engine_s, double total_s, int64_t prompt_tokens,
                      bool sampled);
  void CountRequest(const std::string& method, const std::string& code);

  void SetActiveSessions(int64_t n) { active_sessions_->Set(static_cast<double>(n)); }
  void SetKvSlots(int64_t used, int64_t total);
  void SetQueueDepth(int64_t n) { queue_depth_->Set(static_cast<double>(n)); }
  // Recomputes verifyd_tokens_per_second over the last `window` (emitted tokens / window).
  void UpdateTokensPerSecond(absl::Time now);

 private:
  struct FamilyMaker;  // registers a family with the model label (metrics.cc)

  // The constructor's registration steps, by concern, called in this order (prometheus-cpp
  // exposes the families of each metric type in the order they were registered).
  void RegisterLatencies(const FamilyMaker& make, int tp_size);
  void RegisterTokensAndAcceptance(const FamilyMaker& make);
  void RegisterBatchSessionsAndKv(const FamilyMaker& make);
  void RegisterRequestsAndBuildInfo(const FamilyMaker& make, const std::string& version,
                                    const std::string& backend);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* latency_queue_;
  prometheus::Histogram* latency_engine_;
  prometheus::Histogram* latency_total_;
  prometheus::Histogram* engine_step_;
  std::vector<prometheus::Histogram*> rank_step_;
  prometheus::Histogram* prefill_queue_;
  prometheus::Histogram* prefill_engine_;
  prometheus::Histogram* prefill_total_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* drafts_;
  prometheus::Counter* rounds_greedy_;
  prometheus::Counter* rounds_sampled_;
  prometheus::Counter* sessions_greedy_;
  prometheus::Counter* sessions_sampled_;
  prometheus::Counter* draft_tokens_;
  prometheus::Counter* accepted_tokens_;
  prometheus::Counter* emitted_tokens_;
  std::vector<prometheus::Counter*> accepted_by_depth_;  // [kMaxDepthLabel]
  std::vector<prometheus::Counter*> depth_reached_;      // [kMaxDepthLabel]
  prometheus::Histogram* accept_length_;
  prometheus::Histogram* batch_size_;
  prometheus::Gauge* active_sessions_;
  prometheus::Gauge* kv_used_;
  prometheus::Gauge* kv_total_;
  prometheus::Gauge* queue_depth_;
  prometheus::Gauge* tokens_per_second_;
  prometheus::Family<prometheus::Counter>* requests_;

  const absl::Duration window_ = absl::Seconds(10);
  absl::Mutex mu_;
  std::deque<std::pair<absl::Time, int64_t>> emitted_window_ ABSL_GUARDED_BY(mu_);
};

}  // namespace verifyd::server
