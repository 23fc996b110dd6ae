// verifyd's server: gRPC VerifyService + grpc.health.v1.Health (+ reflection on request),
// the session table and KV slot allocator, the scheduler's engine thread, a housekeeping
// thread (session TTL expiry, the tokens/s window) and the Prometheus pull exposer. The
// session and KV gauges are set where the state changes, so they are exact at any scrape.
//
// Lifecycle, in two phases so that a model load of minutes does not leave the ports closed:
//   Start()         the gRPC API port (grpc.health.v1 NOT_SERVING; every VerifyService call
//                   UNAVAILABLE "model loading ..."), the health port (NOT_SERVING) and the
//                   metrics port (the startup gauges of server/startup_metrics.h) listen;
//   AttachEngine()  sessions, scheduler and metrics are built around the loaded engine, calls
//                   are forwarded to it, health turns SERVING;
//   Shutdown()      health NOT_SERVING, gRPC stops accepting calls and waits up to `grace` for
//                   in-flight ones, the scheduler drains, threads join.
// BuildAndStart() is Start() then AttachEngine(). An engine failure sets health NOT_SERVING,
// answers every call UNAVAILABLE from then on (new calls included: for
// ServerOptions::failure_linger after Shutdown() begins, before gRPC stops) and calls
// ServerOptions::on_engine_failure (verifyd's main then exits non-zero). SetStalled(true)
// (a step running too long, judged by the caller) turns health NOT_SERVING until
// SetStalled(false); calls are still served.
//
// Thread-safety: AttachEngine() once, from any thread; Shutdown() from any thread, once; the
// accessors and SetStalled() are safe from any thread (before AttachEngine the engine
// accessors answer as for an empty server: not failed, progressing, 0 slots and sessions).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/security.h"
#include "tp/engine.h"

namespace grpc {
class Server;
}
namespace prometheus {
class Exposer;
}

namespace verifyd::server {

class GateService;
class Metrics;
class Scheduler;
class StartupMetrics;
class SessionManager;
class SlotAllocator;
class VerifyServiceImpl;

struct ServerOptions {
  std::string listen = "0.0.0.0:50051";         // gRPC address; port 0 picks a free port
  std::string metrics_listen = "0.0.0.0:9400";  // Prometheus /metrics; "" disables; port 0 ok
  int max_batch = 64;       // requests per engine step (capped by the engine's limit)
  int max_queue = 1024;     // jobs waiting for the engine; more -> RESOURCE_EXHAUSTED
  int max_sessions = 4096;  // open sessions; more -> RESOURCE_EXHAUSTED
  // Prompt rows per prefill step (capped by the engine's per-request row limit): a longer
  // prompt is prefilled over several engine steps, interleaved with other sessions' rounds.
  int prefill_chunk = 32;
  absl::Duration session_ttl = absl::Minutes(10);         // idle expiry; <= 0 disables
  absl::Duration housekeeping_period = absl::Seconds(1);  // TTL sweep, tokens/s refresh
  bool reflection = false;                                // gRPC server reflection
  int max_message_bytes = 16 << 20;  // larger requests are rejected (RESOURCE_EXHAUSTED)
  // Security (server/security.h): TLS, mutual TLS, bearer tokens; default plaintext. With
  // identities (mTLS or tokens) sessions are bound to the client that opened them.
  SecurityOptions security;
  std::string health_listen;  // extra plaintext grpc.health.v1 port without auth; "" = none
  // Calls without a deadline (and each VerifyStream message) get this one; an earlier client
  // deadline wins. A call past it leaves the queue (DEADLINE_EXCEEDED) and frees its slots.
  absl::Duration max_call_deadline = absl::Seconds(120);
  // HTTP/2 streams per connection (bounds one client's concurrency and the cost of a
  // rapid-reset flood; see docs/RELIABILITY.md).
  int max_concurrent_streams = 128;
  // Metadata (header block) limits of a call. gRPC 1.51 treats a header block over its own
  // limit (GRPC_ARG_MAX_METADATA_SIZE) as a connection error: every call on that connection
  // fails. So gRPC's limit is set to max_metadata_hard_bytes, and a call whose metadata is
  // over max_metadata_bytes (key + value + 32 bytes an entry, as HPACK counts) is answered
  // RESOURCE_EXHAUSTED by itself, the connection's other calls unaffected; only a header block
  // over the hard limit still costs the connection (docs/RELIABILITY.md).
  int max_metadata_bytes = 16 << 10;
  int max_metadata_hard_bytes = 1 << 20;
  // Threads the gRPC sync server may create, all connections together (each call and each open
  // VerifyStream holds one while it runs): beyond it a new call gets RESOURCE_EXHAUSTED instead
  // of a thread (thousands of idle streams used to hold thousands of threads).
  int max_threads = 1024;
  // Keepalive: the server pings a connection idle for keepalive_time and drops it when no
  // answer comes within keepalive_timeout (dead clients); a client pinging more often than
  // min_client_ping_interval (without data) gets GOAWAY after 2 strikes.
  absl::Duration keepalive_time = absl::Minutes(2);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  absl::Duration min_client_ping_interval = absl::Seconds(10);
  std::string version = VERIFYD_VERSION;  // CMakeLists.txt project(VERSION)
  // The model_name label of every metric series (vLLM's label): verifyd's --served_model_name,
  // by default its --model value; "" leaves the series unlabelled (tests).
  std::string served_model_name;
  std::function<void()> on_engine_failure;  // runs once, on the engine thread
  // After an engine failure, Shutdown() keeps answering new calls UNAVAILABLE for this long
  // before gRPC stops accepting them (calls arriving during gRPC's own shutdown would be
  // CANCELLED instead): clients retrying on another replica see the documented code.
  absl::Duration failure_linger = absl::Seconds(1);
};

class Server {
 public:
  // Starts serving `engine` (the server owns it): Start() then AttachEngine(). Errors:
  // InvalidArgument for bad options or a null engine, Unavailable when an address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<Server>> BuildAndStart(ServerOptions options,
                                                               std::unique_ptr<tp::Engine> engine);
  // Phase 1: validates `options` and opens every listener, not serving yet (see above).
  // Errors: InvalidArgument for bad options, Unavailable when an address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(ServerOptions options);
  // Phase 2: serves `engine` (the server owns it); health turns SERVING. Errors:
  // InvalidArgument for a null engine or unusable engine limits, FailedPrecondition when an
  // engine is already attached or the server is shut down; the server then keeps answering
  // "model loading" until Shutdown().
  absl::Status AttachEngine(std::unique_ptr<tp::Engine> engine);
  // The model-load gauges on the metrics port (set by whoever loads the model).
  StartupMetrics* startup_metrics() const { return startup_metrics_.get(); }
  bool engine_attached() const { return attached_.load(std::memory_order_acquire); }
  // Health NOT_SERVING while `stalled` (an engine step running too long), SERVING again after.
  void SetStalled(bool stalled);
  bool serving() const;  // what health reports now
  ~Server();             // Shutdown(0) if still running

