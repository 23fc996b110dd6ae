#include "server/server.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/resource_quota.h"
#include "kernels/status.h"
#include "prometheus/exposer.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/service.h"
#include "server/session_manager.h"
#include "server/slot_allocator.h"
#include "server/startup_gate.h"
#include "server/startup_metrics.h"
#include "server/validation.h"
#include "spdlog/spdlog.h"

namespace verifyd::server {
namespace {

// Linking libgrpc++_reflection registers its plugin for every server (a static initializer);
// this builder option takes it out again unless --reflection asked for it.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

absl::Status ValidateEngine(const tp::Engine* engine) {
  if (!engine) return absl::InvalidArgumentError("engine: must not be null");
  const tp::EngineLimits elimits = engine->limits();
  if (elimits.max_tail_rows < 2 || elimits.max_batch < 1 || elimits.max_context < 2) {
    return absl::InvalidArgumentError(
        "engine limits: need max_tail_rows >= 2, max_batch >= 1, "
        "max_context >= 2");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::BuildAndStart(ServerOptions options,
                                                              std::unique_ptr<tp::Engine> engine) {
  if (absl::Status st = ValidateEngine(engine.get()); !st.ok()) return st;
  absl::StatusOr<std::unique_ptr<Server>> s = Start(std::move(options));
  if (!s.ok()) return s.status();
  if (absl::Status st = (*s)->AttachEngine(std::move(engine)); !st.ok()) return st;
  return s;
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  if (options.max_batch < 1) return absl::InvalidArgumentError("max_batch: must be >= 1");
  if (options.max_queue < 1) return absl::InvalidArgumentError("max_queue: must be >= 1");
  if (options.max_sessions < 1) return absl::InvalidArgumentError("max_sessions: must be >= 1");
  if (options.max_message_bytes < 1024) {
    return absl::InvalidArgumentError("max_message_bytes: must be >= 1024");
  }
  if (options.max_concurrent_streams < 1) {
    return absl::InvalidArgumentError("max_concurrent_streams: must be >= 1");
  }
  if (options.prefill_chunk < 1) return absl::InvalidArgumentError("prefill_chunk: must be >= 1");
  if (options.max_call_deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("max_call_deadline: must be > 0");
  }
  if (options.max_metadata_bytes < 1024 ||
      options.max_metadata_hard_bytes < options.max_metadata_bytes) {
    return absl::InvalidArgumentError(
        "max_metadata_bytes: must be >= 1024 and <= max_metadata_hard_bytes");
  }
  if (options.failure_linger < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("failure_linger: must be >= 0");
  }
  absl::StatusOr<Security> security = BuildSecurity(options.security);
  if (!security.ok()) return security.status();

  std::unique_ptr<Server> s(new Server());
  s->options_ = options;
  s->security_ = *std::move(security);
  s->gate_ = std::make_unique<GateService>(options.max_metadata_bytes);
  s->startup_metrics_ = std::make_unique<StartupMetrics>(options.served_model_name);

  if (!options.metrics_listen.empty()) {
    try {
      s->exposer_ = std::make_unique<prometheus::Exposer>(options.metrics_listen, 2);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("metrics_listen: cannot listen on ", options.metrics_listen));
    }
    s->exposer_->RegisterCollectable(s->startup_metrics_->registry());
    auto ports = s->exposer_->GetListeningPorts();
    s->metrics_port_ = ports.empty() ? 0 : ports[0];
  }

  // Before anything can fail the engine (OnEngineFailure reads health_).
  if (!options.health_listen.empty()) {
    auto health = HealthServer::Start(options.health_listen);
    if (!health.ok()) return health.status();
    s->health_ = *std::move(health);
  }

  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  builder.AddListeningPort(options.listen, s->security_.credentials, &s->port_);
  // A second verifyd on the same port must fail, not silently share it (gRPC enables
  // SO_REUSEPORT by default on Linux).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, options.max_metadata_hard_bytes);
  grpc::ResourceQuota quota("verifyd");
  quota.SetMaxThreads(options.max_threads);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.min_client_ping_interval)));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.RegisterService(s->gate_.get());
  s->grpc_server_ = builder.BuildAndStart();
  if (!s->grpc_server_ || s->port_ == 0) {
    s->grpc_server_.reset();
    return absl::UnavailableError(absl::StrCat("listen: cannot listen on ", options.listen));
  }
  {
    absl::MutexLock lock(&s->health_mu_);
    s->UpdateHealth();  // NOT_SERVING until an engine is attached
  }
  spdlog::info(
      "listening (not serving until the model is loaded) listen={} port={} metrics_port={} "
      "health_port={} security={}",
      options.listen, s->port_, s->metrics_port_, s->health_port(), s->security_.Describe());
  return s;
}

