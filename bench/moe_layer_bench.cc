// moe_layer_bench: one MoE MLP layer at Kimi-K2's dimensions (hidden 7168, 384 routed experts,
// top-8, one shared expert, moe_intermediate 2048, sigmoid routing with the correction bias)
// on one GPU, at verify batch sizes (rows per step), with the time split into phases:
//   route    router GEMM (fp32) + top-k routing
//   permute  pairs grouped by expert + gather (and FP8 quantization) of the expert inputs
//   gate_up  the routed experts' [gate | up] GEMMs
//   swiglu   SwiGLU (and FP8 quantization)
//   down     the routed experts' down GEMMs
//   shared   the shared expert (bf16 cuBLAS: gate_up, SwiGLU, down)
//   combine  the weighted sum of each row's experts + shared
// for the engine's three expert modes (tp/cuda/rank_context.h) in the same run:
//   fp8_grouped      e4m3 weights + 128 x 128 block scales, CUTLASS grouped GEMMs, no host sync
//   fp8_grouped_m64  the same with 64-row tiles (ping-pong schedule)
//   bf16_grouped     bf16 weights, CUTLASS grouped GEMMs, no host sync
//   bf16_per_expert  bf16 weights, a host sync for the row counts, cuBLAS per non-empty expert
// The routed weights touched per step (the distinct experts chosen x 3 x hidden x inter) give
// the weight streaming rate (TB/s over gate_up + down); 2 x pairs x 3 x hidden x inter the
// expert FLOP rate (TFLOP/s over gate_up + down) against the tensor peak.
//
// Also, for the expert-parallel vs tensor-parallel choice at world 8 (--ep_world), the routed
// GEMM time one rank of 8 would spend: TP (every expert's 1/8 intermediate slice over all
// pairs) vs EP (48 whole experts over the pairs routed to them; the slowest of the 8 ranks).
// Communication is not timed on one GPU: the bytes each scheme moves per layer are printed.
//
// Timing: every phase is bracketed by CUDA events; per configuration the median over --iters
// runs after --warmup. Prints a table and writes JSON (--json). Never asserts on timings.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_cuda.h"
#include "bench/bench_util.h"
#include "bench/moe_fill.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/gemm.h"
#include "kernels/cuda/moe/grouped_gemm.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/moe/moe_mlp.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, rows, "1,8,64,256,1024,2048,8192",
          "rows per step (tokens verified; 8192: where the expert GEMMs turn compute-bound)");
ABSL_FLAG(std::string, modes, "fp8_grouped,fp8_grouped_m64,bf16_grouped,bf16_per_expert",
          "expert modes (fp8_grouped_m64: FP8 with 64-row tiles)");
ABSL_FLAG(bool, batch_invariant, true,
          "the engine's batch-invariant sequence (its default: the router kernel at every row "
          "count, the shared experts' GEMMs on gemm.h's checked row-class algorithms); false: "
          "the batch-adaptive one (cuBLAS router beyond 64 rows, cublasGemmEx)");
ABSL_FLAG(int64_t, hidden, 7168, "hidden size");
ABSL_FLAG(int64_t, experts, 384, "routed experts");
ABSL_FLAG(int64_t, top_k, 8, "experts per token");
ABSL_FLAG(int64_t, inter, 2048, "moe_intermediate_size");
ABSL_FLAG(int64_t, shared, 1, "shared experts");
ABSL_FLAG(int, ep_world, 8, "world size of the EP vs TP comparison (0: skip)");
ABSL_FLAG(int, warmup, 3, "untimed runs per configuration");
ABSL_FLAG(int, iters, 10, "timed runs per configuration (median)");
ABSL_FLAG(double, fp8_tflops, 1979, "dense FP8 tensor peak of the GPU (H200 SXM: 1979)");
ABSL_FLAG(double, bf16_tflops, 989, "dense BF16 tensor peak of the GPU (H200 SXM: 989)");
ABSL_FLAG(std::string, json, "", "write the results as JSON here");
ABSL_FLAG(std::string, commit, "unknown", "source revision recorded in the JSON meta");

