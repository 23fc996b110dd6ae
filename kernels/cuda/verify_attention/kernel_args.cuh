// The device-side arguments every verify attention kernel variant takes (filled by the
// launcher in launch.cu from VerifyAttentionParams and the workspace), and the helper that
// sets a kernel's opt-in shared memory once per device and launches it.
// Internal CUDA header. Thread-safety: plain data; LaunchOnce is reentrant.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/verify_attention/api.h"

namespace verifyd::kernels::cuda::detail {

struct VerifyKernelArgs {
  const __nv_bfloat16* q;      // [total_rows, heads, 576]
  const __nv_bfloat16* kv;     // [kv_slots, 576]; FP8 variants: [kv_slots, 656] bytes
  const int32_t* kv_indices;   // [kv_indptr[batch]]
  const int32_t* pos_indices;  // positional plans' index lists (work items with kv_off < 0)
  const uint64_t* tree_mask;   // [total_rows, mask_words]
  int mask_words;
  int num_heads;
  float scale_log2;            // softmax_scale * log2(e)
  __nv_bfloat16* out;          // [total_rows, heads, 512]
  float* lse;                  // [total_rows, heads] natural log, or null
  float* part_o;               // [partial rows, 512] fp32, normalised by the split's sum
  float* part_lse;             // [partial rows] log2 of the split's sum (incl. its max)
  const VerifyWorkItem* work;  // [gridDim.x]
};

// The slot list of a work item's request, indexed by request-local key (the item's keys are
// entries kv_begin .. kv_end - 1): the request's slice of kv_indices, or for kv_off < 0 a
// positional plan's index list in the workspace (api.h, VerifyWorkItem).
__device__ __forceinline__ const int32_t* WorkItemKeys(const VerifyKernelArgs& args,
                                                       const VerifyWorkItem& wi) {
  return wi.kv_off >= 0 ? args.kv_indices + wi.kv_off : args.pos_indices + (-wi.kv_off - 1);
}

// Sets `kernel`'s opt-in dynamic shared memory to `smem_bytes` once per device (`configured`:
// a function-local static of the caller; a host call per launch would add latency to every
// layer), after `check` (a callable returning cudaError_t) passed, then launches it with
// `grid` CTAs of `threads` on `stream`. Returns the launch status.
template <class Check>
absl::Status LaunchWithSmem(void (*kernel)(VerifyKernelArgs), std::atomic<uint64_t>& configured,
                            Check&& check, const VerifyKernelArgs& args, int grid, int threads,
                            size_t smem_bytes, void* stream) {
  VERIFYD_CUDA_RETURN_IF_ERROR(ConfigureOncePerDevice(configured, [&]() -> cudaError_t {
    const cudaError_t e = check();
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(smem_bytes));
  }));
  kernel<<<grid, threads, smem_bytes, static_cast<cudaStream_t>(stream)>>>(args);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR(kernel);
  return absl::OkStatus();
}

// LaunchWithSmem for a kernel whose body exists only in the sm_90a build (the other builds
// get an empty stub): an image without the body (e.g. one built for plain sm_90) would run the
// stub and leave the output unwritten, so the launch returns cudaErrorInvalidDeviceFunction
// instead. The register count tells: every body needs far more than the stub's.
inline absl::Status LaunchSm90aBody(void (*kernel)(VerifyKernelArgs),
                                    std::atomic<uint64_t>& configured, const VerifyKernelArgs& args,
                                    int grid, int threads, size_t smem_bytes, void* stream) {
  auto has_body = [kernel]() -> cudaError_t {
    cudaFuncAttributes attr{};
    const cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
    if (e != cudaSuccess) return e;
    return attr.numRegs < 64 ? cudaErrorInvalidDeviceFunction : cudaSuccess;
  };
  return LaunchWithSmem(kernel, configured, has_body, args, grid, threads, smem_bytes, stream);
}

}  // namespace verifyd::kernels::cuda::detail
