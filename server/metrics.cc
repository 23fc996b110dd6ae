#include "server/metrics.h"

#include <algorithm>

namespace verifyd::server {
namespace {

using prometheus::Histogram;

// Latency buckets: 100 us .. ~10 s, roughly x2.5 per step.
Histogram::BucketBoundaries LatencyBuckets() {
  return {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
          5e-2, 0.1,    0.25, 0.5,  1.0,    2.5,  5.0,  10.0};
}

Histogram::BucketBoundaries CountBuckets(int max) {
  Histogram::BucketBoundaries b;
  for (int v = 0; v <= max; v = v < 4 ? v + 1 : v * 2) b.push_back(v);
  return b;
}

}  // namespace

// Registers families in one registry, each with the constant labels `model`.
struct Metrics::FamilyMaker {
  prometheus::Registry& reg;
  const prometheus::Labels& model;

  prometheus::Family<prometheus::Counter>& Counter(const std::string& name,
                                                   const std::string& help) const {
    return prometheus::BuildCounter().Name(name).Help(help).Labels(model).Register(reg);
  }
  prometheus::Family<prometheus::Gauge>& Gauge(const std::string& name,
                                               const std::string& help) const {
    return prometheus::BuildGauge().Name(name).Help(help).Labels(model).Register(reg);
  }
  prometheus::Family<prometheus::Histogram>& Histogram(const std::string& name,
                                                       const std::string& help) const {
    return prometheus::BuildHistogram().Name(name).Help(help).Labels(model).Register(reg);
  }
};

Metrics::Metrics(int tp_size, const std::string& version, const std::string& backend,
                 const std::string& model_name)
    : registry_(std::make_shared<prometheus::Registry>()) {
  // The constant label of every family (none without a model name).
  prometheus::Labels model;
  if (!model_name.empty()) model["model_name"] = model_name;
  const FamilyMaker make{*registry_, model};
  RegisterLatencies(make, tp_size);
  RegisterTokensAndAcceptance(make);
  RegisterBatchSessionsAndKv(make);
  RegisterRequestsAndBuildInfo(make, version, backend);
}

void Metrics::RegisterLatencies(const FamilyMaker& make, int tp_size) {
  auto& latency = make.Histogram("verifyd_verify_latency_seconds",
                                 "Verify request latency in seconds by stage: queue (waiting for "
                                 "an engine step), engine (the step that ran it), total (handler)");
  latency_queue_ = &latency.Add({{"stage", "queue"}}, LatencyBuckets());
  latency_engine_ = &latency.Add({{"stage", "engine"}}, LatencyBuckets());
  latency_total_ = &latency.Add({{"stage", "total"}}, LatencyBuckets());
  engine_step_ = &make.Histogram("verifyd_engine_step_seconds",
                                 "Wall time of one engine step (one batched forward) in seconds")
                      .Add({}, LatencyBuckets());
  auto& rank =
      make.Histogram("verifyd_engine_rank_step_seconds",
                     "Forward time of one tensor-parallel rank in one engine step, seconds");
  for (int r = 0; r < tp_size; ++r) {
    rank_step_.push_back(&rank.Add({{"rank", std::to_string(r)}}, LatencyBuckets()));
  }
  auto& prefill = make.Histogram(
      "verifyd_prefill_latency_seconds",
      "OpenSession prefill latency in seconds by stage: queue (waiting for its first engine "
      "step), engine (the steps that ran its chunks), total (handler)");
  prefill_queue_ = &prefill.Add({{"stage", "queue"}}, LatencyBuckets());
  prefill_engine_ = &prefill.Add({{"stage", "engine"}}, LatencyBuckets());
  prefill_total_ = &prefill.Add({{"stage", "total"}}, LatencyBuckets());
}

void Metrics::RegisterTokensAndAcceptance(const FamilyMaker& make) {
  prompt_tokens_ =
      &make.Counter("verifyd_prompt_tokens_total", "Prompt tokens prefilled by OpenSession")
           .Add({});
  drafts_ = &make.Counter("verifyd_drafts_total",
                          "Draft trees with at least one node verified (mean acceptance length = "
                          "1 + verifyd_accepted_tokens_total / verifyd_drafts_total)")
                 .Add({});
  auto& rounds =
      make.Counter("verifyd_rounds_total", "Verify items applied, by the session's decoding mode");
  rounds_greedy_ = &rounds.Add({{"mode", "greedy"}});
  rounds_sampled_ = &rounds.Add({{"mode", "sampled"}});
  auto& sessions = make.Counter("verifyd_sessions_opened_total",
                                "Sessions opened (prefilled) by OpenSession, by decoding mode");
  sessions_greedy_ = &sessions.Add({{"mode", "greedy"}});
  sessions_sampled_ = &sessions.Add({{"mode", "sampled"}});
  draft_tokens_ =
      &make.Counter("verifyd_draft_tokens_total", "Draft tree nodes received in Verify").Add({});
  accepted_tokens_ =
      &make.Counter("verifyd_accepted_tokens_total", "Draft tokens accepted by the target").Add({});
  emitted_tokens_ = &make.Counter("verifyd_emitted_tokens_total",
                                  "Tokens emitted by Verify (accepted + one bonus per tree)")
                         .Add({});
  auto& by_depth = make.Counter(
      "verifyd_accepted_tokens_by_depth_total",
      "Accepted draft tokens by tree depth (1 = child of the pending token); divide by "
      "verifyd_draft_depth_reached_total for the acceptance rate per depth");
  auto& reached = make.Counter("verifyd_draft_depth_reached_total",
                               "Draft trees that had at least one node at this depth");
  for (int d = 1; d <= kMaxDepthLabel; ++d) {
    accepted_by_depth_.push_back(&by_depth.Add({{"depth", std::to_string(d)}}));
    depth_reached_.push_back(&reached.Add({{"depth", std::to_string(d)}}));
  }
  accept_length_ =
      &make.Histogram("verifyd_accept_length", "Accepted draft tokens per Verify item (round)")
           .Add({}, CountBuckets(64));
}

void Metrics::RegisterBatchSessionsAndKv(const FamilyMaker& make) {
  batch_size_ = &make.Histogram("verifyd_batch_size", "Requests (sessions) per engine step")
                     .Add({}, CountBuckets(256));
  active_sessions_ = &make.Gauge("verifyd_active_sessions", "Open sessions").Add({});
  kv_used_ = &make.Gauge("verifyd_kv_slots_used", "KV pool slots (tokens) in use").Add({});
  kv_total_ =
      &make.Gauge("verifyd_kv_slots_capacity", "KV pool capacity in slots (tokens)").Add({});
  queue_depth_ =
      &make.Gauge("verifyd_queue_depth", "Requests waiting in the scheduler queue").Add({});
  tokens_per_second_ =
      &make.Gauge("verifyd_tokens_per_second", "Emitted tokens per second over the last 10 seconds")
           .Add({});
}

void Metrics::RegisterRequestsAndBuildInfo(const FamilyMaker& make, const std::string& version,
                                           const std::string& backend) {
  requests_ =
      &make.Counter("verifyd_requests_total", "RPCs handled, by method and gRPC status code");
  // Every (method, code) series exists at zero from the first scrape, so rate() and alerts
  // see the first error (the 7 methods x 17 codes, a fixed set).
  for (const char* method : {"GetInfo", "OpenSession", "Verify", "VerifyStream", "CloseSession",
                             "TruncateSession", "ForkSession"}) {
    for (const char* code :
         {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
          "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
          "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
          "UNAUTHENTICATED"}) {
      requests_->Add({{"method", method}, {"code", code}});
    }
  }
  make.Gauge("verifyd_build_info", "Build information; always 1")
      .Add({{"version", version}, {"backend", backend}})
      .Set(1);
}

void Metrics::ObserveVerifyLatency(double queue_s, double engine_s, double total_s) {
  latency_queue_->Observe(queue_s);
  latency_engine_->Observe(engine_s);
  latency_total_->Observe(total_s);
}

void Metrics::ObserveEngineStep(double total_s, const std::vector<double>& per_rank_s) {
  engine_step_->Observe(total_s);
  for (size_t r = 0; r < per_rank_s.size() && r < rank_step_.size(); ++r) {
    rank_step_[r]->Observe(per_rank_s[r]);
  }
}

void Metrics::ObserveBatchSize(int n) { batch_size_->Observe(n); }

void Metrics::ObservePrefill(double queue_s, double engine_s, double total_s, int64_t prompt_tokens,
                             bool sampled) {
  prefill_queue_->Observe(queue_s);
  prefill_engine_->Observe(engine_s);
  prefill_total_->Observe(total_s);
  prompt_tokens_->Increment(static_cast<double>(prompt_tokens));
  (sampled ? sessions_sampled_ : sessions_greedy_)->Increment();
}

void Metrics::ObserveTree(const std::vector<int>& node_depths, int accepted, bool sampled) {
  if (!node_depths.empty()) drafts_->Increment();
  (sampled ? rounds_sampled_ : rounds_greedy_)->Increment();
  draft_tokens_->Increment(static_cast<double>(node_depths.size()));
  accepted_tokens_->Increment(accepted);
  emitted_tokens_->Increment(accepted + 1);
  accept_length_->Observe(accepted);
  int max_depth = 0;
  for (int d : node_depths) max_depth = std::max(max_depth, d);
  max_depth = std::min(max_depth, kMaxDepthLabel);
  for (int d = 1; d <= max_depth; ++d) depth_reached_[d - 1]->Increment();
  for (int k = 0; k < accepted; ++k) {
    accepted_by_depth_[std::min(k + 1, kMaxDepthLabel) - 1]->Increment();
  }
  // One window entry per 100 ms keeps the window small under load.
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (!emitted_window_.empty() && now - emitted_window_.back().first < absl::Milliseconds(100)) {
    emitted_window_.back().second += accepted + 1;
  } else {
    emitted_window_.emplace_back(now, accepted + 1);
  }
}

void Metrics::CountRequest(const std::string& method, const std::string& code) {
  requests_->Add({{"method", method}, {"code", code}}).Increment();
}

void Metrics::SetKvSlots(int64_t used, int64_t total) {
  kv_used_->Set(static_cast<double>(used));
  kv_total_->Set(static_cast<double>(total));
}

void Metrics::UpdateTokensPerSecond(absl::Time now) {
  absl::MutexLock lock(&mu_);
  while (!emitted_window_.empty() && now - emitted_window_.front().first > window_) {
    emitted_window_.pop_front();
  }
  int64_t sum = 0;
  for (const auto& [t, n] : emitted_window_) sum += n;
  tokens_per_second_->Set(static_cast<double>(sum) / absl::ToDoubleSeconds(window_));
}

}  // namespace verifyd::server
