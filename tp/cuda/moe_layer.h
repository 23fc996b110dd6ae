// The MoE MLP of one decoder layer on one rank of the CUDA engine (DeepSeek-V3: sigmoid /
// noaux_tc routing over expert groups, routed experts plus fused shared experts), the GPU
// counterpart of tp/cpu/cpu_moe.h with the same sharding: the router is replicated (every rank
// routes every row identically), every rank holds its IntermediateShard of each routed expert
// and of the shared experts, and the layer's single all-reduce (the caller's) sums routed +
// shared over ranks.
//
// One call (R rows, E experts, top-k K; buffers in tp/cuda/rank_context.h):
//   moe_xf = RMSNorm(x) fp32 (post_attention_layernorm);  xn (bf16, the caller's) feeds the
//   experts.  moe_logits = moe_xf . router^T (fp32 GEMM);  MoeRouteCuda -> experts, weights;
//   MoePermuteCuda -> per-expert contiguous pair lists;  moe_x = xn[perm rows];
//   host sync: the per-expert offsets are copied to pinned memory and the stream is waited
//   for (WaitRankStream, with the collective timeout), so each expert's GEMMs run on exactly
//   its rows and experts nobody chose are skipped;
//   per expert e with rows: gate_up GEMM, SwiGLU, down GEMM into moe_y[its rows];
//   shared experts over all R rows into moe_shared;
//   MoeCombineCuda: per row, sum of w * expert_out in ascending expert index, + shared; into
//   x directly at TP 1, else into part (the caller all-reduces it into x).
// Cost of this baseline: one host synchronisation per MoE layer (the GPU drains, then the
// expert GEMMs are launched: not capturable in a CUDA graph), up to E small GEMM triples per
// layer; the arithmetic is exact (R * K expert rows, no padding).
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
