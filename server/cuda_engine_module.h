// The CUDA engine as a loadable module (libverifyd_cuda_engine.so), and its loader.
//
// Why a module: cuBLASLt carries ~94 KB of static thread-local storage. When a binary links
// it directly, every thread's stack must hold that TLS, and civetweb (prometheus-cpp's HTTP
// server) starts its threads with 100 KB stacks, so the /metrics exposer cannot start at
// all. Loaded with dlopen, the CUDA libraries' TLS is allocated per thread on demand instead.
// It also keeps verifyd runnable on machines without the CUDA libraries (the CPU backend).
//
// The module exports C entry points (names below) that verifyd resolves with dlsym; both
// sides are built from this tree with the same compiler and the same shared Abseil, so C++
// types (absl::StatusOr, tp::Engine) cross the boundary. The module is never unloaded.
// Thread-safety: LoadCudaEngineModule may be called from any thread (loads once).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tp/engine.h"
#include "tp/engine_options.h"

namespace verifyd::server {

// Bumped whenever what crosses the boundary changes (2: the create call takes
// tp::EngineOptions; 3: EngineOptions::source, a tp::WeightSource verifyd opened: the module
// calls its virtual methods, which run verifyd's code; 4: EngineOptions::cuda grew
// shared_context_attention; 5: EngineOptions::kv_dtype, Engine::kv_cache_dtype).
inline constexpr int kCudaEngineModuleAbi = 5;
inline constexpr char kCudaEngineModuleFile[] = "libverifyd_cuda_engine.so";

struct CudaEngineModule {
  bool (*devices_available)() = nullptr;
  void (*create)(const tp::EngineOptions* options,
                 absl::StatusOr<std::unique_ptr<tp::Engine>>* out) = nullptr;
};

// Finds and loads the module: $VERIFYD_CUDA_ENGINE_MODULE if set, else next to the verifyd
// executable, else <exe dir>/../lib/verifyd/. Unavailable (with the reason) when absent.
absl::StatusOr<const CudaEngineModule*> LoadCudaEngineModule();

}  // namespace verifyd::server

// Entry points exported by the module (extern "C", resolved with dlsym).
extern "C" {
int verifyd_cuda_engine_module_abi();
bool verifyd_cuda_devices_available();
void verifyd_create_cuda_engine(const verifyd::tp::EngineOptions* options,
                                absl::StatusOr<std::unique_ptr<verifyd::tp::Engine>>* out);
}
