// Device fills for moe_layer_bench (bench/moe_fill.cu): run on the current device's default
// stream; return the launch error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace verifyd::bench {

cudaError_t FillFp8(uint8_t* p, int64_t n, uint64_t seed);  // finite e4m3, |v| in [1/16, 4)
cudaError_t FillFloat(float* p, int64_t n, uint64_t seed, float lo, float hi);
cudaError_t FillBf16(uint16_t* p, int64_t n, uint64_t seed, float lo, float hi);

}  // namespace verifyd::bench
