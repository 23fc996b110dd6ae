// Host side of the CUDA verify attention: device query, workspace, Supports, the split
// planner, plan upload, dispatch, and the split combine kernel.
#include "kernels/cuda/verify_attention_cuda.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/verify_attention_kernel.cuh"
#include "kernels/cuda/verify_attention_seesaw.cuh"
#include "kernels/cuda/verify_attention_wgmma.cuh"

namespace verifyd::kernels::cuda {
namespace detail {

extern template cudaError_t LaunchVerifyAttentionKernel<16, 32, 5>(const VerifyKernelArgs&,
                                                                   int, cudaStream_t);
extern template cudaError_t LaunchVerifyAttentionKernel<16, 32, 2>(const VerifyKernelArgs&,
                                                                   int, cudaStream_t);
extern template cudaError_t LaunchVerifyAttentionKernel<16, 32, 2, 2>(const VerifyKernelArgs&,
                                                                      int, cudaStream_t);
extern template cudaError_t LaunchVerifyAttentionKernel<64, 32, 3>(const VerifyKernelArgs&,
                                                                   int, cudaStream_t);
extern template cudaError_t LaunchVerifyAttentionWgmma<32, 3>(const VerifyKernelArgs&, int,
                                                              cudaStream_t);

// Grid (items, rows_per_cta, 512 / cols_per_cta): one CTA per (row, column chunk). With few
// rows (one long request) the chunks are 64 columns so the rows still spread over many SMs
// (256 threads = 16 split groups x 16 column groups of 4); with many rows, whole rows (2 x
// 128). Split weights go to shared memory first, each split group sums every
// split_groups-th split, then the groups meet in shared memory.
__global__ void __launch_bounds__(kCombineThreads) VerifyCombineKernel(const VerifyCombineArgs args) {
  const int col_groups = args.cols_per_cta / 4;            // 16 or 128
  const int split_groups = kCombineThreads / col_groups;   // 16 or 2
  __shared__ float s_w[kMaxCombineSplits];
  __shared__ float s_red[kCombineThreads / 32];
  __shared__ float4 s_acc[kCombineThreads];  // [split group][column group]
  const VerifyCombineItem item = args.items[blockIdx.x];
  const int r = blockIdx.y;
  if (r >= item.num_rows) return;
  const int stride = args.rows_per_cta;
  const int ns = item.num_splits;
  const float* lse_base = args.part_lse + item.partial_row0 + r;
  const int tid = threadIdx.x;
  const int sg = tid / col_groups;
  const int cg = tid % col_groups;
  const int col = blockIdx.z * args.cols_per_cta + cg * 4;
  const float* o_base = args.part_o + static_cast<int64_t>(item.partial_row0 + r) * kVDim + col;
  // The items come from the plan (uploaded before both kernels); the partials from the
  // attention kernel: wait for it (PDL) only now.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  // Every load is issued before anything waits on one (a single memory round trip for up to
  // kLsePerThread * 256 splits and kOPerThread split groups' worth of partial outputs; the
  // loops after them cover the rest): the LSE of splits tid, tid + 256, ... and this
  // thread's four columns of splits sg, sg + split_groups, ...
  constexpr int kLsePerThread = 4;
  constexpr int kOPerThread = 8;
  float lse[kLsePerThread];
#pragma unroll
  for (int k = 0; k < kLsePerThread; ++k) {
    const int s = tid + k * kCombineThreads;
    lse[k] = s < ns ? lse_base[s * stride] : -INFINITY;
  }
  float4 o_pre[kOPerThread];
#pragma unroll
  for (int k = 0; k < kOPerThread; ++k) {
    const int s = sg + k * split_groups;
    o_pre[k] = s < ns ? *reinterpret_cast<const float4*>(
                            o_base + static_cast<int64_t>(s) * stride * kVDim)
                      : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kLsePerThread; ++k) mx = fmaxf(mx, lse[k]);
  for (int s = tid + kLsePerThread * kCombineThreads; s < ns; s += kCombineThreads) {
    mx = fmaxf(mx, lse_base[s * stride]);
  }
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if ((tid & 31) == 0) s_red[tid >> 5] = mx;
  __syncthreads();
  mx = s_red[0];
  for (int i = 1; i < kCombineThreads / 32; ++i) mx = fmaxf(mx, s_red[i]);
  __syncthreads();
  float wsum = 0.f;
#pragma unroll
  for (int k = 0; k < kLsePerThread; ++k) {
    const int s = tid + k * kCombineThreads;
    if (s < ns) {
      const float w = mx == -INFINITY ? 0.f : exp2f(lse[k] - mx);
      s_w[s] = w;
      wsum += w;
    }
  }
  for (int s = tid + kLsePerThread * kCombineThreads; s < ns; s += kCombineThreads) {
    const float w = mx == -INFINITY ? 0.f : exp2f(lse_base[s * stride] - mx);
    s_w[s] = w;
    wsum += w;
  }
  for (int off = 16; off > 0; off >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, off);
  if ((tid & 31) == 0) s_red[tid >> 5] = wsum;
  __syncthreads();
  float sum_w = 0.f;
  for (int i = 0; i < kCombineThreads / 32; ++i) sum_w += s_red[i];

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  auto add = [&](float w, const float4& o) {
    if (w != 0.f) {  // splits that carry no weight are skipped
      acc.x += w * o.x;
      acc.y += w * o.y;
      acc.z += w * o.z;
      acc.w += w * o.w;
    }
  };
#pragma unroll
  for (int k = 0; k < kOPerThread; ++k) {
    const int s = sg + k * split_groups;
    if (s < ns) add(s_w[s], o_pre[k]);
  }
#pragma unroll 4
  for (int s = sg + kOPerThread * split_groups; s < ns; s += split_groups) {
    add(s_w[s], *reinterpret_cast<const float4*>(o_base + static_cast<int64_t>(s) * stride * kVDim));
  }
  s_acc[tid] = acc;
  __syncthreads();
  if (sg != 0) return;
  acc = s_acc[cg];
  for (int g = 1; g < split_groups; ++g) {
    const float4 o = s_acc[g * col_groups + cg];
    acc.x += o.x;
    acc.y += o.y;
    acc.z += o.z;
    acc.w += o.w;
  }
  const int64_t out_row = static_cast<int64_t>(item.out_row0) + r;
  const float inv = sum_w > 0.f ? 1.f / sum_w : 0.f;
  __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(args.out + out_row * kVDim + col);
  dst[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
  dst[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  if (blockIdx.z == 0 && tid == 0 && args.lse != nullptr) {
    args.lse[out_row] = sum_w > 0.f ? (mx + log2f(sum_w)) * 0.69314718055994531f : -INFINITY;
  }
}

}  // namespace detail

namespace {

// Resolved kernel configuration for a device.
struct ConfigShape {
  int rows = 16;
  int keys = 32;
  int stages = 4;
  size_t smem = 0;
  int ctas_per_sm = 1;
};

absl::StatusOr<ConfigShape> ResolveConfig(VerifyKernelConfig config,
                                          const VerifyAttentionDeviceInfo& dev) {
  const bool sm90 = dev.cc_major == 9;
  ConfigShape c;
  if (config == VerifyKernelConfig::kS64) {
    if (!sm90) {
      return absl::UnimplementedError(
          absl::StrCat("verify attention: the seesaw wgmma configuration needs an sm_90 "
                       "device, got sm_", dev.cc_major, dev.cc_minor));
    }
    c = {detail::SeesawTraits::kRows, detail::SeesawTraits::kKeys, detail::SeesawTraits::kStages,
         detail::SeesawTraits::kSmemBytes};
  } else if (config == VerifyKernelConfig::kW64) {
    if (!sm90) {
      return absl::UnimplementedError(
          absl::StrCat("verify attention: the wgmma configuration needs an sm_90 device, got "
                       "sm_", dev.cc_major, dev.cc_minor));
    }
    c = {64, 32, 3, detail::WgmmaTraits<32, 3>::kSmemBytes};
  } else if (config == VerifyKernelConfig::kM16x2) {
    if (!sm90) {
      return absl::UnimplementedError(
          absl::StrCat("verify attention: the 2-CTA 16-row configuration needs an sm_90 device, "
                       "got sm_", dev.cc_major, dev.cc_minor));
    }
    c = {16, 32, 2, detail::VerifyKernelTraits<16, 32, 2, 2>::kSmemBytes, 2};
  } else if (config == VerifyKernelConfig::kM64) {
    if (!sm90) {
      return absl::UnimplementedError(
          absl::StrCat("verify attention: the 64-row configuration needs an sm_90 device, got "
                       "sm_", dev.cc_major, dev.cc_minor));
    }
    c = {64, 32, 3, detail::VerifyKernelTraits<64, 32, 3>::kSmemBytes};
  } else if (sm90) {
    c = {16, 32, 5, detail::VerifyKernelTraits<16, 32, 5>::kSmemBytes};
  } else {
    c = {16, 32, 2, detail::VerifyKernelTraits<16, 32, 2>::kSmemBytes};
  }
  if (static_cast<int64_t>(c.smem) > dev.max_smem_per_block) {
    return absl::UnimplementedError(absl::StrCat(
        "verify attention: configuration needs ", c.smem,
        " bytes of shared memory per block; the device allows ", dev.max_smem_per_block));
  }
  return c;
}

// kAuto's kernel on sm_90 is the seesaw schedule (kS64) for every shape but tiny decode
// batches: since its producer warps copy whole 128-byte rows (no per-chunk shuffles) it ran
// every ANCHORS shape on the H200 faster than the other paths, the memory-bound one-node
// decode shapes included (docs/PERF.md). VERIFYD_VA_KERNEL (read once per process, at the
// first plan) selects an older rule for comparison: "wgmma" = the plain wgmma kernel (kW64) for requests of more
// than 16 rows outside small batches and the mma.sync 16-row kernel otherwise; "mma" = the
// mma.sync 16-row kernel everywhere (what other architectures run).
enum class AutoRule { kSeesaw, kWgmma, kMma };
AutoRule AutoRuleFromEnv() {
  static const AutoRule rule = [] {
    const char* v = std::getenv("VERIFYD_VA_KERNEL");
    if (v != nullptr && std::strcmp(v, "wgmma") == 0) return AutoRule::kWgmma;
    if (v != nullptr && std::strcmp(v, "mma") == 0) return AutoRule::kMma;
    return AutoRule::kSeesaw;
  }();
  return rule;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

struct WorkspaceLayout {
  size_t work = 0, combine = 0, lse = 0, part_o = 0, total = 0;
};

WorkspaceLayout Layout(int max_work, int max_combine, int64_t max_partial) {
  WorkspaceLayout l;
  l.work = 0;
  l.combine = AlignUp(l.work + sizeof(VerifyWorkItem) * max_work, 256);
  l.lse = AlignUp(l.combine + sizeof(VerifyCombineItem) * max_combine, 256);
  l.part_o = AlignUp(l.lse + sizeof(float) * max_partial, 256);
  l.total = AlignUp(l.part_o + sizeof(float) * detail::kVDim * max_partial, 256);
  return l;
}

// Makespan (in key units) of items with these costs when handed out in order to `slots`
// identical workers, each taking the next item when free (how CTAs are dispatched).
double Makespan(const std::vector<double>& costs, int slots) {
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int i = 0; i < slots; ++i) free_at.push(0.0);
  double end = 0.0;
  for (double c : costs) {
    const double t = free_at.top() + c;
    free_at.pop();
    free_at.push(t);
    end = std::max(end, t);
  }
  return end;
}

}  // namespace

absl::StatusOr<VerifyAttentionDeviceInfo> VerifyAttentionDeviceInfo::Query() {
  int dev = 0;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  VerifyAttentionDeviceInfo info;
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, dev));
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&info.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&info.cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &info.max_smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &info.max_smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  return info;
}

size_t VerifyAttentionWorkspace::BytesFor(int max_work_items, int max_combine_items,
                                          int64_t max_partial_rows) {
  return Layout(max_work_items, max_combine_items, max_partial_rows).total;
}

absl::StatusOr<VerifyAttentionWorkspace> VerifyAttentionWorkspace::Allocate(
    int max_work_items, int max_combine_items, int64_t max_partial_rows) {
  if (max_work_items < 1 || max_combine_items < 0 || max_partial_rows < 0) {
    return absl::InvalidArgumentError("workspace: capacities must be positive");
  }
  VerifyAttentionWorkspace ws;
  ws.bytes = BytesFor(max_work_items, max_combine_items, max_partial_rows);
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMalloc(&ws.device, ws.bytes));
  ws.max_work_items = max_work_items;
  ws.max_combine_items = max_combine_items;
  ws.max_partial_rows = max_partial_rows;
  return ws;
}

