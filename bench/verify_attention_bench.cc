// verify_attention_bench: times the CUDA verify attention (kernels/cuda/verify_attention/api.h)
// on the 16 reference shapes listed in docs/PERF.md (or --shapes) and prints, per shape, the
// per-call time, the effective KV bandwidth, TFLOP/s, the memory and compute floors and the %
// of the larger floor reached. Timing: each shape rotates over several input sets spanning
// >= --rotate_bytes of KV (so L2 does not hold the KV); one captured CUDA graph runs every
// input set once, per-call time = graph time / sets, median over the replays ("ms"); "eager
// ms" is the median of single eager calls (includes host launch latency when the GPU idles).
// Peer kernels are measured in the same GPU run by a separate script. Writes the numbers as
// JSON (--json). A program, not a test: it asserts nothing about speed; it exits non-zero
// only when a CUDA call or the op fails.
//
// Inputs: bf16 random values, slots scattered at random over a pool (page size 1), one chain
// tree per request (node t sees nodes 0..t). --kv_dtype=fp8: the same rows stored in the FP8
// format (kernels/kv_fp8.h, 656 bytes a key); KV GB/s and the memory floor count those bytes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/gather_ceiling.h"
#include "kernels/common.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/kv_fp8.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, json, "verify_attention_bench.json", "where to write the JSON results");
ABSL_FLAG(int, iters, 50, "timed iterations per shape (median reported)");
ABSL_FLAG(int, warmup, 10, "untimed iterations per shape");
ABSL_FLAG(std::string, config, "auto",
          "kernel configuration (kernels/cuda/verify_attention/config.h): " +
              verifyd::kernels::cuda::VerifyKernelConfigHelp());
ABSL_FLAG(bool, positional, false,
          "positional plans (the batch-invariant mode's; --config=auto: the device's choice)");
ABSL_FLAG(bool, shared_context, true,
          "with --positional: context splits shared by a request's nodes (the engine's "
          "default; false: per-node plans)");
ABSL_FLAG(std::string, commit, "unknown", "source revision recorded in the JSON meta");
ABSL_FLAG(int, split_group, -1,
          "--positional: VerifyPlanOptions::positional_split_group (-1: chosen from the batch; "
          "0: one split per work item; N: up to N context splits per work item)");
ABSL_FLAG(int, chunk_keys, verifyd::kernels::cuda::kPositionalChunkKeys,
          "--positional: the split rule's chunk (PositionalSplitRule::chunk_keys)");
ABSL_FLAG(int, max_splits, verifyd::kernels::cuda::kPositionalMaxSplits,
          "--positional: the split rule's largest split count (PositionalSplitRule::max_splits)");
ABSL_FLAG(bool, forks, false,
          "every request of a shape is a fork of request 0: the same context slots, its own "
          "tail slots");
ABSL_FLAG(bool, share_prefixes, true,
          "give the planner the host slot lists, so forks read their shared prefix once per "
          "pack (default plans; api.h \"Shared prefixes\")");
ABSL_FLAG(double, copy_gbps, 4242.0, "copy ceiling (GB/s) for the memory floor (H200)");
ABSL_FLAG(double, mma_tflops, 790.0, "bf16 matrix rate (TFLOP/s) for the compute floor");
ABSL_FLAG(int64_t, rotate_bytes, int64_t{512} << 20,
          "KV bytes the rotating input sets span at least (several times L2)");
ABSL_FLAG(std::string, only, "", "run only shapes whose label contains this");
ABSL_FLAG(std::string, shapes, "",
          "instead of the 16 reference shapes, run these: B:H:q:ctx[,B:H:q:ctx...]");
ABSL_FLAG(bool, gather_ceiling, true,
          "first measure the random-row gather ceiling (1152-byte rows, page size 1)");
ABSL_FLAG(int, split_overhead, -1, "planner per-split overhead in keys (-1: the default)");
ABSL_FLAG(int64_t, staged_keys, int64_t{1} << 20,
          "keys the workspace's staging area holds (FP8 cache, s64staged; 1,156 bytes each)");