absl::Status Server::AttachEngine(std::unique_ptr<tp::Engine> engine) {
  VERIFYD_RETURN_IF_ERROR(ValidateEngine(engine.get()));
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return absl::FailedPreconditionError("AttachEngine: the server is shut down");
    if (engine_) return absl::FailedPreconditionError("AttachEngine: an engine is attached");
    engine_ = std::move(engine);
  }
  const ServerOptions& options = options_;
  tp::Engine* eng = engine_.get();
  const tp::EngineLimits elimits = eng->limits();

  ApiLimits limits;
  limits.vocab_size = eng->config().vocab_size;
  limits.max_draft_nodes = elimits.max_tail_rows - 1;
  limits.max_context = elimits.max_context;
  limits.max_batch = std::min(options.max_batch, elimits.max_batch);
  limits.num_hidden_layers = eng->config().num_hidden_layers;
  limits.hidden_size = eng->config().hidden_size;
  limits.max_response_bytes = options.max_message_bytes;

  metrics_ = std::make_unique<Metrics>(eng->tp_size(), options.version, eng->backend(),
                                       options.served_model_name);
  slots_ = std::make_unique<SlotAllocator>(eng->kv_slots());
  sessions_ =
      std::make_unique<SessionManager>(slots_.get(), options.max_sessions, options.session_ttl);
  // The session and KV gauges change exactly where the state changes.
  Metrics* metrics = metrics_.get();
  slots_->SetObserver([metrics](int64_t used, int64_t total) { metrics->SetKvSlots(used, total); });
  sessions_->SetObserver([metrics](int active) { metrics->SetActiveSessions(active); });
  SchedulerOptions sched;
  sched.max_batch = limits.max_batch;
  sched.max_queue = options.max_queue;
  // The engine's per-request row limit is the hard cap.
  sched.prefill_chunk = std::min(options.prefill_chunk, elimits.max_tail_rows);
  scheduler_ = std::make_unique<Scheduler>(eng, sessions_.get(), slots_.get(), metrics_.get(),
                                           sched, [this] { OnEngineFailure(); });
  service_ = std::make_unique<VerifyServiceImpl>(eng, sessions_.get(), slots_.get(),
                                                 scheduler_.get(), metrics_.get(), limits,
                                                 options.max_sessions, options.version);
  service_->SetCallPolicy(&security_, options.max_call_deadline);
  if (exposer_) exposer_->RegisterCollectable(metrics_->registry());
  scheduler_->Start();
  housekeeping_ = std::thread([this] { Housekeeping(); });
  attached_.store(true, std::memory_order_release);
  gate_->Attach(service_.get());
  startup_metrics_->SetLoaded(true);
  {
    absl::MutexLock lock(&health_mu_);
    UpdateHealth();
  }
  spdlog::info(
      "serving listen={} port={} metrics_port={} health_port={} security={} model={} "
      "backend={} tp={} kv_slots={} max_batch={} max_draft_nodes={} max_context={} "
      "prefill_chunk={}",
      options.listen, port_, metrics_port_, health_port(), security_.Describe(), eng->config().name,
      eng->backend(), eng->tp_size(), eng->kv_slots(), limits.max_batch, limits.max_draft_nodes,
      limits.max_context, sched.prefill_chunk);
  return absl::OkStatus();
}

