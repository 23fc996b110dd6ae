// One MoE MLP's launch sequence on one GPU (DeepSeek-V3 / Kimi-K2), shared by the CUDA
// engine's MoE layer (tp/cuda/moe_layer.cc) and bench/moe_layer_bench, so that the benchmark
// times exactly what the engine runs:
//
//   route    router logits in fp32 (MoeRouterLogitsCuda up to kMoeRouterKernelMaxRows rows,
//            cuBLAS GemmF32 beyond) and MoeRouteCuda -> experts, weights [rows, K]
//   permute  MoePermuteCuda: the (row, k) pairs grouped by expert (offsets on the device),
//            then the expert inputs gathered (and, for FP8, quantized per 128 columns)
//   gate_up  the routed experts' [gate | up] projections over their rows
//   swiglu   SwiGLU (and, for FP8, quantized per 128 columns)
//   down     the routed experts' down projections into y
//   shared   the shared experts over every row: bf16 cuBLAS, or (FP8 shared weights)
//            RunFp8Mlp below
//   combine  MoeCombineCuda: per row, weight x expert output in ascending expert index, +
//            shared; into out (or added to it)
//
// Expert paths (ExpertPath):
//   kFp8Grouped     e4m3 weights with 128 x 128 block scales, activations quantized per 128
//                   columns (W8A8), one grouped GEMM per projection (grouped_gemm.h); needs
//                   hidden and inter multiples of 128 and an sm_90 GPU.
//   kBf16Grouped    bf16 weights and activations, one grouped GEMM per projection (sm_90).
//   kBf16PerExpert  bf16; host_sync() after the permutation (the per-expert row counts go to
//                   the host), then one cuBLAS GEMM triple per non-empty expert.
// The grouped paths never wait for the host: their launch sequence is fixed (graph-safe).
//
// Host header (no CUDA code). Thread-safety: one call at a time per buffer set.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "kernels/common.h"
#include "kernels/cuda/fp8/fp8_gemm.h"
#include "kernels/cuda/moe/grouped_gemm.h"