ABSL_FLAG(int, min_split_tiles, -1, "planner's shortest split in key tiles (-1: the default)");
ABSL_FLAG(std::string, kv_dtype, "bf16",
          "latent cache: bf16 (1,152 bytes a key) or fp8 (kernels/kv_fp8.h, 656 bytes a key)");

namespace {

using verifyd::kernels::FloatToBf16;
using verifyd::kernels::VerifyAttentionParams;
namespace vc = verifyd::kernels::cuda;

struct Shape {
  int B, H, q, ctx;
  std::string Label() const { return absl::StrCat("B", B, "_H", H, "_q", q, "_ctx", ctx); }
};

const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> shapes = {
      // Table 1: verify shapes (q nodes per request).
      {1, 8, 16, 4096},
      {1, 8, 16, 16384},
      {1, 8, 16, 65536},
      {1, 8, 16, 185000},
      {1, 16, 16, 65536},
      {1, 16, 16, 185000},
      {8, 16, 16, 16384},
      {8, 16, 16, 65536},
      {1, 16, 64, 65536},
      {32, 16, 16, 8192},
      // Table 2: memory-bound decode (one node per request).
      {1, 8, 1, 65536},
      {1, 8, 1, 185000},
      {1, 16, 1, 185000},
      {8, 16, 1, 65536},
      {32, 16, 1, 16384},
      {64, 128, 1, 4096},
  };
  return shapes;
}

// --shapes: "B:H:q:ctx,..." -> shapes; false (and a message) when malformed.
bool ParseShapes(const std::string& text, std::vector<Shape>* out) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(item, ':');
    Shape s{0, 0, 0, 0};
    if (f.size() != 4 || !absl::SimpleAtoi(f[0], &s.B) || !absl::SimpleAtoi(f[1], &s.H) ||
        !absl::SimpleAtoi(f[2], &s.q) || !absl::SimpleAtoi(f[3], &s.ctx) || s.B < 1 || s.H < 1 ||
        s.q < 1 || s.ctx < 0) {
      std::fprintf(stderr, "--shapes: '%s' is not B:H:q:ctx with B, H, q >= 1 and ctx >= 0\n",
                   std::string(item).c_str());
      return false;
    }
    out->push_back(s);
  }
  return true;
}

