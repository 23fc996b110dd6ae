// gemm_invariance: is a GEMM row's result independent of how many rows the call has? For the
// engine's bf16 projections (y[m, n] = x[m, k] . w[n, k]^T, fp32 out) it runs the same x (row
// 0 fixed) at several m and compares row 0 bit for bit with the m = 1 result, for
//   cublas         cublasGemmEx with CUBLAS_GEMM_DEFAULT (what the engine calls today)
//   cublaslt_pin   cuBLASLt with one algorithm for every m: the heuristic's first choice at
//                  m = --pin_m, split-K forced off
//   cutlass        the grouped GEMM of kernels/cuda/moe/grouped_gemm.h with one group
//   verifyd        GemmBf16 on a batch-invariant handle (gemm.h: the reference algorithm plus
//                  row classes checked bit-equal to it on this device): what the engine runs
// and times each at each m (median of --iters after 2 warm-ups), then prints the row-class
// choices (which heuristic candidate each class took, how many were bit-equal).
// The measurement behind the batch-invariance work (docs/PERF.md); it never fails on a
// difference. Prints a table and writes JSON (--json).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "kernels/common.h"
#include "kernels/cuda/dense/gemm.h"
#include "kernels/cuda/moe/grouped_gemm.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, shapes, "1536x7168,7168x8192,4096x7168",
          "n x k shapes (Kimi-K2: q_a_proj, o_proj, a dense gate_up slice)");
ABSL_FLAG(std::string, rows, "1,9,17,64,65,128,545,2080,4160", "row counts m");
ABSL_FLAG(int, pin_m, 64, "row count whose heuristic choice cublaslt_pin keeps");
ABSL_FLAG(int, iters, 10, "timed runs per (implementation, m)");
ABSL_FLAG(std::string, json, "", "write the results as JSON here");
ABSL_FLAG(std::string, commit, "unknown", "source revision recorded in the JSON meta");