absl::StatusOr<VerifyAttentionWorkspace> VerifyAttentionWorkspace::AllocateDefault() {
  return Allocate(/*max_work_items=*/65536, /*max_combine_items=*/16384,
                  /*max_partial_rows=*/32768);
}

absl::Status VerifyAttentionWorkspace::Free() {
  if (device != nullptr) VERIFYD_CUDA_RETURN_IF_ERROR(cudaFree(device));
  device = nullptr;
  bytes = 0;
  return absl::OkStatus();
}

absl::Status SupportsVerifyAttentionCuda(const VerifyAttentionParams& p,
                                         const VerifyAttentionDeviceInfo& device) {
  if (p.batch < 0) return absl::InvalidArgumentError("verify attention: batch < 0");
  if (p.total_rows < 0) return absl::InvalidArgumentError("verify attention: total_rows < 0");
  if (p.num_heads < 1) return absl::InvalidArgumentError("verify attention: num_heads < 1");
  if (p.dtype != DType::kBFloat16) {
    return absl::UnimplementedError(absl::StrCat(
        "verify attention (CUDA): dtype ", std::string(DTypeName(p.dtype)), " unsupported (bfloat16 only)"));
  }
  if (p.qk_dim != detail::kQkDim) {
    return absl::UnimplementedError(
        absl::StrCat("verify attention (CUDA): qk_dim ", p.qk_dim, " unsupported (576 only)"));
  }
  if (p.v_dim != detail::kVDim) {
    return absl::UnimplementedError(
        absl::StrCat("verify attention (CUDA): v_dim ", p.v_dim, " unsupported (512 only)"));
  }
  if (p.mask_words < 1 || p.mask_words > kMaxTailRows / 64) {
    return absl::UnimplementedError(absl::StrCat("verify attention (CUDA): mask_words ",
                                                 p.mask_words, " unsupported (1..",
                                                 kMaxTailRows / 64, ")"));
  }
  if (device.cc_major < 8) {
    return absl::UnimplementedError(absl::StrCat(
        "verify attention (CUDA): needs sm_80 or newer, device is sm_", device.cc_major,
        device.cc_minor));
  }
  auto cfg = ResolveConfig(VerifyKernelConfig::kM16, device);
  if (!cfg.ok()) return cfg.status();
  return absl::OkStatus();
}

