// Sampled token selection and logprobs (see sampling.h and kernels/sampling.h). The kernel
// runs its phases as __forceinline__ functions, in order: RowMaxAndLive, then for a draw
// TopKMinKey, TopPMinKey and GumbelMaxToken, then for logprobs RowLogSumExp and
// WriteTopLogprobs.
#include <cuda_runtime.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sampling/sampling.h"
#include "kernels/sampling.h"

namespace verifyd::kernels::cuda {
namespace {

constexpr int kThreads = 512;

struct MaxF {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};

// Reduction over the block in a fixed tree order; every thread gets the result.
template <typename T, typename Op>
__device__ T BlockReduce(T v, T* s, Op op) {
  s[threadIdx.x] = v;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) s[threadIdx.x] = op(s[threadIdx.x], s[threadIdx.x + o]);
    __syncthreads();
  }
  const T r = s[0];
  __syncthreads();
  return r;
}

// (value, index) argmax over the block: larger value wins, the lower index on ties, index < 0
// is empty. Every thread gets the winner.
__device__ void BlockArgmax(double* v, int32_t* i, double* sv, int32_t* si) {
  sv[threadIdx.x] = *v;
  si[threadIdx.x] = *i;
  __syncthreads();
  for (int o = blockDim.x / 2; o > 0; o >>= 1) {
    if (threadIdx.x < o) {
      const double cv = sv[threadIdx.x + o];
      const int32_t ci = si[threadIdx.x + o];
      const int32_t bi = si[threadIdx.x];
      if (ci >= 0 && (bi < 0 || cv > sv[threadIdx.x] || (cv == sv[threadIdx.x] && ci < bi))) {
        sv[threadIdx.x] = cv;
        si[threadIdx.x] = ci;
      }
    }
    __syncthreads();
  }
  *v = sv[0];
  *i = si[0];
  __syncthreads();
}

// The kernel's phases. Each takes the row's token walk (for_each(fn): fn(t, z) for every
// token t this thread owns, z its scaled logit) and the kernel's shared scratch; all are
// inlined into SampleRowsKernel.

// The row's largest scaled logit m and its number of non-NaN ones, over the block.
template <typename ForEach>
__device__ __forceinline__ void RowMaxAndLive(const ForEach& for_each, float* sf, long long* sl,
                                              float& m, long long& live) {
  m = -INFINITY;
  live = 0;
  for_each([&](int64_t, float z) {
    if (isnan(z)) return;
    ++live;
    m = fmaxf(m, z);
  });
  m = BlockReduce(m, sf, MaxF());
  live = BlockReduce(live, sl, Sum());
}

// top-k (for 0 < top_k < live): the largest key K with count(key >= K) >= top_k is the
// top_k-th largest value. A radix select, 8 bits a pass from the top: the key prefix of the
// top_k-th largest key, by integer counts (shared-memory histograms: exact, order-free).
template <typename ForEach>
__device__ __forceinline__ uint32_t TopKMinKey(const SampleRowSpec& sp, const ForEach& for_each,
                                               unsigned* s_hist, int& s_digit, long long& s_need) {
  uint32_t prefix = 0;
  long long need = sp.top_k;  // how many of the keys with this prefix must be >= the result
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) s_hist[b] = 0;
    __syncthreads();
    const uint32_t mask = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    for_each([&](int64_t, float z) {
      if (isnan(z)) return;
      const uint32_t key = OrderedFloatKey(z);
      if ((key & mask) == prefix) atomicAdd(&s_hist[(key >> shift) & 0xFF], 1u);
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      long long above = 0;
      int b = 255;
      for (; b > 0 && above + s_hist[b] < need; --b) above += s_hist[b];
      s_digit = b;
      s_need = need - above;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s_digit) << shift;
    need = s_need;
    __syncthreads();
  }
  return prefix;
}

