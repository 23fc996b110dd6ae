// The module side: compiled only into libverifyd_cuda_engine.so (server/CMakeLists.txt).
#include "server/cuda_engine_module.h"

#include "tp/cuda_engine.h"

#define VERIFYD_EXPORT __attribute__((visibility("default")))

extern "C" {

VERIFYD_EXPORT int verifyd_cuda_engine_module_abi() {
  return verifyd::server::kCudaEngineModuleAbi;
}

VERIFYD_EXPORT bool verifyd_cuda_devices_available() {
  return verifyd::tp::CudaDevicesAvailable();
}

VERIFYD_EXPORT void verifyd_create_cuda_engine(
    const verifyd::server::CudaModuleSpec* spec,
    absl::StatusOr<std::unique_ptr<verifyd::tp::Engine>>* out) {
  verifyd::tp::CudaEngineOptions o;
  o.model = spec->model;
  o.seed = spec->seed;
  o.tp = spec->tp;
  o.kv_capacity = spec->kv_slots;
  o.max_batch = spec->max_batch;
  *out = verifyd::tp::CreateCudaEngine(o);
}

}  // extern "C"
