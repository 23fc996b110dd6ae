// The module side: compiled only into libverifyd_cuda_engine.so (server/CMakeLists.txt).
#include "server/cuda_engine_module.h"

#include "tp/cuda/cuda_engine.h"

#define VERIFYD_EXPORT __attribute__((visibility("default")))

extern "C" {

VERIFYD_EXPORT int verifyd_cuda_engine_module_abi() {
  return verifyd::server::kCudaEngineModuleAbi;
}

VERIFYD_EXPORT bool verifyd_cuda_devices_available() { return verifyd::tp::CudaDevicesAvailable(); }

VERIFYD_EXPORT void verifyd_create_cuda_engine(
    const verifyd::tp::EngineOptions* options,
    absl::StatusOr<std::unique_ptr<verifyd::tp::Engine>>* out) {
  *out = verifyd::tp::CreateCudaEngine(*options);
}

}  // extern "C"