// top-p (for top_p < 1): the smallest key K whose strictly-greater mass is < top_p of the
// total, over the keys >= kmin (the top-k cut); a bisection over the key range.
template <typename ForEach>
__device__ __forceinline__ uint32_t TopPMinKey(const SampleRowSpec& sp, uint32_t kmin, float m,
                                               const ForEach& for_each, double* sd) {
  double total = 0;
  for_each([&](int64_t, float z) {
    if (!isnan(z) && OrderedFloatKey(z) >= kmin) total += exp(static_cast<double>(z) - m);
  });
  total = BlockReduce(total, sd, Sum());
  uint64_t lo = kmin, hi = 0xFFFFFFFFull;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    double above = 0;
    for_each([&](int64_t, float z) {
      if (isnan(z)) return;
      const uint32_t key = OrderedFloatKey(z);
      if (key >= kmin && key > mid) above += exp(static_cast<double>(z) - m);
    });
    above = BlockReduce(above, sd, Sum());
    if (above / total < static_cast<double>(sp.top_p)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return static_cast<uint32_t>(lo);
}

// Gumbel-max over the kept tokens (key >= pmin): the drawn token, which every thread gets.
template <typename ForEach>
__device__ __forceinline__ int32_t GumbelMaxToken(const SampleRowSpec& sp, uint32_t pmin,
                                                  const ForEach& for_each, double* sd,
                                                  int32_t* si) {
  double bv = 0;
  int32_t bi = -1;
  for_each([&](int64_t t, float z) {
    if (isnan(z) || OrderedFloatKey(z) < pmin) return;
    const double s =
        static_cast<double>(z) + GumbelNoise(sp.seed, sp.position, static_cast<int32_t>(t));
    if (bi < 0 || s > bv) {
      bv = s;
      bi = static_cast<int32_t>(t);
    }
  });
  BlockArgmax(&bv, &bi, sd, si);
  return bi;
}

// The log-sum-exp of the row's scaled logits (m: their maximum).
template <typename ForEach>
__device__ __forceinline__ double RowLogSumExp(float m, const ForEach& for_each, double* sd) {
  double sum = 0;
  for_each([&](int64_t, float z) {
    if (!isnan(z)) sum += exp(static_cast<double>(z) - m);
  });
  sum = BlockReduce(sum, sd, Sum());
  return static_cast<double>(m) + log(sum);
}

// o's top_logprobs best tokens and their logprobs (lse: the row's log-sum-exp).
template <typename ForEach>
__device__ __forceinline__ void WriteTopLogprobs(const SampleRowSpec& sp, double lse,
                                                 const ForEach& for_each, double* sd, int32_t* si,
                                                 SampledLogprobs* o) {
  // The best tokens in the order (z descending, id ascending): each pass takes the best one
  // after the previous pass's.
  double prev_z = INFINITY;
  int32_t prev_t = -1;
  for (int k = 0; k < sp.top_logprobs && k < kMaxTopLogprobs; ++k) {
    double bv = 0;
    int32_t bi = -1;
    for_each([&](int64_t t, float zf) {
      if (isnan(zf)) return;
      const double z = zf;
      const bool after = prev_t < 0 || z < prev_z || (z == prev_z && t > prev_t);
      if (after && (bi < 0 || z > bv)) {
        bv = z;
        bi = static_cast<int32_t>(t);
      }
    });
    BlockArgmax(&bv, &bi, sd, si);
    if (threadIdx.x == 0) {
      o->top_tokens[k] = bi;
      o->top_logprobs[k] = bi < 0 ? -INFINITY : static_cast<float>(bv - lse);
    }
    if (bi < 0) break;
    prev_z = bv;
    prev_t = bi;
  }
}

__global__ void __launch_bounds__(kThreads)
    SampleRowsKernel(const SampleRowSpec* __restrict__ specs, const float* __restrict__ logits,
                     int64_t vocab, int64_t vmax, int64_t shard_stride,
                     int32_t* __restrict__ predictions, SampledLogprobs* __restrict__ out) {
  __shared__ double sd[kThreads];
  __shared__ long long sl[kThreads];
  __shared__ float sf[kThreads];
  __shared__ int32_t si[kThreads];
  __shared__ int32_t s_token;
  __shared__ unsigned s_hist[256];
  __shared__ int s_digit;
  __shared__ long long s_need;
  const SampleRowSpec sp = specs[blockIdx.x];
  const bool sampled = sp.temperature >= kMinSamplingTemperature;
  const float* row = logits + static_cast<int64_t>(sp.row) * vmax;
  auto z_of = [&](int64_t t) {
    const int64_t k = t / vmax;
    return ScaledLogit(row[k * shard_stride + (t - k * vmax)], sp.temperature, sampled);
  };
  // fn(t, z) for every token t this thread owns, shard by shard (no division per element).
  auto for_each = [&](auto fn) {
    for (int64_t base = 0, at = 0; base < vocab; base += vmax, at += shard_stride) {
      const int64_t n = min(vmax, vocab - base);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        fn(base + i, ScaledLogit(row[at + i], sp.temperature, sampled));
      }
    }
  };

  float m;
  long long live;
  RowMaxAndLive(for_each, sf, sl, m, live);

  if (sp.draw && sampled) {
    uint32_t kmin = 0;  // keys below kmin are out of the top k, below pmin out of the top p
    if (sp.top_k > 0 && sp.top_k < live) kmin = TopKMinKey(sp, for_each, s_hist, s_digit, s_need);
    uint32_t pmin = kmin;
    if (sp.top_p < 1.0f) pmin = TopPMinKey(sp, kmin, m, for_each, sd);
    const int32_t bi = GumbelMaxToken(sp, pmin, for_each, sd, si);
    if (threadIdx.x == 0) {
      predictions[sp.row] = bi;
      s_token = bi;
    }
  } else if (threadIdx.x == 0) {
    s_token = predictions[sp.row];
  }
  __syncthreads();

  if (sp.top_logprobs < 0) return;
  const double lse = RowLogSumExp(m, for_each, sd);
  SampledLogprobs* o = out + blockIdx.x;
  const int32_t token = s_token;
  if (threadIdx.x == 0) {
    o->token = token;
    o->logprob = token >= 0 && token < vocab ? static_cast<float>(z_of(token) - lse) : -INFINITY;
  }
  WriteTopLogprobs(sp, lse, for_each, sd, si, o);
}

}  // namespace

absl::Status SampleRowsCuda(const SampleRowsParams& p) {
  if (p.rows < 0) return absl::InvalidArgumentError("sample rows: rows < 0");
  if (p.rows == 0) return absl::OkStatus();
  if (p.specs == nullptr || p.logits == nullptr || p.predictions == nullptr || p.out == nullptr) {
    return absl::InvalidArgumentError("sample rows: specs, logits, predictions, out must be set");
  }
  if (p.vocab < 1 || p.vmax < 1 || p.vmax > p.vocab || p.vocab > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample rows: vocab ", p.vocab, " / vmax ", p.vmax, " out of range"));
  }
  const int64_t shards = (p.vocab + p.vmax - 1) / p.vmax;
  if (shards > 1 && p.shard_stride < p.vmax) {
    return absl::InvalidArgumentError("sample rows: shard_stride < vmax");
  }
  SampleRowsKernel<<<static_cast<unsigned>(p.rows), kThreads, 0,
                     static_cast<cudaStream_t>(p.stream)>>>(p.specs, p.logits, p.vocab, p.vmax,
                                                            p.shard_stride, p.predictions, p.out);
  VERIFYD_CUDA_RETURN_IF_LAUNCH_ERROR(SampleRowsKernel);
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
