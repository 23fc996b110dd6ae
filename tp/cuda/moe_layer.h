// The MoE MLP of one decoder layer on one rank of the CUDA engine (DeepSeek-V3: sigmoid /
// noaux_tc routing over expert groups, routed experts plus fused shared experts), the GPU
// counterpart of tp/cpu/cpu_moe.h: the router is replicated (every rank routes every row
// identically, and with tensor-parallel attention every rank holds every row), every rank
// holds its IntermediateShard of the shared experts and either its IntermediateShard of each
// routed expert (as the CPU backend) or, with expert parallelism, E / world whole routed
// experts (no token dispatch: each rank runs the pairs of its experts); the layer's single
// all-reduce (the caller's) sums routed + shared over ranks either way.
//
// One call (R rows; buffers in tp/cuda/rank_context.h): moe_xf = RMSNorm(x) in fp32
// (post_attention_layernorm; xn, the caller's bf16 copy of the same norm, feeds the experts),
// then kernels::cuda::RunMoeMlp (kernels/cuda/moe/moe_mlp.h: router, routing, permutation,
// the routed experts on the rank's expert path, shared experts, fixed-order combine) into x
// directly at TP 1, else into part (the caller all-reduces it into x). The grouped expert
// paths (sm_90) never wait for the host; the per-expert fallback waits once (WaitRankStream,
// with the collective timeout). Profile: the expert and shared GEMMs count as GEMM time.
// The arithmetic is exact in the row count (R * K expert rows, no padding). A row's expert
// outputs on the grouped paths do not depend on the other rows (no split-K; each output
// element is one tile's fixed-order k loop); cuBLAS may pick another algorithm per row count.
//
// Thread-safety: called on the rank's own thread only.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "tp/cuda/layer_step.h"
#include "tp/cuda/rank_context.h"

namespace verifyd::tp {

// The MoE MLP of layer `layer` (c.IsMoeLayer(layer)); rk.xn must hold RMSNorm(x) in bf16.
// TP 1: x += moe(x); TP > 1: part = this rank's share (the caller reduces it into x).
absl::Status RunMoeMlp(const MlaStep& s, int64_t layer, CudaRankContext& rk);

}  // namespace verifyd::tp
