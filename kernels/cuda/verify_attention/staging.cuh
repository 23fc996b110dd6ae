// The staging step of the kS64Staged configuration (api.h): the keys of a batch's slot lists,
// stored in the FP8 latent format (kernels/kv_fp8.h, 656 bytes a key), dequantized once into
// bf16 rows of the workspace (1,152 bytes a key: bf16(e4m3 x scale), one rounding; the rope
// copied), with an identity slot list, so that the bf16 seesaw kernel reads them as a bf16
// cache. Internal CUDA header. Thread-safety: reentrant.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace verifyd::kernels::cuda::detail {

struct StageFp8Args {
  const uint8_t* kv;          // the FP8 pool: kv_slots rows of 656 bytes
  const int32_t* kv_indices;  // [num_keys] the batch's slot lists (kv_indptr order)
  int64_t num_keys;           // kv_indptr[batch]
  uint16_t* rows;             // [num_keys][576] bf16 (workspace)
  int32_t* identity;          // [num_keys]: identity[j] = j (workspace)
};

// Enqueues the staging of num_keys keys on `stream` (nothing when it is 0).
absl::Status LaunchStageFp8Rows(const StageFp8Args& args, void* stream);

}  // namespace verifyd::kernels::cuda::detail
