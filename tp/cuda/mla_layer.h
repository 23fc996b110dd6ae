// The decoder's kernels on one rank of the CUDA engine, in launch order: the step's RoPE
// table and embedding gather, one MLA decoder layer, and the LM head with the vocab-parallel
// argmax. The engine's Forward (tp/cuda/cuda_engine.cc) is a loop over these.
//
// One layer (R rows, H_l local heads; tp/cuda/rank_context.h names the buffers):
//   xn = RMSNorm(x); q = q_b(RMSNorm(q_a(xn))) (or q_proj(xn)); kva = kv_a(xn)
//   qatt[:, h, :kv_lora] = q_nope[h] . W_UK[h]              (batched GEMM over heads)
//   latent KV write: RMSNorm + RoPE of kva into the layer's cache at the tail slots
//   qatt[:, h, kv_lora:] = RoPE(q_rope[h])
//   olat = verify attention (optimised kernel, or the fallback)
//   attn[:, h] = olat[h] . W_UV[h]^T; x += AllReduce(o_proj(attn))
//   xn = RMSNorm(x); x += AllReduce(down(SwiGLU(gate_up(xn))))      (dense layers)
//   xn = RMSNorm(x); x += AllReduce(routed + shared experts(xn))    (MoE layers: moe_layer.h)
// The RoPE table is plain (theta) or YaRN's (inv_freq and cos / sin factor from the host's
// reference computation); the attention softmax scale is AttentionSoftmaxScale(config).
// At TP = 1 the o_proj and down GEMMs accumulate straight into x (beta = 1): no add kernel.
//
// Thread-safety: called on the rank's own thread only.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "tp/cuda/layer_step.h"
#include "tp/cuda/rank_context.h"

namespace verifyd::tp {

// cos / sin of the step's positions (rk.cos_t, rk.sin_t): shared by every layer.
absl::Status ComputeRopeTable(const MlaStep& s, CudaRankContext& rk);

// x = embed[tokens].
absl::Status EmbedTokens(const MlaStep& s, CudaRankContext& rk);

// y[R, cols] = RMSNorm(x[R, cols]) * w over the step's rows with the model's eps, on the
// rank's stream: x of type xt and row stride ldx, y of type yt and row stride ldy (the
// layers' norms here, and the MoE layer's fp32 router input, moe_layer.h).
absl::Status StepRmsNorm(const MlaStep& s, CudaRankContext& rk, const void* x, kernels::DType xt,
                         int64_t ldx, int64_t cols, const kernels::bf16_bits* w, void* y,
                         kernels::DType yt, int64_t ldy);

// Decoder layer `layer`: attention and MLP blocks, residual in rk.x, KV into rk.kv[layer].
absl::Status RunMlaLayer(const MlaStep& s, int64_t layer, CudaRankContext& rk);

// Final RMSNorm, the LM head on the local vocab rows and the vocab-parallel argmax
// (all-gather of (value, index) per row when TP > 1): rk.preds, identical on every rank.
absl::Status RunLmHeadArgmax(const MlaStep& s, CudaRankContext& rk);

}  // namespace verifyd::tp
