// Plain C++ verify attention (see kernels/verify_attention.h): the oracle for the CUDA
// kernel and the CPU backend's attention op.
//
// Per (row r, head h), independently of every other row:
//   pass 1: for the visible keys in slot-list order (context slots, then the visible tail
//           rows in index order): s_j = softmax_scale * dot(q[r,h], kv[slot_j, 0:qk_dim])
//           with the blocked-8 dot order of dot.h; m = max s_j (NaN scores are not taken
//           as the max but still poison the sums below, so a NaN input shows in the output).
//   pass 2: e_j = exp(s_j - m); sum = sum_j e_j and acc[d] = sum_j e_j * kv[slot_j, d]
//           (d < v_dim), both in key order, float accumulators.
//   out[r,h,d] = acc[d] / sum (rounded to the output dtype); lse[r,h] = m + log(sum).
// A row that sees no key gets out = 0 and lse = -inf. Masked keys and slots not listed are
// never read. Work is split over (row, head) pairs only, so threads never change a result.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common.h"
#include "kernels/kv_fp8.h"
#include "kernels/reference/dot.h"
#include "kernels/reference/parallel.h"
#include "kernels/verify_attention.h"

namespace verifyd::kernels {
namespace {

using ref::internal::BlockedDot;
using ref::internal::LoadAsFloat;

// (row, head) pairs times keys below this run on the calling thread only.
constexpr int64_t kAttentionParallelWork = int64_t{1} << 16;

inline void StoreFromFloat(float* p, int64_t i, float v) { p[i] = v; }
inline void StoreFromFloat(bf16_bits* p, int64_t i, float v) { p[i] = FloatToBf16(v); }

// True when tail row `j` of the request is visible to the row whose mask starts at `mask`.
inline bool TailVisible(const uint64_t* mask, int j) { return (mask[j / 64] >> (j % 64)) & 1u; }

// Index checks of the host arrays (the scalar fields were validated already).
absl::Status ValidateIndices(const VerifyAttentionParams& p) {
  const int max_rows = std::min(kMaxTailRows, 64 * p.mask_words);
  if (p.q_indptr[0] != 0) {
    return absl::InvalidArgumentError(absl::StrCat("q_indptr[0] must be 0, got ", p.q_indptr[0]));
  }
  if (p.kv_indptr[0] != 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv_indptr[0] must be 0, got ", p.kv_indptr[0]));
  }
  for (int b = 0; b < p.batch; ++b) {
    const int64_t n = int64_t{p.q_indptr[b + 1]} - p.q_indptr[b];
    const int64_t len = int64_t{p.kv_indptr[b + 1]} - p.kv_indptr[b];
    if (n < 0) {
      return absl::InvalidArgumentError(absl::StrCat("q_indptr must be non-decreasing: q_indptr[",
                                                     b + 1, "] = ", p.q_indptr[b + 1],
                                                     " < q_indptr[", b, "] = ", p.q_indptr[b]));
    }
    if (n > max_rows) {
      return absl::InvalidArgumentError(absl::StrCat("q_indptr: request ", b, " has ", n,
                                                     " rows, more than ", max_rows,
                                                     " (kMaxTailRows and 64 * mask_words)"));
    }
    if (len < 0) {
      return absl::InvalidArgumentError(absl::StrCat("kv_indptr must be non-decreasing: kv_indptr[",
                                                     b + 1, "] = ", p.kv_indptr[b + 1],
                                                     " < kv_indptr[", b, "] = ", p.kv_indptr[b]));
    }
    if (len < n) {
      return absl::InvalidArgumentError(absl::StrCat("kv_indptr: request ", b, " lists ", len,
                                                     " slots but has ", n,
                                                     " rows; every tail row needs its own slot"));
    }
  }
  if (p.q_indptr[p.batch] != p.total_rows) {
    return absl::InvalidArgumentError(absl::StrCat("q_indptr[batch] = ", p.q_indptr[p.batch],
                                                   " must equal total_rows = ", p.total_rows));
  }
  const int32_t total_slots = p.kv_indptr[p.batch];
  for (int32_t i = 0; i < total_slots; ++i) {
    const int32_t s = p.kv_indices[i];
    if (s < 0 || s >= p.kv_slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_indices[", i, "] = ", s, " is outside [0, kv_slots = ", p.kv_slots, ")"));
    }
  }
  return absl::OkStatus();
}

// Attention for the (row, head) pairs [pair0, pair1) of request-independent flat index
// pair = r * num_heads + h. T is float or bf16_bits (q and out share it, and kv unless it is
// the FP8 format).
template <typename T>
void AttendPairs(const VerifyAttentionParams& p, const std::vector<int>& row_request, int64_t pair0,
                 int64_t pair1) {
  const T* q = static_cast<const T*>(p.q);
  const T* kv = static_cast<const T*>(p.kv);
  T* out = static_cast<T*>(p.out);
  const int H = p.num_heads, D = p.qk_dim, V = p.v_dim;
  std::vector<float> qf(static_cast<size_t>(D));
  std::vector<float> acc(static_cast<size_t>(V));
  std::vector<float> scores;       // s_j of the visible keys, key order
  std::vector<int32_t> key_slots;  // their cache slots, same order
  // FP8 latent cache (kernels/kv_fp8.h): a key is dequantized into `key` (float) when read.
  const auto* kv8 = static_cast<const uint8_t*>(p.kv);
  const int64_t row_bytes = KvFp8RowBytes(V, D - V, kKvFp8Group);
  std::vector<float> key(p.kv_fp8 ? static_cast<size_t>(D) : 0);

  for (int64_t pair = pair0; pair < pair1; ++pair) {
    const int64_t r = pair / H;
    const int64_t h = pair % H;
    const int b = row_request[static_cast<size_t>(r)];
    const int32_t row0 = p.q_indptr[b];
    const int32_t n = p.q_indptr[b + 1] - row0;
    const int32_t* slots = p.kv_indices + p.kv_indptr[b];
    const int32_t len = p.kv_indptr[b + 1] - p.kv_indptr[b];
    const int32_t ctx = len - n;  // committed context slots, all visible
    const uint64_t* mask = p.tree_mask + r * p.mask_words;

    const T* qrow = q + (r * H + h) * D;
    for (int d = 0; d < D; ++d) qf[d] = LoadAsFloat(qrow, d);

    // Pass 1: scores of the visible keys and their max.
    scores.clear();
    key_slots.clear();
    float m = -std::numeric_limits<float>::infinity();
    for (int32_t j = 0; j < len; ++j) {
      if (j >= ctx && !TailVisible(mask, j - ctx)) continue;  // masked: never read
      float dot = 0.f;
      if (p.kv_fp8) {
        KvFp8DecodeRow(kv8 + int64_t{slots[j]} * row_bytes, V, D - V, kKvFp8Group, key.data());
        dot = BlockedDot(qf.data(), key.data(), D);
      } else {
        dot = BlockedDot(qf.data(), kv + int64_t{slots[j]} * D, D);
      }
      const float s = p.softmax_scale * dot;
      if (s > m) m = s;
      scores.push_back(s);
      key_slots.push_back(slots[j]);
    }

    float* lse = p.lse ? p.lse + r * H + h : nullptr;
    T* orow = out + (r * H + h) * V;
    if (scores.empty()) {  // sees no key
      for (int d = 0; d < V; ++d) StoreFromFloat(orow, d, 0.f);
      if (lse) *lse = -std::numeric_limits<float>::infinity();
      continue;
    }

    // Pass 2: exponentials, their sum and the weighted values, in key order.
    float sum = 0.f;
    std::fill(acc.begin(), acc.end(), 0.f);
    for (size_t j = 0; j < scores.size(); ++j) {
      const float e = std::exp(scores[j] - m);
      sum += e;
      if (p.kv_fp8) {
        KvFp8DecodeRow(kv8 + int64_t{key_slots[j]} * row_bytes, V, D - V, kKvFp8Group, key.data());
        for (int d = 0; d < V; ++d) acc[d] += e * key[d];
      } else {
        const T* vrow = kv + int64_t{key_slots[j]} * D;
        for (int d = 0; d < V; ++d) acc[d] += e * LoadAsFloat(vrow, d);
      }
    }
    for (int d = 0; d < V; ++d) StoreFromFloat(orow, d, acc[d] / sum);
    if (lse) *lse = m + std::log(sum);
  }
}

}  // namespace

absl::Status ValidateVerifyAttentionParams(const VerifyAttentionParams& p) {
  if (p.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", p.batch));
  }
  if (p.total_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat("total_rows must be >= 0, got ", p.total_rows));
  }
  if (p.num_heads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads must be >= 1, got ", p.num_heads));
  }
  if (p.qk_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("qk_dim must be >= 1, got ", p.qk_dim));
  }
  if (p.v_dim < 1 || p.v_dim > p.qk_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("v_dim must be in [1, qk_dim = ", p.qk_dim, "], got ", p.v_dim));
  }
  if (!std::isfinite(p.softmax_scale)) {
    return absl::InvalidArgumentError("softmax_scale must be finite");
  }
  if (p.dtype != DType::kFloat32 && p.dtype != DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", static_cast<int>(p.dtype), " is not float32 or bfloat16"));
  }
  if (p.kv_slots < 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv_slots must be >= 0, got ", p.kv_slots));
  }
  if (p.kv_slots > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_slots = ", p.kv_slots, " exceeds the int32 slot-id range of kv_indices"));
  }
  if (p.mask_words < 1 || p.mask_words > kMaxTailRows / 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("mask_words must be in [1, ", kMaxTailRows / 64, "], got ", p.mask_words));
  }
  const std::pair<const void*, const char*> required[] = {
      {p.q, "q"},
      {p.kv, "kv"},
      {p.q_indptr, "q_indptr"},
      {p.kv_indptr, "kv_indptr"},
      {p.kv_indices, "kv_indices"},
      {p.tree_mask, "tree_mask"},
      {p.out, "out"},
  };
  for (const auto& [ptr, name] : required) {
    if (ptr == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, " is null"));
  }
  return absl::OkStatus();
}