#define BENCH_CUDA(expr)                                                                        \
  do {                                                                                          \
    const cudaError_t e_ = (expr);                                                              \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s failed: %s at %s:%d\n", #expr, cudaGetErrorString(e_), __FILE__, \
                   __LINE__);                                                                   \
      return 1;                                                                                 \
    }                                                                                           \
  } while (0)

#define BENCH_OK(expr)                                                \
  do {                                                                \
    const absl::Status s_ = (expr);                                   \
    if (!s_.ok()) {                                                   \
      std::fprintf(stderr, "%s: %s\n", #expr, s_.ToString().c_str()); \
      return 1;                                                       \
    }                                                                 \
  } while (0)

struct Result {
  Shape shape;
  double ms = 0, eager_ms = 0, gbps = 0, tflops = 0, mem_floor_ms = 0, compute_floor_ms = 0,
         pct = 0;
  int ctas = 0, max_splits = 0, rows_per_cta = 0, sets = 0, shared_packs = 0;
  std::string
      config;  // the configuration the planner chose: "m16", "s64" or "km16" (+ " positional")
};

int RunShape(const Shape& s, vc::VerifyKernelConfig config,
             const vc::VerifyAttentionDeviceInfo& dev, vc::VerifyAttentionWorkspace& ws,
             bool kv_fp8, Result* res) {
  const int L = s.ctx + s.q;  // slots per request: context + the tree's own rows
  const int64_t row_bytes =
      kv_fp8 ? verifyd::kernels::KvFp8RowBytes(512, 64, verifyd::kernels::kKvFp8Group) : 576 * 2;
  const int64_t set_kv_bytes = int64_t{s.B} * L * row_bytes;
  const int sets = static_cast<int>(std::clamp<int64_t>(
      (absl::GetFlag(FLAGS_rotate_bytes) + set_kv_bytes - 1) / set_kv_bytes, 2, 64));
  const int64_t slots_per_set = int64_t{s.B} * L;
  const int64_t kv_slots = slots_per_set * sets;
  const int rows = s.B * s.q;

  std::mt19937_64 rng(12345);
  // KV pool: random bf16 rows (or those rows in the FP8 format), filled on the device from a
  // host block of rows repeated with an offset.
  void* kv = nullptr;
  BENCH_CUDA(cudaMalloc(&kv, kv_slots * row_bytes));
  {
    constexpr int64_t kBlockRows = 8192, kShiftRows = 64;
    std::vector<uint8_t> block(static_cast<size_t>((kBlockRows + kShiftRows) * row_bytes));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> row(576);
    for (int64_t r = 0; r < kBlockRows + kShiftRows; ++r) {
      for (auto& v : row) v = verifyd::kernels::RoundToBf16(u(rng));
      uint8_t* dst = block.data() + r * row_bytes;
      if (kv_fp8) {
        verifyd::kernels::KvFp8EncodeRow(row.data(), 512, 64, verifyd::kernels::kKvFp8Group, dst);
      } else {
        for (int d = 0; d < 576; ++d) {
          const uint16_t b = FloatToBf16(row[d]);
          std::memcpy(dst + 2 * d, &b, 2);
        }
      }
    }
    for (int64_t r0 = 0; r0 < kv_slots; r0 += kBlockRows) {
      const int64_t n = std::min<int64_t>(kBlockRows, kv_slots - r0);
      const int64_t shift = (r0 / kBlockRows * 7) % kShiftRows;  // vary the content
      BENCH_CUDA(cudaMemcpy(static_cast<uint8_t*>(kv) + r0 * row_bytes,
                            block.data() + shift * row_bytes, n * row_bytes,
                            cudaMemcpyHostToDevice));
    }
  }
  // Per set: a random disjoint subset of slots, q, a chain mask.
  std::vector<int32_t> perm(kv_slots);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const bool forks = absl::GetFlag(FLAGS_forks);
  if (forks) {  // request b's context = request 0's, per set
    for (int set = 0; set < sets; ++set) {
      int32_t* base = perm.data() + slots_per_set * set;
      for (int b = 1; b < s.B; ++b) std::copy(base, base + s.ctx, base + int64_t{b} * L);
    }
  }
  int32_t* idx = nullptr;
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&idx), kv_slots * 4));
  BENCH_CUDA(cudaMemcpy(idx, perm.data(), kv_slots * 4, cudaMemcpyHostToDevice));
  const size_t q_elems = static_cast<size_t>(rows) * s.H * 576;
  void* q = nullptr;
  BENCH_CUDA(cudaMalloc(&q, q_elems * 2 * sets));
  {
    std::vector<uint16_t> hq(q_elems * sets);
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (auto& v : hq) v = FloatToBf16(u(rng));
    BENCH_CUDA(cudaMemcpy(q, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice));
  }
  std::vector<uint64_t> hmask(static_cast<size_t>(rows) * 2, 0);
  std::vector<int32_t> hqi(s.B + 1), hki(s.B + 1);
  for (int b = 0; b <= s.B; ++b) {
    hqi[b] = b * s.q;
    hki[b] = b * L;
  }
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.q; ++t)
      for (int j = 0; j <= t; ++j) hmask[(b * s.q + t) * 2 + j / 64] |= 1ull << (j % 64);
  uint64_t* mask = nullptr;
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&mask), hmask.size() * 8));
  BENCH_CUDA(cudaMemcpy(mask, hmask.data(), hmask.size() * 8, cudaMemcpyHostToDevice));
  void* out = nullptr;
  float* lse = nullptr;
  BENCH_CUDA(cudaMalloc(&out, static_cast<size_t>(rows) * s.H * 512 * 2));
  BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&lse), static_cast<size_t>(rows) * s.H * 4));

  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  VerifyAttentionParams p;
  p.batch = s.B;
  p.total_rows = rows;
  p.num_heads = s.H;
  p.softmax_scale = 1.0f / std::sqrt(192.0f);
  p.kv_slots = kv_slots;
  p.kv = kv;
  p.kv_fp8 = kv_fp8;
  p.tree_mask = mask;
  p.mask_words = 2;
  p.out = out;
  p.lse = lse;
  p.stream = stream;
  vc::VerifyPlanOptions opt;
  opt.config = config;
  opt.positional = absl::GetFlag(FLAGS_positional);
  opt.positional_shared_context = absl::GetFlag(FLAGS_shared_context);
  opt.positional_split_group = absl::GetFlag(FLAGS_split_group);
  opt.positional_split.chunk_keys = absl::GetFlag(FLAGS_chunk_keys);
  opt.positional_split.max_splits = absl::GetFlag(FLAGS_max_splits);
  opt.host_tree_mask = hmask.data();  // read by positional plans only
  if (absl::GetFlag(FLAGS_share_prefixes)) opt.host_kv_indices = perm.data();  // set 0's lists
  if (absl::GetFlag(FLAGS_min_split_tiles) >= 1) {
    opt.min_split_tiles = absl::GetFlag(FLAGS_min_split_tiles);
  }
  if (absl::GetFlag(FLAGS_split_overhead) >= 0) {
    opt.split_overhead_keys = absl::GetFlag(FLAGS_split_overhead);
  }
  auto plan = vc::PlanVerifyAttention(p, hqi.data(), hki.data(), dev, ws, opt);
  BENCH_OK(plan.status());
  BENCH_OK(vc::UploadVerifyAttentionPlan(*plan, ws, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));

  auto launch = [&](int it) {
    const int set = it % sets;
    p.q = static_cast<const uint16_t*>(q) + q_elems * set;
    p.kv_indices = idx + slots_per_set * set;
    return vc::VerifyAttentionCuda(p, *plan, ws);
  };
  const int warm = absl::GetFlag(FLAGS_warmup), iters = absl::GetFlag(FLAGS_iters);
  for (int i = 0; i < warm; ++i) BENCH_OK(launch(i));
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(ev[2 * i], stream));
    BENCH_OK(launch(warm + i));
    BENCH_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i)
    BENCH_CUDA(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  std::sort(ms.begin(), ms.end());
  for (auto& e : ev) cudaEventDestroy(e);

  // Graph replay: one captured graph runs every input set once (as a step captured by the
  // engine would); time per call = graph time / sets. Removes host launch latency, which
  // the eager numbers above include whenever the GPU drains the queue.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  absl::Status cap_status;
  for (int i = 0; i < sets && cap_status.ok(); ++i) cap_status = launch(i);
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  BENCH_OK(cap_status);
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
  const int reps = std::max(10, iters / sets);
  std::vector<cudaEvent_t> gev(2 * reps);
  for (auto& e : gev) BENCH_CUDA(cudaEventCreate(&e));
  for (int r = 0; r < reps; ++r) {
    BENCH_CUDA(cudaEventRecord(gev[2 * r], stream));
    BENCH_CUDA(cudaGraphLaunch(exec, stream));
    BENCH_CUDA(cudaEventRecord(gev[2 * r + 1], stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> gms(reps);
  for (int r = 0; r < reps; ++r) {
    BENCH_CUDA(cudaEventElapsedTime(&gms[r], gev[2 * r], gev[2 * r + 1]));
    gms[r] /= static_cast<float>(sets);
  }
  std::sort(gms.begin(), gms.end());
  for (auto& e : gev) cudaEventDestroy(e);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  res->shape = s;
  res->eager_ms = ms[iters / 2];
  res->ms = gms[reps / 2];
  res->sets = sets;
  const double bytes = static_cast<double>(s.B) * s.ctx * static_cast<double>(row_bytes);
  const double flops = static_cast<double>(s.B) * s.ctx * s.q * s.H * (576.0 + 512.0) * 2.0;
  res->gbps = bytes / (res->ms * 1e-3) / 1e9;
  res->tflops = flops / (res->ms * 1e-3) / 1e12;
  res->mem_floor_ms = bytes / (absl::GetFlag(FLAGS_copy_gbps) * 1e9) * 1e3;
  res->compute_floor_ms = flops / (absl::GetFlag(FLAGS_mma_tflops) * 1e12) * 1e3;
  res->pct = 100.0 * std::max(res->mem_floor_ms, res->compute_floor_ms) / res->ms;
  res->ctas = static_cast<int>(plan->work.size());
  res->max_splits = plan->max_splits;
  res->rows_per_cta = plan->rows_per_cta;
  res->shared_packs = plan->shared_packs;
  res->config = std::string(vc::VerifyKernelConfigName(plan->config)) +
                (plan->positional ? " positional" : "") +
                (plan->positional && opt.positional_shared_context ? " shared" : "");

  cudaStreamDestroy(stream);
  cudaFree(kv);
  cudaFree(idx);
  cudaFree(q);
  cudaFree(mask);
  cudaFree(out);
  cudaFree(lse);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto dev = vc::VerifyAttentionDeviceInfo::Query();
  BENCH_OK(dev.status());
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  const std::string cfg = absl::GetFlag(FLAGS_config);
  const absl::StatusOr<vc::VerifyKernelConfig> parsed =
      vc::ParseVerifyKernelConfig(cfg, "--config");
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed.status().message()).c_str());
    return 2;
  }
  const vc::VerifyKernelConfig config = *parsed;
  // Positional plans get the engine's batch-invariant workspace (more partials, index lists).
  auto ws = absl::GetFlag(FLAGS_positional)
                ? vc::VerifyAttentionWorkspace::Allocate(1 << 20, 1 << 16, int64_t{1} << 19,
                                                         1 << 16, int64_t{1} << 24)
                : vc::VerifyAttentionWorkspace::AllocateDefault(absl::GetFlag(FLAGS_staged_keys));
  BENCH_OK(ws.status());
  const std::string kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  if (kv_dtype != "bf16" && kv_dtype != "fp8") {
    std::fprintf(stderr, "--kv_dtype: '%s' is not bf16 or fp8\n", kv_dtype.c_str());
    return 2;
  }
  const bool kv_fp8 = kv_dtype == "fp8";

  std::printf(
      "device: %s, %d SMs, sm_%d%d; config %s; kv %s; floors: copy %.0f GB/s, bf16 %.0f "
      "TFLOP/s\n",
      prop.name, dev->num_sms, dev->cc_major, dev->cc_minor, cfg.c_str(), kv_dtype.c_str(),
      absl::GetFlag(FLAGS_copy_gbps), absl::GetFlag(FLAGS_mma_tflops));
  nlohmann::json gather_gbps = nullptr;  // random-order gather ceiling, when measured
  if (absl::GetFlag(FLAGS_gather_ceiling)) {
    // ~1.1 GB pool (many times L2): random slot order vs pool order.
    const int64_t rows = 1'000'000;
    void* pool = nullptr;
    int32_t* idx = nullptr;
    BENCH_CUDA(cudaMalloc(&pool, rows * 1152));
    BENCH_CUDA(cudaMemset(pool, 0x3c, rows * 1152));
    BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&idx), rows * 4));
    std::vector<int32_t> order(rows);
    std::iota(order.begin(), order.end(), 0);
    double seq = 0, rnd = 0;
    BENCH_CUDA(cudaMemcpy(idx, order.data(), rows * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(verifyd::bench::MeasureGatherGBps(pool, idx, rows, dev->num_sms, 10, &seq));
    std::shuffle(order.begin(), order.end(), std::mt19937_64(99));
    BENCH_CUDA(cudaMemcpy(idx, order.data(), rows * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(verifyd::bench::MeasureGatherGBps(pool, idx, rows, dev->num_sms, 10, &rnd));
    std::printf(
        "gather ceiling (1152-byte rows, 16-byte loads): pool order %.0f GB/s, "
        "random order %.0f GB/s\n",
        seq, rnd);
    gather_gbps = rnd;
    cudaFree(pool);
    cudaFree(idx);
  }
  std::vector<Result> results;
  const std::string only = absl::GetFlag(FLAGS_only);
  std::vector<Shape> shapes = Shapes();
  if (!absl::GetFlag(FLAGS_shapes).empty()) {
    shapes.clear();
    if (!ParseShapes(absl::GetFlag(FLAGS_shapes), &shapes)) return 2;
  }
  for (const Shape& s : shapes) {
    if (!only.empty() && s.Label().find(only) == std::string::npos) continue;
    Result r;
    if (RunShape(s, config, *dev, *ws, kv_fp8, &r) != 0) return 1;
    results.push_back(r);
  }
  int driver = 0, runtime = 0, sm_khz = 0, mem_khz = 0, dev_id = 0;
  BENCH_CUDA(cudaGetDevice(&dev_id));
  BENCH_CUDA(cudaDriverGetVersion(&driver));
  BENCH_CUDA(cudaRuntimeGetVersion(&runtime));
  BENCH_CUDA(cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, dev_id));
  BENCH_CUDA(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev_id));
  nlohmann::json j;
  j["bench"] = "verify_attention";
  j["impl"] = "verifyd";
  j["meta"] = {
      {"commit", absl::GetFlag(FLAGS_commit)},
      {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())},
      {"device", prop.name},
      {"cc", absl::StrCat(dev->cc_major, ".", dev->cc_minor)},
      {"num_sms", dev->num_sms},
      {"driver_version", driver},
      {"runtime_version", runtime},
      {"sm_clock_mhz", sm_khz / 1000},
      {"mem_clock_mhz", mem_khz / 1000},
      {"timing",
       "per-call time = median over replays of one CUDA graph that runs every rotated input "
       "set (>= 512 MB of KV in all) once, divided by the number of sets"},
      {"copy_gbps", absl::GetFlag(FLAGS_copy_gbps)},
      {"mma_tflops", absl::GetFlag(FLAGS_mma_tflops)},
      {"gather_ceiling_gbps", gather_gbps},
      {"kv_dtype", kv_dtype},
      {"positional", absl::GetFlag(FLAGS_positional)},
      {"positional_chunk_keys", absl::GetFlag(FLAGS_chunk_keys)},
      {"positional_max_splits", absl::GetFlag(FLAGS_max_splits)},
      {"positional_split_group", absl::GetFlag(FLAGS_split_group)},
  };
  j["results"] = nlohmann::json::array();
  std::printf(
      "\n| B | H | q | ctx | ms | eager ms | KV GB/s | TFLOP/s | mem floor ms | compute floor "
      "ms | %% of larger floor | CTAs | splits | rows/CTA | shared packs |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    const Shape& s = r.shape;
    std::printf(
        "| %d | %d | %d | %d | %.4f | %.4f | %.0f | %.1f | %.4f | %.4f | %.0f %% | %d | "
        "%d | %d | %d |\n",
        s.B, s.H, s.q, s.ctx, r.ms, r.eager_ms, r.gbps, r.tflops, r.mem_floor_ms,
        r.compute_floor_ms, r.pct, r.ctas, r.max_splits, r.rows_per_cta, r.shared_packs);
    j["results"].push_back({{"B", s.B},
                            {"H", s.H},
                            {"q", s.q},
                            {"ctx", s.ctx},
                            {"mask", "tree-chain"},
                            {"page_size", 1},
                            {"kv_dtype", kv_dtype},
                            {"config", r.config},
                            {"forks", absl::GetFlag(FLAGS_forks)},
                            {"shared_packs", r.shared_packs},
                            {"ms", r.ms},
                            {"eager_ms", r.eager_ms},
                            {"sets", r.sets},
                            {"ctas", r.ctas},
                            {"max_splits", r.max_splits},
                            {"gbps", r.gbps},
                            {"tflops", r.tflops},
                            {"mem_floor_ms", r.mem_floor_ms},
                            {"compute_floor_ms", r.compute_floor_ms},
                            {"pct_floor", r.pct}});
  }
  std::ofstream(absl::GetFlag(FLAGS_json)) << j.dump(2) << "\n";
  BENCH_OK(ws->Free());
  return 0;
}
