// GPU greedy tree acceptance + KV commit (see tree_accept_cuda.h).
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tree_accept_cuda.h"
#include "kernels/verify_attention.h"

namespace verifyd::kernels::cuda {
namespace {

struct TreeAcceptArgs {
  int batch;
  const int32_t* row_indptr;
  const int32_t* tokens;
  const int32_t* parents;
  const int32_t* predictions;
  const int32_t* tail_slots;
  int32_t* accepted;
  int32_t* num_accepted;
  int32_t* bonus;
  int32_t* kept_slots;
  int32_t* freed_slots;
};

// One thread per request. Marks accepted rows in a per-thread bitmap (<= 128 rows).
__global__ void TreeAcceptKernel(const TreeAcceptArgs a) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= a.batch) return;
  const int r0 = a.row_indptr[b];
  const int n = a.row_indptr[b + 1] - r0;
  if (n <= 0) {
    a.num_accepted[b] = 0;
    a.bonus[b] = -1;
    return;
  }
  uint32_t on_path[kMaxTailRows / 32] = {};
  int cur = 0;
  int count = 0;
  for (;;) {
    const int want = a.predictions[r0 + cur];
    int next = -1;
    for (int t = cur + 1; t < n; ++t) {
      if (a.parents[r0 + t] == cur && a.tokens[r0 + t] == want) {
        next = t;
        break;
      }
    }
    if (next < 0) break;
    a.accepted[r0 + count] = next;
    ++count;
    on_path[next >> 5] |= 1u << (next & 31);
    cur = next;
  }
  a.num_accepted[b] = count;
  a.bonus[b] = a.predictions[r0 + cur];
  if (a.tail_slots == nullptr) return;
  a.kept_slots[r0] = a.tail_slots[r0];
  for (int i = 0; i < count; ++i) a.kept_slots[r0 + 1 + i] = a.tail_slots[r0 + a.accepted[r0 + i]];
  int f = 0;
  for (int t = 1; t < n; ++t) {
    if (!((on_path[t >> 5] >> (t & 31)) & 1u)) a.freed_slots[r0 + f++] = a.tail_slots[r0 + t];
  }
}

}  // namespace

absl::Status TreeAcceptCuda(const TreeAcceptParams& p) {
  if (p.batch < 0) return absl::InvalidArgumentError("tree accept: batch < 0");
  if (p.batch == 0) return absl::OkStatus();
  if (p.row_indptr == nullptr) return absl::InvalidArgumentError("tree accept: row_indptr is null");
  if (p.tokens == nullptr) return absl::InvalidArgumentError("tree accept: tokens is null");
  if (p.parents == nullptr) return absl::InvalidArgumentError("tree accept: parents is null");
  if (p.predictions == nullptr)
    return absl::InvalidArgumentError("tree accept: predictions is null");
  if (p.accepted == nullptr) return absl::InvalidArgumentError("tree accept: accepted is null");
  if (p.num_accepted == nullptr)
    return absl::InvalidArgumentError("tree accept: num_accepted is null");
  if (p.bonus == nullptr) return absl::InvalidArgumentError("tree accept: bonus is null");
  if (p.tail_slots != nullptr && (p.kept_slots == nullptr || p.freed_slots == nullptr)) {
    return absl::InvalidArgumentError(
        "tree accept: kept_slots / freed_slots must be set when tail_slots is");
  }
  TreeAcceptArgs a{p.batch,    p.row_indptr,   p.tokens, p.parents,    p.predictions, p.tail_slots,
                   p.accepted, p.num_accepted, p.bonus,  p.kept_slots, p.freed_slots};
  const int threads = 128;
  const int blocks = (p.batch + threads - 1) / threads;
  TreeAcceptKernel<<<blocks, threads, 0, static_cast<cudaStream_t>(p.stream)>>>(a);
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
