// verifyd's server: gRPC VerifyService + grpc.health.v1.Health (+ reflection on request),
// the session table and KV slot allocator, the scheduler's engine thread, a housekeeping
// thread (session TTL expiry, the tokens/s window) and the Prometheus pull exposer. The
// session and KV gauges are set where the state changes, so they are exact at any scrape.
//
// Lifecycle: BuildAndStart() -> serving (health SERVING) -> Shutdown(): health NOT_SERVING,
// gRPC stops accepting calls and waits up to `grace` for in-flight ones, the scheduler
// drains, threads join. An engine failure sets health NOT_SERVING, answers UNAVAILABLE and
// calls ServerOptions::on_engine_failure (verifyd's main then exits non-zero).
//
// Thread-safety: Shutdown() and Wait() may be called from any thread, once each; the
// accessors are safe from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
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

class Metrics;
class Scheduler;
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
  std::string version = "0.1.0";
  std::function<void()> on_engine_failure;  // runs once, on the engine thread
};

class Server {
 public:
  // Starts serving `engine` (the server owns it). Errors: InvalidArgument for bad options,
  // Unavailable when an address cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> BuildAndStart(ServerOptions options,
                                                               std::unique_ptr<tp::Engine> engine);
  ~Server();  // Shutdown(0) if still running

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
  tp::Engine* engine() const { return engine_.get(); }

 private:
  Server() = default;
  void Housekeeping();
  void OnEngineFailure();
  void SetServing(bool serving);  // health on the API port and the health port

  ServerOptions options_;
  std::unique_ptr<tp::Engine> engine_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<SlotAllocator> slots_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<VerifyServiceImpl> service_;
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