  void Shutdown(absl::Duration grace);

  int port() const { return port_; }                  // bound gRPC port
  int metrics_port() const { return metrics_port_; }  // bound metrics port, 0 if disabled
  int health_port() const;                            // bound health port, 0 if disabled
  bool engine_failed() const;
  // True while the engine works: not failed, and no step has been running longer than
  // `stall_limit` (feeds the systemd watchdog).
  bool engine_progressing(absl::Duration stall_limit) const;

  // Introspection (tests, logs).
  int64_t kv_slots_used() const;
  int64_t kv_slots() const;
  int64_t kv_slots_shared() const;  // slots held by more than one session (forks, prefixes)
  int active_sessions() const;
  int queue_depth() const;  // jobs waiting for the engine
  tp::Engine* engine() const { return engine_attached() ? engine_.get() : nullptr; }

 private:
  Server() = default;
  void Housekeeping();
  void OnEngineFailure();
  // Health on the API port and the health port from the state below.
  void UpdateHealth() ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_mu_);

  ServerOptions options_;
  std::unique_ptr<tp::Engine> engine_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<SlotAllocator> slots_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<VerifyServiceImpl> service_;
  std::unique_ptr<GateService> gate_;  // what gRPC serves: refuses, then forwards to service_
  std::unique_ptr<StartupMetrics> startup_metrics_;
  std::atomic<bool> attached_{false};
  std::atomic<bool> failed_{false};
  mutable absl::Mutex health_mu_;
  bool stalled_ ABSL_GUARDED_BY(health_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(health_mu_) = false;
  bool serving_ ABSL_GUARDED_BY(health_mu_) = false;
  Security security_;
  std::unique_ptr<HealthServer> health_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::thread housekeeping_;
  absl::Notification stop_housekeeping_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ = false;
  int port_ = 0;
  int metrics_port_ = 0;
};

}  // namespace verifyd::server
