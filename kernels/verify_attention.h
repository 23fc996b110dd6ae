// Verify attention: the absorbed-MLA attention of a batch of draft trees over a paged latent
// KV cache (page size 1), with a tree-visibility bitmask on each request's tail rows.
//
// One params struct, two implementations behind it:
//   - VerifyAttentionReference (kernels/reference/): plain C++, float32 accumulation, the
//     oracle for tests and the CPU backend's op. Host pointers.
//   - the CUDA launchers (kernels/cuda/verify_attention/api.h): device pointers, a split
//     plan computed once per batch.
//
// Semantics (both implementations). For request b:
//   rows      r in [q_indptr[b], q_indptr[b+1]); n_b = number of rows ("tail rows")
//   slots     kv_indices[kv_indptr[b] .. kv_indptr[b+1]); L_b = their count, L_b >= n_b.
//             The first P_b = L_b - n_b slots hold the committed context (positions
//             0..P_b-1, in order); the last n_b slots hold the latent rows of the request's
//             own tail rows (tail row t in slot kv_indices[kv_indptr[b] + P_b + t]). The
//             caller writes the tail rows' latent KV before calling.
//   visible   row r = q_indptr[b] + t sees every context slot, and tail row j iff bit j of
//             tree_mask[r * mask_words + j / 64] is set (bit j%64). A row normally sees its
//             ancestors and itself.
//   score     s = softmax_scale * dot(q[r, h, 0:qk_dim], kv[slot, 0:qk_dim])
//   out[r,h]  = sum_j softmax(s)_j * kv[slot_j, 0:v_dim]   (V = first v_dim columns)
//   lse[r,h]  = log(sum_j exp(s_j)) (natural log) when lse != nullptr.
//   A row that sees no key gets out = 0 and lse = -inf.
// Keys are visited in slot-list order (context first, then tail rows in index order), so a
// row's result does not depend on which other rows or requests share the batch.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common.h"

namespace verifyd::kernels {

// Upper bound on tail rows per request (64 draft nodes + the pending token, or a 64-token
// prefill chunk): mask_words <= 2.
inline constexpr int kMaxTailRows = 128;

struct VerifyAttentionParams {
  int batch = 0;       // requests
  int total_rows = 0;  // q_indptr[batch]
  int num_heads = 0;   // heads on this rank
  int qk_dim = 576;    // latent width: kv_lora_rank + qk_rope_head_dim
  int v_dim = 512;     // value width: kv_lora_rank (the first v_dim latent columns)
  float softmax_scale = 1.0f;
  DType dtype = DType::kBFloat16;  // of q and out, and of kv unless kv_fp8
  // The latent cache holds rows of the FP8 format (kernels/kv_fp8.h: kv_lora = v_dim, rope =
  // qk_dim - v_dim, KvFp8RowBytes bytes a row) instead of dtype rows. Keys and values are the
  // dequantized rows.
  bool kv_fp8 = false;

  const void* q = nullptr;   // [total_rows, num_heads, qk_dim], contiguous
  const void* kv = nullptr;  // [kv_slots, qk_dim] (or [kv_slots, row bytes] when kv_fp8)
  int64_t kv_slots = 0;      // rows in the cache; every slot index must be < kv_slots

  const int32_t* q_indptr = nullptr;    // [batch + 1]
  const int32_t* kv_indptr = nullptr;   // [batch + 1]
  const int32_t* kv_indices = nullptr;  // [kv_indptr[batch]] slot ids
  const uint64_t* tree_mask = nullptr;  // [total_rows, mask_words]
  int mask_words = 2;                   // 64-bit words per mask row

  void* out = nullptr;   // [total_rows, num_heads, v_dim]
  float* lse = nullptr;  // optional [total_rows, num_heads], natural log

  void* stream = nullptr;  // cudaStream_t for the CUDA path; ignored by the reference
};

// Checks the scalar fields (shapes, dtype, pointers non-null). Index arrays are checked by
// the reference (host memory) only; the CUDA path trusts the planner's host copy.
absl::Status ValidateVerifyAttentionParams(const VerifyAttentionParams& p);

// Plain C++ oracle; host pointers; float32 accumulation; dtype kFloat32 or kBFloat16.
// Checks every index (slot ranges, indptr monotonicity, L_b >= n_b) and returns
// InvalidArgument naming the field.
absl::Status VerifyAttentionReference(const VerifyAttentionParams& p);

}  // namespace verifyd::kernels
