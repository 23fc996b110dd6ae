// The loader side of server/cuda_engine_module.h (linked into verifyd_server_lib).
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/cuda_engine_module.h"

namespace verifyd::server {
namespace {

std::string ExecutableDir() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

absl::StatusOr<const CudaEngineModule*> Load() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("VERIFYD_CUDA_ENGINE_MODULE"); env && *env) {
    candidates.push_back(env);
  } else {
    const std::string dir = ExecutableDir();
    candidates.push_back(absl::StrCat(dir, "/", kCudaEngineModuleFile));
    candidates.push_back(absl::StrCat(dir, "/../lib/verifyd/", kCudaEngineModuleFile));
  }
  std::string errors;
  for (const std::string& path : candidates) {
    if (::access(path.c_str(), F_OK) != 0) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", path, ": not found");
      continue;
    }
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", ::dlerror());
      continue;
    }
    auto abi = reinterpret_cast<int (*)()>(::dlsym(handle, "verifyd_cuda_engine_module_abi"));
    auto* module = new CudaEngineModule;  // lives as long as the process (never dlclosed)
    module->devices_available =
        reinterpret_cast<bool (*)()>(::dlsym(handle, "verifyd_cuda_devices_available"));
    module->create =
        reinterpret_cast<decltype(module->create)>(::dlsym(handle, "verifyd_create_cuda_engine"));
    if (abi == nullptr || module->devices_available == nullptr || module->create == nullptr ||
        abi() != kCudaEngineModuleAbi) {
      delete module;
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", path,
                      ": not a verifyd CUDA engine module of ABI ", kCudaEngineModuleAbi);
      continue;
    }
    return module;
  }
  return absl::UnavailableError(
      absl::StrCat("the CUDA engine module is not available (", errors, ")"));
}

}  // namespace

absl::StatusOr<const CudaEngineModule*> LoadCudaEngineModule() {
  static std::once_flag once;
  static absl::StatusOr<const CudaEngineModule*>* result = nullptr;
  std::call_once(once, [] { result = new absl::StatusOr<const CudaEngineModule*>(Load()); });
  return *result;
}

}  // namespace verifyd::server