Server::~Server() { Shutdown(absl::ZeroDuration()); }

void Server::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (!grpc_server_) return;  // Start failed part-way
  const bool attached = engine_attached();
  if (failed_.load()) {
    // New calls keep getting UNAVAILABLE from the gate (not CANCELLED from gRPC's shutdown).
    spdlog::info("engine failed: answering UNAVAILABLE for {} ms before stopping",
                 absl::ToInt64Milliseconds(options_.failure_linger));
    absl::SleepFor(options_.failure_linger);
  }
  spdlog::info("draining: health NOT_SERVING, waiting for in-flight requests");
  {
    absl::MutexLock lock(&health_mu_);
    stopping_ = true;
    UpdateHealth();
  }
  // Waits for in-flight calls until the deadline, then cancels the rest. The scheduler is
  // still running, so every handler waiting for its own step gets its result.
  grpc_server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace));
  if (attached) {
    scheduler_->Stop();
    stop_housekeeping_.Notify();
    if (housekeeping_.joinable()) housekeeping_.join();
  }
  grpc_server_->Wait();
  exposer_.reset();  // civetweb's stop takes up to ~2 s (its poll interval)
  if (health_) health_->Shutdown();
  if (attached) {
    spdlog::info("stopped: sessions={} kv_slots_used={}", sessions_->active(), slots_->used());
  } else {
    spdlog::info("stopped before the model was loaded");
  }
}

void Server::UpdateHealth() {
  const bool serving = engine_attached() && !failed_.load() && !stalled_ && !stopping_;
  serving_ = serving;
  if (grpc_server_) grpc_server_->GetHealthCheckService()->SetServingStatus(serving);
  if (health_) health_->SetServing(serving);
}

void Server::SetStalled(bool stalled) {
  absl::MutexLock lock(&health_mu_);
  if (stalled_ == stalled) return;
  stalled_ = stalled;
  spdlog::warn(stalled ? "engine stalled: health NOT_SERVING until its step finishes"
                       : "engine progressing again: health follows the server's state");
  UpdateHealth();
}

bool Server::serving() const {
  absl::MutexLock lock(&health_mu_);
  return serving_;
}

int Server::health_port() const { return health_ ? health_->port() : 0; }

bool Server::engine_failed() const { return engine_attached() && scheduler_->engine_failed(); }
bool Server::engine_progressing(absl::Duration stall_limit) const {
  if (!engine_attached()) return true;  // loading is not a stall
  return !scheduler_->engine_failed() && !engine_->failed() &&
         scheduler_->current_step_age() <= stall_limit;
}
int64_t Server::kv_slots_used() const { return engine_attached() ? slots_->used() : 0; }
int64_t Server::kv_slots() const { return engine_attached() ? slots_->kv_slots() : 0; }
int64_t Server::kv_slots_shared() const { return engine_attached() ? slots_->shared() : 0; }
int Server::active_sessions() const { return engine_attached() ? sessions_->active() : 0; }
int Server::queue_depth() const { return engine_attached() ? scheduler_->queue_depth() : 0; }

void Server::OnEngineFailure() {
  spdlog::critical("engine failed: health NOT_SERVING, answering UNAVAILABLE");
  failed_.store(true);
  gate_->Refuse(
      "engine failed: this verifyd is stopping and serves no more calls; its sessions are "
      "lost: reopen them on another replica");
  {
    absl::MutexLock lock(&health_mu_);
    UpdateHealth();
  }
  if (options_.on_engine_failure) options_.on_engine_failure();
}

void Server::Housekeeping() {
  for (;;) {
    const absl::Time now = absl::Now();
    const int expired = sessions_->ExpireIdle(now);
    if (expired > 0) spdlog::info("expired {} idle sessions", expired);
    metrics_->UpdateTokensPerSecond(now);
    if (stop_housekeeping_.WaitForNotificationWithTimeout(options_.housekeeping_period)) return;
  }
}

}  // namespace verifyd::server