namespace verifyd::kernels::cuda {

enum class ExpertPath { kFp8Grouped, kBf16Grouped, kBf16PerExpert };
const char* ExpertPathName(ExpertPath p);  // "fp8 block-scaled grouped GEMMs", ...

enum class MoePhase { kRoute, kPermute, kGateUp, kSwiGlu, kDown, kShared, kCombine, kDone };

struct MoeMlpShape {
  int64_t rows = 0;     // R
  int64_t hidden = 0;   // H
  int num_experts = 0;  // E (every routed expert; this GPU holds a slice of each)
  int top_k = 0;        // K
  int n_group = 1;      // routing groups
  int topk_group = 1;   // groups kept
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.f;
  int64_t inter = 0;         // this GPU's columns of a routed expert's intermediate (0: none)
  int64_t shared_inter = 0;  // this GPU's columns of the shared experts' intermediate (0: none)
  // The routed experts this GPU holds: [expert_begin, expert_begin + local_experts) (expert
  // parallelism), or every expert (local_experts < 0, the default: tensor-parallel experts,
  // a slice of each). Routing and the permutation always cover every expert; the gathers,
  // GEMMs and SwiGLU run only on the local experts' pairs; the combine sums only them.
  int expert_begin = 0;
  int local_experts = -1;
};

// One layer's weights on this GPU (row-major, the checkpoint's [out, in] layout); "E" of the
// routed experts' arrays is the local expert count.
struct MoeMlpWeights {
  const float* router = nullptr;       // [E, H] fp32
  const float* router_bias = nullptr;  // [E] fp32 e_score_correction_bias
  // Routed experts, bf16 paths: [E, 2 inter, H] ([gate rows | up rows]) and [E, H, inter].
  const bf16_bits* gate_up = nullptr;
  const bf16_bits* down = nullptr;
  // kFp8Grouped: the same as e4m3 bytes, with scales [E, 2 inter / 128, H / 128] and
  // [E, H / 128, inter / 128].
  const uint8_t* gate_up_fp8 = nullptr;
  const float* gate_up_scale = nullptr;
  const uint8_t* down_fp8 = nullptr;
  const float* down_scale = nullptr;
  // Shared experts: [2 shared_inter, H] and [H, shared_inter], or null.
  const bf16_bits* shared_gate_up = nullptr;
  const bf16_bits* shared_down = nullptr;
  // ... or as e4m3 bytes with 128 x 128 block scales (used when set; RunFp8Mlp).
  const uint8_t* shared_gate_up_fp8 = nullptr;
  const float* shared_gate_up_scale = nullptr;
  const uint8_t* shared_down_fp8 = nullptr;
  const float* shared_down_scale = nullptr;
};

// Scratch for up to R rows (P = R * K pairs); device memory unless noted.
struct MoeMlpBuffers {
  float* logits = nullptr;          // [R, E]
  int32_t* experts = nullptr;       // [R, K]
  float* weights = nullptr;         // [R, K]
  int32_t* offsets = nullptr;       // [E + 1]
  int32_t* perm_rows = nullptr;     // [P]
  int32_t* pair_pos = nullptr;      // [P]
  int32_t* permute_ws = nullptr;    // [MoePermuteWorkspaceInts(P, E)]
  bf16_bits* x = nullptr;           // [P, H] gathered inputs (bf16 paths)
  uint8_t* xq = nullptr;            // [P, H] e4m3 (kFp8Grouped)
  float* xq_scale = nullptr;        // [P, H / 128]
  float* gate_up = nullptr;         // [max(P * 2 inter, R * 2 shared_inter)]
  bf16_bits* act = nullptr;         // [max(P * inter, R * shared_inter)] (bf16 paths and shared)
  uint8_t* actq = nullptr;          // [P, inter] e4m3 (kFp8Grouped)
  float* actq_scale = nullptr;      // [P, inter / 128]
  float* y = nullptr;               // [P, H] routed expert outputs
  float* shared = nullptr;          // [R, H]
  int32_t* offsets_host = nullptr;  // pinned [E + 1] (kBf16PerExpert)
  // Grouped paths: the GEMMs of shape (local experts, 2 inter, H) and (local experts, H,
  // inter) of the path's kind.
  GroupedGemm* gemm_gate_up = nullptr;
  GroupedGemm* gemm_down = nullptr;
  // FP8 shared experts: one-group kFp8Block128 GEMMs (2 shared_inter, H) and (H,
  // shared_inter), their offsets (device {0, R}, written by the caller: RunFp8Mlp), and the
  // quantized inputs / SwiGLU outputs.
  GroupedGemm* shared_gemm_gate_up = nullptr;
  GroupedGemm* shared_gemm_down = nullptr;
  const int32_t* shared_offsets = nullptr;
  Fp8BlockGemmLt* shared_lt = nullptr;  // optional: RunFp8Mlp's `lt`
  uint8_t* shared_xq = nullptr;         // [R, H]
  float* shared_xq_scale = nullptr;     // [R, H / 128]
  uint8_t* shared_actq = nullptr;       // [R, shared_inter]
  float* shared_actq_scale = nullptr;   // [R, shared_inter / 128]
};

struct MoeMlpArgs {
  MoeMlpShape shape;
  ExpertPath path = ExpertPath::kBf16PerExpert;
  MoeMlpWeights weights;
  MoeMlpBuffers buffers;
  const float* x_router = nullptr;  // [R, H] fp32: the router's input (post-attention norm)
  const bf16_bits* xn = nullptr;    // [R, H] bf16: the experts' input (the same norm)
  float* out = nullptr;             // [R, ld_out] fp32
  int64_t ld_out = 0;
  bool accumulate = false;  // out += MoE(x) instead of out = MoE(x)
  void* cublas = nullptr;   // cublasHandle_t bound to `stream`
  void* stream = nullptr;   // cudaStream_t
  // kBf16PerExpert: waits until the stream has run everything enqueued (the offsets copy).
  std::function<absl::Status()> host_sync;
  // Optional: called as each phase starts (and with kDone at the end), on the host, in order.
  std::function<void(MoePhase)> mark;
  // The router kernel at every row count (not cuBLAS beyond kMoeRouterKernelMaxRows): a row's
  // logits then do not depend on the number of rows.
  bool batch_invariant = false;
};

// Enqueues the whole MLP on args.stream (kBf16PerExpert also waits once, in host_sync).
absl::Status RunMoeMlp(const MoeMlpArgs& args);

// FP8 linears and MLPs: weights that stay in FP8 (DeepSeek-V3's e4m3 with 128 x 128 block
// scales) on sm_90, W8A8 as the routed experts' kFp8Grouped path. `offsets` is the one group's
// device {0, rows}: SingleGroupOffsetsCuda (moe.h) writes it; an engine step writes it once
// for all its FP8 linears (rows is fixed within a step), so these enqueue no extra launch.
// Each GEMM runs through cuBLASLt when `lt` is set (fp8/fp8_gemm.h: faster when few rows leave
// the grouped kernel's n / 128 tiles short of the SMs, but its algorithm follows the row
// count), else through the grouped kernel, where a row's result does not depend on the other
// rows (its tiles never split k): batch-invariant steps leave `lt` null. The GroupedGemm
// gives the GEMM's shape either way. With `lt`, the layouts are cuBLASLt's (fp8/fp8_gemm.h): every
// buffer below holds Fp8LtRows(rows) rows (the pad rows are computed and ignored), the
// activation scales are stored by column group and each weight's scale rows are padded to
// Fp8LtScaleLd(k) entries.

// out[rows, n] (fp32) = quant(x) . w^T, x [rows, k] bf16 (row stride ldx) quantized per row
// and 128 columns (MoeGatherQuantFp8Cuda) into xq / xq_scale, then one one-group
// block-scaled GEMM. k and n are the GEMM's (multiples of 128).
struct Fp8LinearArgs {
  int64_t rows = 0;
  const bf16_bits* x = nullptr;
  int64_t ldx = 0;                 // 0: k
  const uint8_t* w = nullptr;      // [n, k] e4m3
  const float* w_scale = nullptr;  // [n / 128, k / 128]
  GroupedGemm* gemm = nullptr;     // kFp8Block128, 1 group
  Fp8BlockGemmLt* lt = nullptr;    // optional (see above)
  const int32_t* offsets = nullptr;
  uint8_t* xq = nullptr;      // [rows, k]
  float* xq_scale = nullptr;  // [rows, k / 128]
  float* out = nullptr;       // [rows, n] (overwritten)
  void* stream = nullptr;
};
absl::Status RunFp8Linear(const Fp8LinearArgs& args);

// A SwiGLU MLP (the shared experts and the dense MLP layers of FP8 checkpoints):
//   gu = RunFp8Linear(x, gate_up)                  [rows, 2 inter] fp32
//   actq = quant(silu(gu[:, :I]) * gu[:, I:])      (SwiGluQuantFp8Cuda)
//   out = actq . down^T                            (one-group block-scaled GEMM, fp32)
// hidden and inter must be multiples of 128.
struct Fp8MlpArgs {
  int64_t rows = 0, hidden = 0, inter = 0;
  const bf16_bits* x = nullptr;  // [rows, hidden]
  const uint8_t* gate_up = nullptr;
  const float* gate_up_scale = nullptr;  // [2 inter, hidden] e4m3, [2 inter / 128, hidden / 128]
  const uint8_t* down = nullptr;
  const float* down_scale = nullptr;    // [hidden, inter] e4m3, [hidden / 128, inter / 128]
  GroupedGemm* gemm_gate_up = nullptr;  // kFp8Block128, 1 group, n = 2 inter, k = hidden
  GroupedGemm* gemm_down = nullptr;     // kFp8Block128, 1 group, n = hidden, k = inter
  Fp8BlockGemmLt* lt = nullptr;         // optional (see above)
  const int32_t* offsets = nullptr;     // device {0, rows} (see above)
  uint8_t* xq = nullptr;                // [rows, hidden]
  float* xq_scale = nullptr;            // [rows, hidden / 128]
  float* gu = nullptr;                  // [rows, 2 inter]
  uint8_t* actq = nullptr;              // [rows, inter]
  float* actq_scale = nullptr;          // [rows, inter / 128]
  float* out = nullptr;                 // [rows, hidden] (overwritten)
  void* stream = nullptr;
};
absl::Status RunFp8Mlp(const Fp8MlpArgs& args);

}  // namespace verifyd::kernels::cuda
