// A simple, correct verify attention for the shapes the optimised kernel
// (kernels/cuda/verify_attention/api.h) does not support: it needs qk_dim 576 / v_dim 512,
// while e.g. the `tiny` preset has 80 / 64. The CUDA engine (tp/cuda) uses it then.
//
// Semantics as kernels/verify_attention.h (bf16 query, latent cache and output; no lse): row
// r of request b attends to the request's context slots and to the tail rows its tree-mask
// row marks. One CTA per (row, head); warps stride over the row's visible keys in position
// order with an online softmax, fp32 math, merged across warps in a fixed order at the end:
// a row's result depends on its query and visible keys alone (batch-invariant; a tree node
// equals its token decoded as a chain). A row that sees no key writes zeros.
//
// Host header (no CUDA code). Thread-safety: the launcher is reentrant.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace verifyd::kernels::cuda {

// Device pointers, bf16 data. Limits: qk_dim <= 1024, v_dim <= min(512, qk_dim).
struct FallbackAttentionParams {
  int batch = 0;       // requests
  int total_rows = 0;  // q_indptr[batch]
  int num_heads = 0;   // heads on this rank
  int qk_dim = 0;      // latent width (kv_lora + rope)
  int v_dim = 0;       // value width (the first v_dim latent columns)
  float softmax_scale = 1.0f;

  const void* q = nullptr;   // [total_rows, num_heads, qk_dim] bf16
  const void* kv = nullptr;  // [slots, qk_dim] bf16: one layer's latent cache
  // kv holds rows of the FP8 format instead (kernels/kv_fp8.h with kv_lora = v_dim, rope =
  // qk_dim - v_dim; v_dim % 4 == 0): keys and values are float(e4m3) * scale, float(bf16).
  bool kv_fp8 = false;

  const int32_t* q_indptr = nullptr;    // [batch + 1]
  const int32_t* kv_indptr = nullptr;   // [batch + 1]; context then tail rows per request
  const int32_t* kv_indices = nullptr;  // [kv_indptr[batch]] slot ids
  const uint64_t* tree_mask = nullptr;  // [total_rows, mask_words]: ancestors + self
  int mask_words = 2;                   // 64-bit words per mask row

  void* out = nullptr;     // [total_rows, num_heads, v_dim] bf16
  void* stream = nullptr;  // cudaStream_t
};

// Enqueues the attention on p.stream. Unimplemented for dimensions over the limits,
// InvalidArgument for negative sizes; OK without a launch when there are no rows.
absl::Status FallbackAttentionCuda(const FallbackAttentionParams& p);

}  // namespace verifyd::kernels::cuda
