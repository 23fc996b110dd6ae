// The weight shard of one CUDA rank: every tensor's slice read from the host source through
// two pinned staging buffers (asynchronous copies, one buffer filled while the other's copy
// runs) or generated on the device (bf16, or FP8 codes + block scales for an FP8 config), in
// the layouts rank_context.h's CudaLayerWeights describe (bf16, or FP8 where the rank keeps
// FP8: ChooseExpertPath / ChooseFp8Mlps / ChooseFp8Attention in rank_context.cc decide).
//
// Thread-safety: on the rank's own thread (InitRankContext).
#pragma once

#include "absl/status/status.h"
#include "tp/cuda/rank_context.h"

namespace verifyd::tp {

// Allocates and fills rk's weights (embedding, every layer, final norm, LM head) for the
// paths already chosen in rk (expert_path, fp8_*), then frees the staging buffers.
// InvalidArgument naming the tensor (and its file) for a non-finite value or an FP8 NaN code.
absl::Status FillRankWeights(const RankSetup& setup, CudaRankContext& rk);

// Drains the stream and frees the upload's staging buffers (also on a failed load).
absl::Status FreeStaging(CudaRankContext& rk);

}  // namespace verifyd::tp