absl::StatusOr<VerifyAttentionPlan> PlanVerifyAttention(
    const VerifyAttentionParams& params, const int32_t* hq, const int32_t* hkv,
    const VerifyAttentionDeviceInfo& device, const VerifyAttentionWorkspace& ws,
    const VerifyPlanOptions& options) {
  if (absl::Status s = SupportsVerifyAttentionCuda(params, device); !s.ok()) return s;
  const int B = params.batch;
  const int H = params.num_heads;
  if (B > 0 && (hq == nullptr || hkv == nullptr)) {
    return absl::InvalidArgumentError("verify plan: q_indptr / kv_indptr host copies are null");
  }
  std::vector<int> n(B), L(B);
  int max_rows = 0;
  if (B > 0 && (hq[0] != 0 || hkv[0] != 0)) {
    return absl::InvalidArgumentError("verify plan: q_indptr[0] and kv_indptr[0] must be 0");
  }
  for (int b = 0; b < B; ++b) {
    n[b] = hq[b + 1] - hq[b];
    L[b] = hkv[b + 1] - hkv[b];
    if (n[b] < 0) return absl::InvalidArgumentError(absl::StrCat("q_indptr decreases at ", b));
    if (L[b] < n[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv_indptr: request ", b, " has ", L[b], " slots < ", n[b], " rows"));
    }
    if (n[b] > 64 * params.mask_words) {
      return absl::InvalidArgumentError(absl::StrCat("q_indptr: request ", b, " has ", n[b],
                                                     " rows > 64 * mask_words"));
    }
    max_rows = std::max<int64_t>(max_rows, static_cast<int64_t>(n[b]) * H);
  }
  if (B > 0 && hq[B] != params.total_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_indptr[batch] = ", hq[B], " != total_rows ", params.total_rows));
  }

  VerifyKernelConfig config = options.config;
  if (config == VerifyKernelConfig::kAuto) {
    config = VerifyKernelConfig::kM16;
    if (device.cc_major == 9) {
      switch (AutoRuleFromEnv()) {
        case AutoRule::kSeesaw: {
          // Except tiny decode batches (<= 16 rows per request, <= 16k keys in all), where
          // the 16-row kernel's shorter prologue won by ~1 us (H200: 1 x 8 heads x 1 node at
          // 1k / 4k keys 0.0083 / 0.0095 ms vs 0.0095 / 0.0109; even at 16k).
          int64_t keys = 0;
          for (int b = 0; b < B; ++b) keys += L[b];
          const bool tiny = max_rows <= 16 && keys <= 16384;
          config = tiny ? VerifyKernelConfig::kM16 : VerifyKernelConfig::kS64;
          break;
        }
        case AutoRule::kWgmma: {
          // wgmma 64-row tiles once a request has more than 16 rows, except for small
          // batches (<= 1M row-keys in all: latency-bound, where the 16-row tiles' shorter
          // prologue won).
          double row_keys = 0.0;
          for (int b = 0; b < B; ++b) row_keys += static_cast<double>(n[b]) * H * L[b];
          const bool small = row_keys <= 1.0e6 && max_rows <= 128;
          if (max_rows > 16 && !small) config = VerifyKernelConfig::kW64;
          break;
        }
        case AutoRule::kMma:
          break;
      }
    }
  }
  auto shape = ResolveConfig(config, device);
  if (!shape.ok()) return shape.status();
  const int BM = shape->rows;
  const int BN = shape->keys;

  VerifyAttentionPlan plan;
  plan.config = config;
  plan.rows_per_cta = BM;
  plan.keys_per_tile = BN;
  plan.num_heads = H;
  plan.batch = B;
  plan.total_rows = params.total_rows;

  // CTAs resident per SM: one for every configuration (> 96 KB of shared memory, registers
  // capped for one 256-thread block) except kM16x2 (two).
  const int per_sm = shape->ctas_per_sm;
  const int slots = std::max(1, device.num_sms) * per_sm;
  const double ov = options.split_overhead_keys;

  std::vector<int> tiles(B);
  double total_cost = 0.0;
  for (int b = 0; b < B; ++b) {
    tiles[b] = static_cast<int>(CeilDiv(static_cast<int64_t>(n[b]) * H, BM));
    total_cost += tiles[b] * (L[b] + ov);
  }
  if (total_cost == 0.0) return plan;

  // Candidate split lengths: the keys one slot would stream if the work filled 1, 2, 3, ...
  // waves exactly (the makespan below adds the per-split overhead), plus no split at all.
  double total_keys = 0.0;
  for (int b = 0; b < B; ++b) total_keys += static_cast<double>(tiles[b]) * L[b];
  const int64_t min_split = static_cast<int64_t>(std::max(1, options.min_split_tiles)) * BN;
  std::vector<int64_t> candidates = {std::numeric_limits<int32_t>::max()};
  for (double waves : {0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0}) {
    const double target = total_keys / (waves * slots);
    candidates.push_back(std::max<int64_t>(min_split, CeilDiv(static_cast<int64_t>(target), BN) * BN));
  }
  // When there are fewer row tiles than CTA slots, how many ways the longest request is
  // split decides how many SMs work: also try every split count of it up to two waves
  // (the wave targets above can miss the one that fills the SMs, e.g. 16 row tiles x 8
  // splits = 128 CTAs where they gave 7 x 16 = 112).
  int64_t all_tiles = 0;
  int max_len = 0;
  for (int b = 0; b < B; ++b) {
    all_tiles += tiles[b];
    max_len = std::max(max_len, L[b]);
  }
  if (all_tiles < slots) {
    const int64_t max_s = std::min<int64_t>(2 * slots / std::max<int64_t>(1, all_tiles) + 1,
                                            CeilDiv(max_len, BN));
    for (int64_t s = 2; s <= max_s; ++s) {
      candidates.push_back(std::max<int64_t>(min_split, CeilDiv(CeilDiv(max_len, s), BN) * BN));
    }
  }
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> best_splits;
  std::vector<int> splits(B);
  std::vector<double> costs;
  for (int64_t chunk : candidates) {
    int64_t items = 0, partial = 0, combine = 0;
    costs.clear();
    for (int b = 0; b < B; ++b) {
      if (tiles[b] == 0) {
        splits[b] = 0;
        continue;
      }
      int64_t s = std::max<int64_t>(1, CeilDiv(L[b], chunk));
      s = std::min<int64_t>(s, CeilDiv(L[b], BN));
      if (options.max_splits > 0) s = std::min<int64_t>(s, options.max_splits);
      s = std::min<int64_t>(s, detail::kMaxCombineSplits);
      const int64_t len = CeilDiv(CeilDiv(L[b], s), BN) * BN;
      s = CeilDiv(L[b], len);
      splits[b] = static_cast<int>(s);
      items += s * tiles[b];
      if (s > 1) {
        partial += s * tiles[b] * BM;
        combine += tiles[b];
      }
      for (int64_t i = 0; i < s; ++i) {
        const double c = std::min<int64_t>(len, L[b] - i * len) + ov;
        for (int t = 0; t < tiles[b]; ++t) costs.push_back(c);
      }
    }
    if (items > ws.max_work_items || partial > ws.max_partial_rows ||
        combine > ws.max_combine_items) {
      continue;
    }
    std::stable_sort(costs.begin(), costs.end(), std::greater<double>());
    const double m = Makespan(costs, slots) * (1.0 + 1e-6 * static_cast<double>(items));
    if (m < best) {
      best = m;
      best_splits = splits;
    }
  }
  if (best_splits.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "verify plan: batch needs more than the workspace holds (", ws.max_work_items,
        " work items, ", ws.max_partial_rows, " partial rows)"));
  }

  // Work list: per request, split, row tile; then longest first (stable: the row tiles of
  // one key range stay adjacent, so they run together and share the KV tile in L2).
  int64_t partial_cursor = 0;
  struct Keyed {
    int32_t len;
    VerifyWorkItem item;
  };
  std::vector<Keyed> keyed;
  for (int b = 0; b < B; ++b) {
    const int s = best_splits[b];
    if (s == 0) continue;
    const int64_t len = CeilDiv(CeilDiv(L[b], s), BN) * BN;
    plan.max_splits = std::max(plan.max_splits, s);
    for (int t = 0; t < tiles[b]; ++t) {
      int32_t prow = -1;
      if (s > 1) {
        prow = static_cast<int32_t>(partial_cursor);
        VerifyCombineItem ci{};
        ci.out_row0 = hq[b] * H + t * BM;
        ci.num_rows = static_cast<int32_t>(std::min<int64_t>(BM, static_cast<int64_t>(n[b]) * H - t * BM));
        ci.num_splits = s;
        ci.partial_row0 = prow;
        plan.combine.push_back(ci);
        partial_cursor += static_cast<int64_t>(s) * BM;
      }
      for (int i = 0; i < s; ++i) {
        VerifyWorkItem w{};
        w.q_row0 = hq[b];
        w.num_nodes = n[b];
        w.kv_off = hkv[b];
        w.kv_len = L[b];
        w.fold_begin = t * BM;
        w.kv_begin = static_cast<int32_t>(i * len);
        w.kv_end = static_cast<int32_t>(std::min<int64_t>(L[b], (i + 1) * len));
        w.partial_row = s > 1 ? prow + i * BM : -1;
        keyed.push_back({w.kv_end - w.kv_begin, w});
      }
    }
  }
  // Row tiles of the same key range are adjacent; sort by key count only.
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const Keyed& a, const Keyed& b) { return a.len > b.len; });
  plan.work.reserve(keyed.size());
  for (const Keyed& k : keyed) plan.work.push_back(k.item);
  plan.partial_rows = partial_cursor;
  return plan;
}

