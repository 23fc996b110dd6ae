// Gather ceiling measurement for verify_attention_bench (see gather_ceiling.cu): reads `rows`
// latent rows (1152 B each) of `pool` in the order of `idx` (device pointers) and returns
// the median rate in GB/s over `iters` timed runs. Thread-safety: uses the legacy stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace verifyd::bench {

cudaError_t MeasureGatherGBps(const void* pool, const int32_t* idx, int64_t rows, int num_sms,
                              int iters, double* gbps);

}  // namespace verifyd::bench
