// StartupMetrics: the model-load gauges verifyd exports from the moment its /metrics listener
// is up, before the model is loaded (a registry of their own, so the exposer has something
// true to say while the engine does not exist yet):
//   verifyd_model_load_bytes        bytes of the checkpoint's model tensors read so far
//   verifyd_model_load_total_bytes  bytes of the checkpoint's model tensors (0: a preset)
//   verifyd_model_load_seconds      seconds since the load began (frozen once loaded)
//   verifyd_model_loaded            0 while loading, 1 once the engine serves
// Thread-safety: every method may be called from any thread (prometheus-cpp gauges are
// atomic).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace prometheus {
class Gauge;
class Registry;
}  // namespace prometheus

namespace verifyd::server {

class StartupMetrics {
 public:
  // model_name: the label of every series (ServerOptions::served_model_name); "" none.
  explicit StartupMetrics(const std::string& model_name = "");
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void SetProgress(uint64_t bytes, uint64_t total_bytes, double seconds);
  void SetLoaded(bool loaded);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge* bytes_;
  prometheus::Gauge* total_bytes_;
  prometheus::Gauge* seconds_;
  prometheus::Gauge* loaded_;
};

}  // namespace verifyd::server