absl::Status UploadVerifyAttentionPlan(const VerifyAttentionPlan& plan,
                                       const VerifyAttentionWorkspace& ws, void* stream) {
  if (static_cast<int64_t>(plan.work.size()) > ws.max_work_items ||
      static_cast<int64_t>(plan.combine.size()) > ws.max_combine_items ||
      plan.partial_rows > ws.max_partial_rows) {
    return absl::InvalidArgumentError("verify plan: does not fit the workspace");
  }
  const WorkspaceLayout l = Layout(ws.max_work_items, ws.max_combine_items, ws.max_partial_rows);
  auto* base = static_cast<unsigned char*>(ws.device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (!plan.work.empty()) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + l.work, plan.work.data(),
                                                 plan.work.size() * sizeof(VerifyWorkItem),
                                                 cudaMemcpyHostToDevice, s));
  }
  if (!plan.combine.empty()) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        base + l.combine, plan.combine.data(), plan.combine.size() * sizeof(VerifyCombineItem),
        cudaMemcpyHostToDevice, s));
  }
  return absl::OkStatus();
}

absl::Status VerifyAttentionCuda(const VerifyAttentionParams& p, const VerifyAttentionPlan& plan,
                                 const VerifyAttentionWorkspace& ws) {
  if (p.batch != plan.batch || p.num_heads != plan.num_heads || p.total_rows != plan.total_rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "verify attention: plan was made for batch ", plan.batch, ", heads ", plan.num_heads,
        ", rows ", plan.total_rows, "; params have ", p.batch, ", ", p.num_heads, ", ",
        p.total_rows));
  }
  if (p.dtype != DType::kBFloat16 || p.qk_dim != detail::kQkDim || p.v_dim != detail::kVDim ||
      p.mask_words < 1 || p.mask_words > kMaxTailRows / 64) {
    return absl::UnimplementedError("verify attention (CUDA): unsupported params "
                                    "(see SupportsVerifyAttentionCuda)");
  }
  if (plan.work.empty()) return absl::OkStatus();
  if (p.q == nullptr) return absl::InvalidArgumentError("verify attention: q is null");
  if (p.kv == nullptr) return absl::InvalidArgumentError("verify attention: kv is null");
  if (p.kv_indices == nullptr)
    return absl::InvalidArgumentError("verify attention: kv_indices is null");
  if (p.tree_mask == nullptr)
    return absl::InvalidArgumentError("verify attention: tree_mask is null");
  if (p.out == nullptr) return absl::InvalidArgumentError("verify attention: out is null");
  // The kernels move q / kv rows with 16-byte copies and out rows with bulk copies (16-byte
  // granules): rows are 1152 / 1024 bytes, so the base pointers must be 16-byte aligned.
  for (const auto& [name, ptr] : {std::pair<const char*, const void*>{"q", p.q},
                                  {"kv", p.kv}, {"out", p.out}}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("verify attention: ", name, " must be 16-byte aligned"));
    }
  }
  if (ws.device == nullptr || static_cast<int64_t>(plan.work.size()) > ws.max_work_items ||
      plan.partial_rows > ws.max_partial_rows ||
      static_cast<int64_t>(plan.combine.size()) > ws.max_combine_items) {
    return absl::InvalidArgumentError("verify attention: workspace too small for the plan");
  }
  const WorkspaceLayout l = Layout(ws.max_work_items, ws.max_combine_items, ws.max_partial_rows);
  auto* base = static_cast<unsigned char*>(ws.device);

  detail::VerifyKernelArgs a{};
  a.q = static_cast<const __nv_bfloat16*>(p.q);
  a.kv = static_cast<const __nv_bfloat16*>(p.kv);
  a.kv_indices = p.kv_indices;
  a.tree_mask = p.tree_mask;
  a.mask_words = p.mask_words;
  a.num_heads = p.num_heads;
  a.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  a.out = static_cast<__nv_bfloat16*>(p.out);
  a.lse = p.lse;
  a.part_o = reinterpret_cast<float*>(base + l.part_o);
  a.part_lse = reinterpret_cast<float*>(base + l.lse);
  a.work = reinterpret_cast<const VerifyWorkItem*>(base + l.work);
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  const int grid = static_cast<int>(plan.work.size());

  int dev = 0, major = 0;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  if (plan.config == VerifyKernelConfig::kW64) {
    if (major != 9) return absl::FailedPreconditionError("verify plan (W64) made for sm_90");
    VERIFYD_CUDA_RETURN_IF_ERROR((detail::LaunchVerifyAttentionWgmma<32, 3>(a, grid, stream)));
  } else if (plan.config == VerifyKernelConfig::kS64) {
    if (major != 9) return absl::FailedPreconditionError("verify plan (S64) made for sm_90");
    VERIFYD_CUDA_RETURN_IF_ERROR((detail::LaunchVerifyAttentionSeesaw(a, grid, stream)));
  } else if (plan.config == VerifyKernelConfig::kM64) {
    if (major != 9) return absl::FailedPreconditionError("verify plan (M64) made for sm_90");
    VERIFYD_CUDA_RETURN_IF_ERROR((detail::LaunchVerifyAttentionKernel<64, 32, 3>(a, grid, stream)));
  } else if (plan.config == VerifyKernelConfig::kM16x2) {
    if (major != 9) return absl::FailedPreconditionError("verify plan (M16x2) made for sm_90");
    VERIFYD_CUDA_RETURN_IF_ERROR(
        (detail::LaunchVerifyAttentionKernel<16, 32, 2, 2>(a, grid, stream)));
  } else if (major == 9) {
    VERIFYD_CUDA_RETURN_IF_ERROR((detail::LaunchVerifyAttentionKernel<16, 32, 5>(a, grid, stream)));
  } else {
    VERIFYD_CUDA_RETURN_IF_ERROR((detail::LaunchVerifyAttentionKernel<16, 32, 2>(a, grid, stream)));
  }

  if (!plan.combine.empty()) {
    detail::VerifyCombineArgs c{};
    c.items = reinterpret_cast<const VerifyCombineItem*>(base + l.combine);
    c.part_o = a.part_o;
    c.part_lse = a.part_lse;
    c.out = a.out;
    c.lse = p.lse;
    c.rows_per_cta = plan.rows_per_cta;
    cudaLaunchConfig_t lc{};
    // Few rows to merge: 64-column chunks so they spread over the SMs; else whole rows.
    const int64_t rows_to_merge = static_cast<int64_t>(plan.combine.size()) * plan.rows_per_cta;
    int sms = 0;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    c.cols_per_cta = rows_to_merge < 4 * static_cast<int64_t>(sms) ? 64 : detail::kVDim;
    lc.gridDim = dim3(static_cast<unsigned>(plan.combine.size()),
                      static_cast<unsigned>(plan.rows_per_cta),
                      static_cast<unsigned>(detail::kVDim / c.cols_per_cta));
    lc.blockDim = dim3(detail::kCombineThreads);
    lc.dynamicSmemBytes = 0;
    lc.stream = stream;
    // Programmatic dependent launch (sm_90+): the combine grid is set up while the attention
    // kernel drains; griddepcontrol.wait in the kernel orders it after the attention writes.
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    lc.attrs = attr;
    lc.numAttrs = major >= 9 ? 1 : 0;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaLaunchKernelEx(&lc, detail::VerifyCombineKernel, c));
  }
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