absl::Status VerifyAttentionReference(const VerifyAttentionParams& p) {
  if (absl::Status s = ValidateVerifyAttentionParams(p); !s.ok()) return s;
  if (absl::Status s = ValidateIndices(p); !s.ok()) return s;

  // Request of each row, and the work size used to decide on threads.
  std::vector<int> row_request(static_cast<size_t>(p.total_rows));
  int64_t work = 0;
  for (int b = 0; b < p.batch; ++b) {
    for (int32_t r = p.q_indptr[b]; r < p.q_indptr[b + 1]; ++r) row_request[r] = b;
    work += int64_t{p.q_indptr[b + 1] - p.q_indptr[b]} * p.num_heads *
            (p.kv_indptr[b + 1] - p.kv_indptr[b]);
  }
  const int threads = work >= kAttentionParallelWork ? ref::internal::MaxOpThreads() : 1;
  const int64_t pairs = int64_t{p.total_rows} * p.num_heads;
  ref::internal::ParallelChunks(pairs, 1, threads, [&](int64_t a, int64_t e) {
    if (p.dtype == DType::kFloat32) {
      AttendPairs<float>(p, row_request, a, e);
    } else {
      AttendPairs<bf16_bits>(p, row_request, a, e);
    }
  });
  return absl::OkStatus();
}

}  // namespace verifyd::kernels
