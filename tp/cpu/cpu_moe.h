// The CPU backend's DeepSeek-V3 MoE MLP for one tensor-parallel rank: the rank's weight
// slice of a MoE layer and its share of the layer's output.
//
// Sharding: the router (gate.weight, e_score_correction_bias) is replicated, so every rank
// routes every row identically. Every routed expert and the fused shared experts are split
// like the dense MLP: rank r holds rows IntermediateShard(moe_intermediate_size) of each
// expert's gate_proj / up_proj (column-parallel) and the same columns of its down_proj
// (row-parallel); the shared experts are split over IntermediateShard(moe_intermediate_size
// * n_shared_experts). The rank's output share
//   part[row] = sum over the row's experts, ascending expert index, of w_e * down_e(act_e)
//               + shared(row)
// is summed over ranks by the layer's single all-reduce (the caller's). At TP 1 this is
// transformers' order: index_add_ of w_e * expert_e(x) into zeros in ascending expert
// index, then + shared_experts(x).
//
// Rows are routed and computed independently (experts gather their rows; every op is
// per-row), so a row's result does not depend on the rest of the batch.
// Thread-safety: MoeLayerWeights is read-only once built; MoeForwardLocal is reentrant.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tp/model_config.h"
#include "tp/sharding.h"
#include "tp/weight_source.h"
#include "tp/weights.h"

namespace verifyd::tp {

struct MoeLayerWeights {
  ShardRange inter;                // this rank's rows of each routed expert's intermediate dim
  ShardRange shared_inter;         // ... of the shared experts' (moe_inter * n_shared)
  std::vector<float> router;       // [E, hidden] (replicated)
  std::vector<float> bias;         // [E] e_score_correction_bias (replicated)
  std::vector<float> gate;         // [E, I_l, hidden]
  std::vector<float> up;           // [E, I_l, hidden]
  std::vector<float> down;         // [E, hidden, I_l]
  std::vector<float> shared_gate;  // [S_l, hidden]
  std::vector<float> shared_up;    // [S_l, hidden]
  std::vector<float> shared_down;  // [hidden, S_l]
};

// Reads rank `rank`'s slice of MoE layer `layer` through the source (ReadBlock: the rank's
// rows / columns of each expert, the router whole); values checked finite. The source is
// checked against the model's tensors by the caller (ShardWeights).
absl::StatusOr<MoeLayerWeights> ShardMoeLayer(const WeightSource& source, int64_t layer, int world,
                                              int rank);
// The same over host weights.
absl::StatusOr<MoeLayerWeights> ShardMoeLayer(const ModelWeights& w, int64_t layer, int world,
                                              int rank);

// part [rows, hidden] = the rank's share of the MoE output for normed inputs h [rows, hidden].
void MoeForwardLocal(const ModelConfig& c, const MoeLayerWeights& m, const float* h, int64_t rows,
                     float* part);

}  // namespace verifyd::tp