namespace {

namespace kc = verifyd::kernels::cuda;

#define CHECK_OR_DIE(cond, what)                                  \
  do {                                                            \
    if (!(cond)) {                                                \
      std::fprintf(stderr, "gemm_invariance: %s failed\n", what); \
      std::exit(1);                                               \
    }                                                             \
  } while (0)

uint16_t Bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<int64_t> rows = verifyd::bench::ParseIntList(
      absl::GetFlag(FLAGS_rows), verifyd::bench::ListEntries::kPositive);
  CHECK_OR_DIE(!rows.empty(), "--rows");
  int64_t max_m = 0;
  for (int64_t m : rows) max_m = std::max(max_m, m);
  cublasHandle_t blas;
  CHECK_OR_DIE(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
  cublasLtHandle_t lt;
  CHECK_OR_DIE(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
  const size_t ws_bytes = size_t{64} << 20;
  void* ws = nullptr;
  CHECK_OR_DIE(cudaMalloc(&ws, ws_bytes) == cudaSuccess, "cudaMalloc");
  nlohmann::json results = nlohmann::json::array();
  cublasHandle_t fixed;
  CHECK_OR_DIE(cublasCreate(&fixed) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
  void* fixed_ws = nullptr;
  CHECK_OR_DIE(cudaMalloc(&fixed_ws, ws_bytes) == cudaSuccess, "cudaMalloc");
  CHECK_OR_DIE(kc::EnableFixedGemmAlgorithms(fixed, fixed_ws, ws_bytes, max_m).ok(),
               "EnableFixedGemmAlgorithms");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::printf(
      "row-0 outputs (of n) whose bits differ from the m = 1 call; time per call in us\n"
      "| n x k | m | cublas | cublaslt_pin | cutlass | verifyd |\n"
      "|---|---|---|---|---|---|\n");
  for (absl::string_view shape : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',')) {
    std::vector<std::string> nk = absl::StrSplit(shape, 'x');
    int64_t n = 0, k = 0;
    CHECK_OR_DIE(nk.size() == 2 && absl::SimpleAtoi(nk[0], &n) && absl::SimpleAtoi(nk[1], &k),
                 "--shapes");
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> x(max_m * k), w(n * k);
    for (auto& v : x) v = Bf16(nd(rng));
    for (auto& v : w) v = Bf16(nd(rng) * 0.02f);
    void *dx = nullptr, *dw = nullptr, *dy = nullptr;
    int32_t* doff = nullptr;
    CHECK_OR_DIE(cudaMalloc(&dx, x.size() * 2) == cudaSuccess, "cudaMalloc x");
    CHECK_OR_DIE(cudaMalloc(&dw, w.size() * 2) == cudaSuccess, "cudaMalloc w");
    CHECK_OR_DIE(cudaMalloc(&dy, max_m * n * 4) == cudaSuccess, "cudaMalloc y");
    CHECK_OR_DIE(cudaMalloc(reinterpret_cast<void**>(&doff), 8) == cudaSuccess,
                 "cudaMalloc offsets");
    cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
    const float alpha = 1.f, beta = 0.f;
    auto row0 = [&] {
      std::vector<float> r(n);
      cudaDeviceSynchronize();
      cudaMemcpy(r.data(), dy, n * 4, cudaMemcpyDeviceToHost);
      return r;
    };
    // cublas
    auto run_cublas = [&](int64_t m) {
      return cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, dw, CUDA_R_16BF, k, dx,
                          CUDA_R_16BF, k, &beta, dy, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
    };
    // cublaslt_pin: one algorithm from the heuristic at pin_m, split-K off.
    cublasLtMatmulDesc_t op;
    CHECK_OR_DIE(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == 0, "desc");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    auto layouts = [&](int64_t m, cublasLtMatrixLayout_t* a, cublasLtMatrixLayout_t* b,
                       cublasLtMatrixLayout_t* c) {
      cublasLtMatrixLayoutCreate(a, CUDA_R_16BF, k, n, k);
      cublasLtMatrixLayoutCreate(b, CUDA_R_16BF, k, m, k);
      cublasLtMatrixLayoutCreate(c, CUDA_R_32F, n, m, n);
    };
    cublasLtMatmulAlgo_t algo;
    {
      cublasLtMatrixLayout_t a, b, c;
      layouts(absl::GetFlag(FLAGS_pin_m), &a, &b, &c);
      cublasLtMatmulPreference_t pref;
      cublasLtMatmulPreferenceCreate(&pref);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                           &ws_bytes, sizeof(ws_bytes));
      cublasLtMatmulHeuristicResult_t res[1];
      int got = 0;
      CHECK_OR_DIE(
          cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 1, res, &got) == 0 && got > 0,
          "cuBLASLt heuristic");
      algo = res[0].algo;
      const int32_t splitk = 1;
      const uint32_t red = CUBLASLT_REDUCTION_SCHEME_NONE;
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                           sizeof(splitk));
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                           sizeof(red));
    }
    auto run_lt = [&](int64_t m) {
      cublasLtMatrixLayout_t a, b, c;
      layouts(m, &a, &b, &c);
      return cublasLtMatmul(lt, op, &alpha, dw, a, dx, b, &beta, dy, c, dy, c, &algo, ws, ws_bytes,
                            nullptr) == CUBLAS_STATUS_SUCCESS;
    };
    // cutlass: the grouped GEMM with one group of m rows.
    auto grouped = kc::GroupedGemm::Create({kc::GroupedGemmKind::kBf16, 1, n, k, 0, 128});
    auto run_cutlass = [&](int64_t m) {
      if (!grouped.ok()) return false;
      const int32_t off[2] = {0, static_cast<int32_t>(m)};
      cudaMemcpy(doff, off, 8, cudaMemcpyHostToDevice);
      kc::GroupedGemmArgs g;
      g.offsets = doff;
      g.a = dx;
      g.b = dw;
      g.d = static_cast<float*>(dy);
      return (*grouped)->Run(g).ok();
    };
    auto run_verifyd = [&](int64_t m) {
      return kc::GemmBf16Packed(fixed, m, static_cast<const verifyd::kernels::bf16_bits*>(dx), k,
                                static_cast<const verifyd::kernels::bf16_bits*>(dw), n, dy)
          .ok();
    };
    struct Impl {
      const char* name;
      std::function<bool(int64_t)> run;
      std::vector<float> ref;
    };
    std::vector<Impl> impls = {{"cublas", run_cublas, {}},
                               {"cublaslt_pin", run_lt, {}},
                               {"cutlass", run_cutlass, {}},
                               {"verifyd", run_verifyd, {}}};
    auto time_us = [&](Impl& im, int64_t m) {
      for (int i = 0; i < 2; ++i) im.run(m);
      std::vector<float> t;
      for (int i = 0; i < absl::GetFlag(FLAGS_iters); ++i) {
        cudaEventRecord(e0, nullptr);
        im.run(m);
        cudaEventRecord(e1, nullptr);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t.push_back(ms * 1000.f);
      }
      std::sort(t.begin(), t.end());
      return t.empty() ? 0.0 : static_cast<double>(t[t.size() / 2]);
    };
    for (Impl& im : impls) {
      if (im.run(1)) im.ref = row0();
    }
    for (int64_t m : rows) {
      std::printf("| %lldx%lld | %lld |", static_cast<long long>(n), static_cast<long long>(k),
                  static_cast<long long>(m));
      nlohmann::json j = {{"n", n}, {"k", k}, {"m", m}};
      for (Impl& im : impls) {
        if (im.ref.empty() || !im.run(m)) {
          std::printf(" unsupported |");
          j[im.name] = nullptr;
          continue;
        }
        const std::vector<float> got = row0();
        int64_t changed = 0;
        for (int64_t i = 0; i < n; ++i) changed += std::memcmp(&got[i], &im.ref[i], 4) != 0;
        const double us = time_us(im, m);
        std::printf(" %lld, %.1f us |", static_cast<long long>(changed), us);
        j[im.name] = changed;
        j[std::string(im.name) + "_us"] = us;
      }
      std::printf("\n");
      results.push_back(j);
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
    cudaFree(doff);
    cublasLtMatmulDescDestroy(op);
  }
  nlohmann::json choices = nlohmann::json::array();
  std::printf(
      "\nverifyd row classes (candidate 0 = the reference algorithm)\n"
      "| n x k | up to m | rows tested | candidates | bit-equal | chosen | reference us | chosen "
      "us "
      "|\n|---|---|---|---|---|---|---|---|\n");
  for (const kc::GemmRowClassChoice& c : kc::FixedGemmChoices(fixed)) {
    std::printf("| %lldx%lld | %lld | %lld | %d | %d | %d | %.1f | %.1f |\n",
                static_cast<long long>(c.n), static_cast<long long>(c.k),
                static_cast<long long>(c.max_m), static_cast<long long>(c.rows_tested),
                c.tested_candidates, c.equal_candidates, c.candidate, c.ms_reference * 1000,
                c.ms_chosen * 1000);
    choices.push_back({{"n", c.n},
                       {"k", c.k},
                       {"max_m", c.max_m},
                       {"rows_tested", c.rows_tested},
                       {"candidates", c.tested_candidates},
                       {"bit_equal", c.equal_candidates},
                       {"chosen", c.candidate},
                       {"reference_us", c.ms_reference * 1000},
                       {"chosen_us", c.ms_chosen * 1000}});
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    nlohmann::json j;
    j["bench"] = "gemm_invariance";
    j["meta"] = {{"commit", absl::GetFlag(FLAGS_commit)},
                 {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())},
                 {"device", prop.name},
                 {"pin_m", absl::GetFlag(FLAGS_pin_m)},
                 {"iters", absl::GetFlag(FLAGS_iters)},
                 {"counts",
                  "row-0 outputs (of n) whose bits differ from the m = 1 call; *_us: "
                  "median time per call"}};
    j["results"] = results;
    j["row_classes"] = choices;
    std::ofstream(absl::GetFlag(FLAGS_json)) << j.dump(1) << "\n";
  }
  return 0;
}