namespace {

namespace kc = verifyd::kernels::cuda;
using bf16 = verifyd::kernels::bf16_bits;

template <typename T>
T* DevAlloc(int64_t n) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, std::max<int64_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

// The phases of kernels::cuda::RunMoeMlp, in its order (kPhases = kDone).
enum Phase { kRoute, kPermute, kGateUp, kSwiGlu, kDown, kShared, kCombine, kPhases };
static_assert(static_cast<int>(kc::MoePhase::kRoute) == kRoute &&
              static_cast<int>(kc::MoePhase::kCombine) == kCombine &&
              static_cast<int>(kc::MoePhase::kDone) == kPhases);
const char* kPhaseNames[kPhases] = {"route", "permute", "gate_up", "swiglu",
                                    "down",  "shared",  "combine"};

struct Dims {
  int64_t H, E, K, I, S, maxR;
};

// Device arrays of n random values (moe_fill.h), filled on the default stream.
float* RandomFloats(int64_t n, uint64_t seed, float lo, float hi) {
  float* p = DevAlloc<float>(n);
  BENCH_CUDA(verifyd::bench::FillFloat(p, n, seed, lo, hi));
  return p;
}
bf16* RandomBf16(int64_t n, uint64_t seed, float lo, float hi) {
  bf16* p = DevAlloc<bf16>(n);
  BENCH_CUDA(verifyd::bench::FillBf16(p, n, seed, lo, hi));
  return p;
}
uint8_t* RandomFp8(int64_t n, uint64_t seed) {
  uint8_t* p = DevAlloc<uint8_t>(n);
  BENCH_CUDA(verifyd::bench::FillFp8(p, n, seed));
  return p;
}

// The layer's weights (one copy each kind) and the activation buffers for maxR rows, as
// kernels::cuda::RunMoeMlp takes them (the grouped GEMMs are the mode's, set per run), and
// the layer's inputs and output.
struct Layer {
  Dims d;
  kc::MoeMlpWeights w;  // routed bf16 weights only when a bf16 mode runs
  kc::MoeMlpBuffers b;
  float* xf;   // [maxR, H] fp32: the router's input
  bf16* xn;    // [maxR, H]: the experts' input
  float* out;  // [maxR, H]
};

Layer MakeLayer(const Dims& d, bool want_bf16) {
  Layer L{};
  L.d = d;
  const int64_t H = d.H, E = d.E, I = d.I, P = d.maxR * d.K, R = d.maxR, S = d.S * d.I;
  kc::MoeMlpWeights& w = L.w;
  w.router = RandomFloats(E * H, 1, -0.02f, 0.02f);
  w.router_bias = RandomFloats(E, 2, -0.01f, 0.01f);
  w.gate_up_fp8 = RandomFp8(E * 2 * I * H, 3);
  w.down_fp8 = RandomFp8(E * H * I, 4);
  w.gate_up_scale = RandomFloats(E * 2 * I / 128 * H / 128, 5, 1e-3f, 4e-3f);
  w.down_scale = RandomFloats(E * H / 128 * I / 128, 6, 1e-3f, 4e-3f);
  if (want_bf16) {
    w.gate_up = RandomBf16(E * 2 * I * H, 7, -0.02f, 0.02f);
    w.down = RandomBf16(E * H * I, 8, -0.02f, 0.02f);
  }
  w.shared_gate_up = RandomBf16(2 * S * H, 9, -0.02f, 0.02f);
  w.shared_down = RandomBf16(H * S, 10, -0.02f, 0.02f);
  L.xf = RandomFloats(R * H, 11, -1.f, 1.f);
  L.xn = RandomBf16(R * H, 11, -1.f, 1.f);
  L.out = DevAlloc<float>(R * H);
  kc::MoeMlpBuffers& b = L.b;
  b.logits = DevAlloc<float>(R * E);
  b.weights = DevAlloc<float>(P);
  b.experts = DevAlloc<int32_t>(P);
  b.offsets = DevAlloc<int32_t>(E + 1);
  b.perm_rows = DevAlloc<int32_t>(P);
  b.pair_pos = DevAlloc<int32_t>(P);
  b.permute_ws = DevAlloc<int32_t>(kc::MoePermuteWorkspaceInts(P, static_cast<int>(E)));
  b.x = DevAlloc<bf16>(P * H);
  b.xq = DevAlloc<uint8_t>(P * H);
  b.xq_scale = DevAlloc<float>(P * H / 128);
  b.gate_up = DevAlloc<float>(std::max(P * 2 * I, R * 2 * S));
  b.act = DevAlloc<bf16>(std::max(P * I, R * S));
  b.actq = DevAlloc<uint8_t>(P * I);
  b.actq_scale = DevAlloc<float>(P * I / 128);
  b.y = DevAlloc<float>(P * H);
  b.shared = DevAlloc<float>(R * H);
  BENCH_CUDA(cudaMallocHost(reinterpret_cast<void**>(&b.offsets_host), (E + 1) * 4));
  BENCH_CUDA(cudaDeviceSynchronize());
  return L;
}

struct Timer {
  std::vector<cudaEvent_t> ev;
  cudaStream_t st;
  explicit Timer(cudaStream_t s) : st(s) {
    ev.resize(kPhases + 1);
    for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  }
  void Mark(int i) { BENCH_CUDA(cudaEventRecord(ev[i], st)); }
  std::vector<double> Read() {
    BENCH_CUDA(cudaEventSynchronize(ev[kPhases]));
    std::vector<double> ms(kPhases);
    for (int i = 0; i < kPhases; ++i) {
      float t = 0;
      BENCH_CUDA(cudaEventElapsedTime(&t, ev[i], ev[i + 1]));
      ms[i] = t;
    }
    return ms;
  }
};

// One layer in `mode` for R rows through kernels::cuda::RunMoeMlp (the engine's sequence),
// each phase's start recorded as an event.
void RunLayer(const std::string& mode, Layer& L, int64_t R, cudaStream_t st, void* cublas,
              kc::GroupedGemm* g_gu, kc::GroupedGemm* g_dn, Timer& t) {
  const Dims& d = L.d;
  kc::MoeMlpArgs a;
  a.shape.rows = R;
  a.shape.hidden = d.H;
  a.shape.num_experts = static_cast<int>(d.E);
  a.shape.top_k = static_cast<int>(d.K);
  a.shape.routed_scaling_factor = 2.827f;
  a.shape.inter = d.I;
  a.shape.shared_inter = d.S * d.I;
  a.path = mode.rfind("fp8", 0) == 0 ? kc::ExpertPath::kFp8Grouped
           : mode == "bf16_grouped"  ? kc::ExpertPath::kBf16Grouped
                                     : kc::ExpertPath::kBf16PerExpert;
  a.weights = L.w;
  a.buffers = L.b;
  a.buffers.gemm_gate_up = g_gu;
  a.buffers.gemm_down = g_dn;
  a.x_router = L.xf;
  a.xn = L.xn;
  a.out = L.out;
  a.ld_out = d.H;
  a.cublas = cublas;
  a.stream = st;
  a.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  a.host_sync = [st] {
    const cudaError_t e = cudaStreamSynchronize(st);
    return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
  };
  a.mark = [&t](kc::MoePhase phase) { t.Mark(static_cast<int>(phase)); };
  BENCH_OK(kc::RunMoeMlp(a));
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// d = a . b^T per group of `g` (e4m3 operands with their block scales); the groups' rows from
// the device offsets.
absl::Status RunFp8Grouped(kc::GroupedGemm& g, const int32_t* offsets, const uint8_t* a,
                           const float* a_scale, const uint8_t* b, const float* b_scale, float* d,
                           cudaStream_t st) {
  return g.Run(kc::GroupedGemmArgs{offsets, a, a_scale, b, b_scale, d, st});
}

// Time of grouped GEMM pair (gate_up + down) for given per-group offsets (device copy made
// here), input rows from the layer's buffers; median ms.
double TimeGroupedPair(kc::GroupedGemm& gu, kc::GroupedGemm& dn, const std::vector<int32_t>& off,
                       Layer& L, cudaStream_t st, int warmup, int iters) {
  int32_t* d_off = DevAlloc<int32_t>(off.size());
  BENCH_CUDA(cudaMemcpy(d_off, off.data(), off.size() * 4, cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  std::vector<double> ms;
  for (int it = 0; it < warmup + iters; ++it) {
    BENCH_CUDA(cudaEventRecord(e0, st));
    BENCH_OK(RunFp8Grouped(gu, d_off, L.b.xq, L.b.xq_scale, L.w.gate_up_fp8, L.w.gate_up_scale,
                           L.b.gate_up, st));
    BENCH_OK(RunFp8Grouped(dn, d_off, L.b.actq, L.b.actq_scale, L.w.down_fp8, L.w.down_scale, L.b.y,
                           st));
    BENCH_CUDA(cudaEventRecord(e1, st));
    BENCH_CUDA(cudaEventSynchronize(e1));
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, e0, e1));
    if (it >= warmup) ms.push_back(t);
  }
  cudaFree(d_off);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return Median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int dev = 0;
  BENCH_CUDA(cudaSetDevice(dev));
  if (!kc::GroupedGemmAvailable(dev)) {
    std::fprintf(stderr, "moe_layer_bench: needs an sm_90 GPU and a CUTLASS build\n");
    return 1;
  }
  const std::vector<int> rows = verifyd::bench::ParseIntList<int>(
      absl::GetFlag(FLAGS_rows), verifyd::bench::ListEntries::kPositiveOrExit);
  const std::vector<std::string> modes =
      absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty());
  Dims d{absl::GetFlag(FLAGS_hidden), absl::GetFlag(FLAGS_experts),
         absl::GetFlag(FLAGS_top_k),  absl::GetFlag(FLAGS_inter),
         absl::GetFlag(FLAGS_shared), *std::max_element(rows.begin(), rows.end())};
  const bool want_bf16 = std::any_of(modes.begin(), modes.end(),
                                     [](const std::string& m) { return m.rfind("bf16", 0) == 0; });
  Layer L = MakeLayer(d, want_bf16);
  cudaStream_t st;
  BENCH_CUDA(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cublasHandle_t cublas;
  if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(cublas, st);
  void* cublas_ws = DevAlloc<char>(32 << 20);
  cublasSetWorkspace(cublas, cublas_ws, 32 << 20);
  if (absl::GetFlag(FLAGS_batch_invariant)) {
    int64_t max_rows = 1;
    for (const int r : rows) max_rows = std::max<int64_t>(max_rows, r);
    BENCH_OK(kc::EnableFixedGemmAlgorithms(cublas, cublas_ws, 32 << 20, max_rows));
  }
  const int E = static_cast<int>(d.E);
  auto make = [&](kc::GroupedGemmKind kind, int groups, int64_t n, int64_t k, int tile_m = 128) {
    auto g = kc::GroupedGemm::Create({kind, groups, n, k, dev, tile_m});
    BENCH_OK(g.status());
    return std::move(*g);
  };
  auto fp8_gu = make(kc::GroupedGemmKind::kFp8Block128, E, 2 * d.I, d.H);
  auto fp8_dn = make(kc::GroupedGemmKind::kFp8Block128, E, d.H, d.I);
  auto fp8_gu64 = make(kc::GroupedGemmKind::kFp8Block128, E, 2 * d.I, d.H, 64);
  auto fp8_dn64 = make(kc::GroupedGemmKind::kFp8Block128, E, d.H, d.I, 64);
  std::unique_ptr<kc::GroupedGemm> bf_gu, bf_dn;
  if (want_bf16) {
    bf_gu = make(kc::GroupedGemmKind::kBf16, E, 2 * d.I, d.H);
    bf_dn = make(kc::GroupedGemmKind::kBf16, E, d.H, d.I);
  }
  const int warmup = absl::GetFlag(FLAGS_warmup), iters = absl::GetFlag(FLAGS_iters);
  nlohmann::json results = nlohmann::json::array();
  Timer timer(st);
  std::printf(
      "\n| mode | rows | experts hit | total ms | route | permute | gate_up | swiglu | down | "
      "shared | combine | weight TB/s | expert TFLOP/s | %% of peak |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int R : rows) {
    for (const std::string& mode : modes) {
      kc::GroupedGemm* g_gu = mode == "fp8_grouped"       ? fp8_gu.get()
                              : mode == "fp8_grouped_m64" ? fp8_gu64.get()
                                                          : bf_gu.get();
      kc::GroupedGemm* g_dn = mode == "fp8_grouped"       ? fp8_dn.get()
                              : mode == "fp8_grouped_m64" ? fp8_dn64.get()
                                                          : bf_dn.get();
      std::vector<std::vector<double>> runs;
      for (int it = 0; it < warmup + iters; ++it) {
        RunLayer(mode, L, R, st, cublas, g_gu, g_dn, timer);
        std::vector<double> ms = timer.Read();
        if (it >= warmup) runs.push_back(ms);
      }
      std::vector<double> phase(kPhases);
      double total = 0;
      for (int p = 0; p < kPhases; ++p) {
        std::vector<double> v;
        for (auto& r : runs) v.push_back(r[p]);
        phase[p] = Median(v);
      }
      {
        std::vector<double> v;
        for (auto& r : runs) {
          double s = 0;
          for (double x : r) s += x;
          v.push_back(s);
        }
        total = Median(v);
      }
      // Experts hit: from the offsets of the last run.
      std::vector<int32_t> off(d.E + 1);
      BENCH_CUDA(cudaMemcpy(off.data(), L.b.offsets, off.size() * 4, cudaMemcpyDeviceToHost));
      int hit = 0;
      for (int64_t e = 0; e < d.E; ++e) hit += off[e + 1] > off[e];
      const bool is_fp8 = mode.rfind("fp8", 0) == 0;
      const double elt = is_fp8 ? 1.0 : 2.0;
      const double wbytes = hit * 3.0 * d.H * d.I * elt;
      const double gemm_ms = phase[kGateUp] + phase[kSwiGlu] + phase[kDown];
      const double gemm_only = mode == "bf16_per_expert" ? gemm_ms : phase[kGateUp] + phase[kDown];
      const double flops = 2.0 * R * d.K * 3.0 * d.H * d.I;
      const double tbps = wbytes / (gemm_only * 1e-3) / 1e12;
      const double tflops = flops / (gemm_only * 1e-3) / 1e12;
      const double peak =
          is_fp8 ? absl::GetFlag(FLAGS_fp8_tflops) : absl::GetFlag(FLAGS_bf16_tflops);
      std::printf(
          "| %s | %d | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f | %.0f | "
          "%.0f %% |\n",
          mode.c_str(), R, hit, total, phase[kRoute], phase[kPermute], phase[kGateUp],
          phase[kSwiGlu], phase[kDown], phase[kShared], phase[kCombine], tbps, tflops,
          100.0 * tflops / peak);
      nlohmann::json j = {{"mode", mode},       {"rows", R},           {"experts_hit", hit},
                          {"total_ms", total},  {"weight_tbps", tbps}, {"expert_tflops", tflops},
                          {"peak_tflops", peak}};
      for (int p = 0; p < kPhases; ++p) j["phase_ms"][kPhaseNames[p]] = phase[p];
      results.push_back(j);
    }
  }
  std::fflush(stdout);

  // EP vs TP at world W: one rank's routed FP8 GEMM time for the same routing.
  nlohmann::json ep_tp = nlohmann::json::array();
  const int W = absl::GetFlag(FLAGS_ep_world);
  if (W > 1 && d.E % W == 0 && d.I % (128 * W) == 0) {
    const int El = E / W;
    auto tp_gu = make(kc::GroupedGemmKind::kFp8Block128, E, 2 * d.I / W, d.H);
    auto tp_dn = make(kc::GroupedGemmKind::kFp8Block128, E, d.H, d.I / W);
    auto ep_gu = make(kc::GroupedGemmKind::kFp8Block128, El, 2 * d.I, d.H);
    auto ep_dn = make(kc::GroupedGemmKind::kFp8Block128, El, d.H, d.I);
    std::printf(
        "\n| rows | TP%d rank: routed GEMMs ms | EP%d slowest rank ms | EP%d mean rank ms | "
        "TP all-reduce bytes/rank | EP dispatch+combine bytes/rank |\n|---|---|---|---|---|---|\n",
        W, W, W);
    for (int R : rows) {
      RunLayer("fp8_grouped", L, R, st, cublas, fp8_gu.get(), fp8_dn.get(), timer);
      BENCH_CUDA(cudaStreamSynchronize(st));
      std::vector<int32_t> off(d.E + 1);
      BENCH_CUDA(cudaMemcpy(off.data(), L.b.offsets, off.size() * 4, cudaMemcpyDeviceToHost));
      const double tp_ms = TimeGroupedPair(*tp_gu, *tp_dn, off, L, st, warmup, iters);
      // EP: rank r owns experts [r El, (r + 1) El); its rows are a prefix-shifted slice. The
      // grouped GEMM reads a from row 0, so each rank's pairs are timed as rows 0.. of the
      // buffers (same sizes, same weights per group count).
      double worst = 0, sum = 0;
      for (int r = 0; r < W; ++r) {
        std::vector<int32_t> local(El + 1);
        for (int e = 0; e <= El; ++e) local[e] = off[r * El + e] - off[r * El];
        const double ms = TimeGroupedPair(*ep_gu, *ep_dn, local, L, st, warmup, iters);
        worst = std::max(worst, ms);
        sum += ms;
      }
      // Bytes per rank per layer: TP ring all-reduce of [R, H] fp32 partial sums moves
      // 2 (W - 1) / W of it; EP sends each pair's bf16 input to its expert's rank and its fp32
      // output back ((W - 1) / W of the pairs leave the rank on uniform routing).
      const double ar = 2.0 * (W - 1) / W * R * d.H * 4;
      const double a2a = static_cast<double>(W - 1) / W * R * d.K * d.H * (2 + 4) / W;
      std::printf("| %d | %.3f | %.3f | %.3f | %.0f | %.0f |\n", R, tp_ms, worst, sum / W, ar, a2a);
      ep_tp.push_back({{"rows", R},
                       {"world", W},
                       {"tp_rank_ms", tp_ms},
                       {"ep_worst_rank_ms", worst},
                       {"ep_mean_rank_ms", sum / W},
                       {"tp_allreduce_bytes_per_rank", ar},
                       {"ep_a2a_bytes_per_rank", a2a}});
    }
  }

  if (!absl::GetFlag(FLAGS_json).empty()) {
    cudaDeviceProp prop;
    BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
    int driver = 0, runtime = 0;
    BENCH_CUDA(cudaDriverGetVersion(&driver));
    BENCH_CUDA(cudaRuntimeGetVersion(&runtime));
    nlohmann::json j;
    j["bench"] = "moe_layer";
    j["meta"] = {
        {"commit", absl::GetFlag(FLAGS_commit)},
        {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())},
        {"device", prop.name},
        {"num_sms", prop.multiProcessorCount},
        {"batch_invariant", absl::GetFlag(FLAGS_batch_invariant)},
        {"driver_version", driver},
        {"runtime_version", runtime},
        {"dims",
         {{"hidden", d.H}, {"experts", d.E}, {"top_k", d.K}, {"inter", d.I}, {"shared", d.S}}},
        {"timing", "CUDA events around each phase; median over iters after warmup"}};
    j["results"] = results;
    j["ep_vs_tp"] = ep_tp;
    std::ofstream(absl::GetFlag(FLAGS_json)) << j.dump(1) << "\n";
  }
  return 0;
}
