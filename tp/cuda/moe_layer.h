// The MoE MLP of one decoder layer on one rank of the CUDA engine (DeepSeek-V3: sigmoid /
// noaux_tc routing over expert groups, routed experts plus fused shared experts), the GPU
// counterpart of tp/cpu/cpu_moe.h with the same sharding: the router is replicated (every rank
// routes every row identically), every rank holds its IntermediateShard of each routed expert
// and of the shared experts, and the layer's single all-reduce (the caller's) sums routed +
// shared over ranks.
//
// One call (R rows, E experts, top-k K; buffers in tp/cuda/rank_context.h):
//   moe_xf = RMSNorm(x) fp32 (post_attention_layernorm);  xn (bf16, the caller's) feeds the
//   experts.  moe_logits = moe_xf . router^T (fp32, MoeRouterLogitsCuda);  MoeRouteCuda -> experts,
//   weights; MoePermuteCuda -> per-expert contiguous pair lists (offsets on the device); routed
//   experts, by the rank's expert mode (rank_context.h):
//     kFp8Grouped:  moe_xq = e4m3(xn[perm rows]) with a scale per 128 columns; one grouped
//                   GEMM (kernels/cuda/dense/grouped_gemm.h) for every expert's [gate | up]
//                   over its rows; SwiGLU quantized to moe_actq; one grouped GEMM for the
//                   down projections into moe_y. The FP8 weights stay as the checkpoint
//                   stores them (e4m3 + 128 x 128 block scales).
//     kBf16Grouped: the same with bf16 moe_x / moe_act and bf16 weights.
//     Neither path syncs with the host: the launch sequence is fixed (graph-capturable) and
//     each expert's GEMMs still run on exactly its rows (empty experts cost nothing).
//     kBf16PerExpert (GPUs other than sm_90, or dims the grouped kernels refuse): moe_x =
//     xn[perm rows]; one host sync copies the offsets (WaitRankStream, with the collective
//     timeout); per non-empty expert a gate_up GEMM, SwiGLU and a down GEMM (cuBLAS).
//   shared experts over all R rows into moe_shared (bf16 cuBLAS);
//   MoeCombineCuda: per row, sum of w * expert_out in ascending expert index, + shared; into
//   x directly at TP 1, else into part (the caller all-reduces it into x).
// The arithmetic is exact in the row count (R * K expert rows, no padding). A row's expert
// outputs in the grouped modes do not depend on the other rows (no split-K; each output
// element is one tile's fixed-order k loop); cuBLAS may pick another algorithm per row count.
//
// Thread-safety: called on the rank's own thread only.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "tp/cuda/mla_layer.h"
#include "tp/cuda/rank_context.h"

namespace verifyd::tp {

// The MoE MLP of layer `layer` (c.IsMoeLayer(layer)); rk.xn must hold RMSNorm(x) in bf16.
// TP 1: x += moe(x); TP > 1: part = this rank's share (the caller reduces it into x).
absl::Status RunMoeMlp(const MlaStep& s, int64_t layer, CudaRankContext& rk);

}  // namespace verifyd::tp
