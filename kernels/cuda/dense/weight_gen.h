// On-device generation of the preset weights, bit-identical to the host generator
// kernels/weight_init.h (same counter-based hash, bf16 round-to-nearest-even): a rank generates
// its shard of a tensor directly in GPU memory, so presets with real dimensions (tens of GB)
// need no host copy.
//
// The shard is the block rows [row0, row0 + rows) x columns [col0, col0 + cols) of a
// row-major tensor with full_cols columns; element (r, c) of the shard is the full tensor's
// flat index (row0 + r) * full_cols + col0 + c. A 1-D tensor is rows = 1.
// Host header (no CUDA code). Thread-safety: the launcher is reentrant.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common.h"

namespace verifyd::kernels::cuda {

struct GenerateWeightsParams {
  uint64_t tensor_key = 0;  // kernels::WeightTensorKey(seed, kernels::WeightNameHash(name))
  float scale = 0.f;        // value = bf16(offset + scale * u), u in [-1, 1)
  float offset = 0.f;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t full_cols = 0;  // columns of the full tensor (>= col0 + cols)
  int64_t row0 = 0;
  int64_t col0 = 0;
  bf16_bits* out = nullptr;  // [rows, ld_out] bf16, device
  int64_t ld_out = 0;        // >= cols
  // > 0: an FP8-quantized tensor (kernels/weight_init.h WeightFp8Input): the value is
  // bf16(float(e4m3(u * 448)) * fp8_scale) (scale / offset unused), what an FP8 checkpoint's
  // block dequantizes to.
  float fp8_scale = 0.f;
  void* stream = nullptr;
};
absl::Status GenerateWeightsCuda(const GenerateWeightsParams& p);

// The same shard of an FP8-quantized tensor as stored: e4m3 codes e4m3(u * 448) into
// out [rows, ld_out] and the block scale `fp8_scale` into every entry of
// scales [ceil(rows / 128), scale_ld] (the first cols / 128 of each row; row0 and col0 must be
// multiples of 128, cols too). Bit-identical to the host's Fp8E4m3FromFloat(WeightFp8Input).
struct GenerateFp8WeightsParams {
  uint64_t tensor_key = 0;
  float fp8_scale = 0.f;  // kernels::WeightFp8Scale(spec.init_scale), > 0
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t full_cols = 0;
  int64_t row0 = 0;
  int64_t col0 = 0;
  uint8_t* out = nullptr;   // device
  int64_t ld_out = 0;       // >= cols
  float* scales = nullptr;  // device
  int64_t scale_ld = 0;     // >= cols / 128
  void* stream = nullptr;
};
absl::Status GenerateFp8WeightsCuda(const GenerateFp8WeightsParams& p);

}  // namespace verifyd::kernels::cuda
