#include "server/startup_metrics.h"

#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace verifyd::server {
namespace {

prometheus::Gauge* AddGauge(prometheus::Registry& reg, const std::string& model_name,
                            const char* name, const char* help) {
  auto builder = prometheus::BuildGauge().Name(name).Help(help);
  if (!model_name.empty()) builder.Labels({{"model_name", model_name}});
  return &builder.Register(reg).Add({});
}

}  // namespace

StartupMetrics::StartupMetrics(const std::string& model_name)
    : registry_(std::make_shared<prometheus::Registry>()) {
  auto& reg = *registry_;
  bytes_ = AddGauge(reg, model_name, "verifyd_model_load_bytes",
                    "Bytes of the checkpoint's model tensors read so far by the model load");
  total_bytes_ = AddGauge(reg, model_name, "verifyd_model_load_total_bytes",
                          "Bytes of the checkpoint's model tensors (0 for a preset model)");
  seconds_ = AddGauge(reg, model_name, "verifyd_model_load_seconds",
                      "Seconds since the model load began; frozen at its duration once loaded");
  loaded_ = AddGauge(reg, model_name, "verifyd_model_loaded",
                     "1 once the model is loaded and verifyd serves, 0 while it loads");
}

void StartupMetrics::SetProgress(uint64_t bytes, uint64_t total_bytes, double seconds) {
  bytes_->Set(static_cast<double>(bytes));
  total_bytes_->Set(static_cast<double>(total_bytes));
  seconds_->Set(seconds);
}

void StartupMetrics::SetLoaded(bool loaded) { loaded_->Set(loaded ? 1.0 : 0.0); }

}  // namespace verifyd::server
