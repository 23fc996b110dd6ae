// The CPU backend's per-rank forward of the MLA decoder: the rank's weight shard, the batch
// plan shared by all ranks (tp/batch_plan.h), and one rank's forward over its heads / MLP columns /
// vocab rows with the in-process communicator.
//
// Per layer (row = one tail row of one request; R rows in the batch; H_l heads on the rank):
//   h = RMSNorm(x)
//   q = q_b(RMSNorm(q_a(h)))  (or q_proj(h))          [R, H_l, nope + rope], RoPE on rope part
//   kv = kv_a_proj_with_mqa(h)                         [R, kv_lora + rope]
//        RMSNorm on [0, kv_lora), RoPE on [kv_lora, kv_lora + rope) -> written to the tail
//        slots of this layer's latent cache (the row every head shares)
//   absorbed query  [R, H_l, kv_lora + rope] = [q_nope[h] · W_UK[h] | q_rope[h]]
//   o_lat = VerifyAttention(query, latent cache)       [R, H_l, kv_lora]
//   attn[h] = o_lat[h] · W_UV[h]^T                     [R, H_l * v]
//   x += AllReduceSum(o_proj_local(attn))              (row-parallel)
//   x += AllReduceSum(down_local(silu(gate_local(h2)) * up_local(h2))), h2 = RMSNorm(x)
//        (MoE layers: x += AllReduceSum(MoeForwardLocal(h2)), tp/cpu/cpu_moe.h: one
//        all-reduce for the routed and shared experts together)
// RoPE is YaRN's (kernels/yarn.h: inv_freq table and cos / sin factor) when the
// config has rope_scaling, with the softmax scale of AttentionSoftmaxScale (model_config.h).
// then RMSNorm → local LM-head rows → local argmax → AllGather → global argmax (largest value,
// lowest token on ties), identical on every rank.
//
// Every per-row computation uses the batch-invariant reference ops (kernels/reference), so a
// row's result does not depend on the rest of the batch.
// Thread-safety: a RankForward is used by its own rank thread only; BatchPlan and RankWeights
// are read-only once built.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/verify_attention.h"
#include "kernels/yarn.h"
#include "tp/batch_plan.h"
#include "tp/communicator.h"
#include "tp/cpu/cpu_moe.h"
#include "tp/engine.h"
#include "tp/model_config.h"
#include "tp/sharding.h"
#include "tp/step.h"
#include "tp/weight_source.h"
#include "tp/weights.h"

namespace verifyd::tp {

// One rank's slice of the weights, laid out for the forward.
struct RankWeights {
  struct Layer {
    std::vector<float> input_norm;  // [hidden]
    std::vector<float> q_a;         // [q_lora, hidden]          (q_lora > 0)
    std::vector<float> q_a_norm;    // [q_lora]                  (q_lora > 0)
    std::vector<float> q_b;         // [H_l * qk_head, q_lora or hidden]: local heads' rows
    std::vector<float> kv_a;        // [kv_lora + rope, hidden]  (replicated)
    std::vector<float> kv_a_norm;   // [kv_lora]
    std::vector<float> w_uk_t;      // [H_l, kv_lora, nope]: W_UK[h]^T (absorption)
    std::vector<float> w_uv;        // [H_l, v, kv_lora]: W_UV[h]
    std::vector<float> o_proj;      // [hidden, H_l * v]: the local heads' columns
    std::vector<float> post_norm;   // [hidden]
    std::vector<float> gate;        // [I_l, hidden]   (dense layers)
    std::vector<float> up;          // [I_l, hidden]   (dense layers)
    std::vector<float> down;        // [hidden, I_l]   (dense layers)
    bool is_moe = false;
    MoeLayerWeights moe;  // (MoE layers)
  };
  int world = 1;
  int rank = 0;
  ShardRange heads, vocab, inter;
  std::vector<float> embed;  // [vocab, hidden] (replicated)
  std::vector<Layer> layers;
  std::vector<float> final_norm;  // [hidden]
  std::vector<float> lm_head;     // [V_l, hidden]: the rank's vocab rows
};

// Reads rank `rank`'s shard (heads must divide by world) through the source with ReadBlock,
// block by block: the local heads' rows of q_b / q_proj and of kv_b (head by head), the local
// heads' columns of o_proj, the rank's intermediate rows of gate / up and columns of down (dense
// and every expert, tp/cpu/cpu_moe.h), its vocabulary rows of the LM head; replicated tensors
// (embeddings, q_a, kv_a, norms, router) whole. Checks the source against ModelTensorSpecs
// first and every value read for finiteness (InvalidArgument naming tensor and file). Heap: the
// shard itself plus one head's W_UK [nope, kv_lora] of scratch; no whole tensor is copied
// (ReadBlock of a checkpoint decodes straight from the mapping).
absl::StatusOr<RankWeights> ShardWeights(const WeightSource& source, int world, int rank);
// The same over host weights (an InMemoryWeightSource over `w`).
absl::StatusOr<RankWeights> ShardWeights(const ModelWeights& w, int world, int rank);

// Absorbed MLA attention of one layer for the heads of one rank:
//   q      [R, heads, nope + rope]  (RoPE already applied to the rope part)
//   w_uk_t [heads, kv_lora, nope], w_uv [heads, v, kv_lora]
//   kv     [kv_slots, kv_lora + rope] latent cache, the tail rows already written
//   out    [R, heads * v]
// Used by the forward and, alone, by the absorbed-vs-unabsorbed test.
absl::Status AbsorbedMlaAttention(const ModelConfig& c, int64_t heads, const BatchPlan& plan,
                                  const float* q, const float* w_uk_t, const float* w_uv,
                                  const float* kv, int64_t kv_slots, float* out);

// What a step asks of the forward besides the predictions (sampling, logprobs, hidden states;
// tp/engine.h). Built once by the engine and shared read-only by every rank.
struct ForwardExtras {
  // Rows whose full-vocabulary logits are gathered (every rank takes part in the gather;
  // every rank must pass the same list).
  std::vector<int32_t> logit_rows;
  // Hidden-state capture: the residual stream after a decoder layer is the same on every rank
  // (it is updated only by all-reduced sums), so only the rank given `hidden_out` copies it.
  using Capture = HiddenCapture;               // tp/step.h
  std::vector<std::vector<Capture>> by_layer;  // [num_hidden_layers] (empty: no capture)
  int64_t hidden_floats = 0;                   // size of hidden_out
};

// One rank's model: its weights, its full copy of the latent KV pool
// ([layers][kv_slots][kv_lora + rope] float, unused slots NaN) and its communicator.
class RankForward {
 public:
  // kv_fp8: every latent row written is rounded through the FP8 KV format (kernels/kv_fp8.h).
  RankForward(const ModelConfig& config, RankWeights weights, Communicator* comm, int64_t kv_slots,
              bool kv_fp8 = false);

  // Runs the plan: writes the tail rows' latent KV, fills predictions [total_rows] (identical
  // on every rank) and, when logits != nullptr, the full logits [total_rows, vocab] (gathered
  // from every rank; every rank must pass logits != nullptr or none).
  // With `extras`: also gathers the full logits of extras->logit_rows into *row_logits
  // ([logit_rows.size(), vocab]) and, when hidden_out != nullptr, copies the residual rows
  // extras->by_layer asks for into *hidden_out.
  absl::Status Forward(const BatchPlan& plan, std::vector<int32_t>* predictions,
                       std::vector<float>* logits, const ForwardExtras* extras = nullptr,
                       std::vector<float>* row_logits = nullptr,
                       std::vector<float>* hidden_out = nullptr);

  // The latent cache of one layer: [kv_slots, kv_lora + rope].
  const float* kv_layer(int64_t layer) const {
    return kv_.data() + layer * kv_slots_ * config_.latent_dim();
  }

 private:
  // RoPE in place on columns [offset, offset + rope) of each of `heads` heads.
  void Rope(float* x, int64_t rows, int64_t heads, int64_t head_stride, int64_t offset,
            const int32_t* positions) const;
  // Full-vocabulary rows `rows` of the vocab-sharded local logits [R, Vmax] (a collective).
  absl::Status GatherLogitRows(const std::vector<float>& local_logits, int64_t R, int64_t Vmax,
                               const std::vector<int32_t>& rows, std::vector<float>* out);
  float* kv_layer_mut(int64_t layer) {
    return kv_.data() + layer * kv_slots_ * config_.latent_dim();
  }

  const ModelConfig config_;
  const RankWeights w_;
  Communicator* const comm_;
  const int64_t kv_slots_;
  const bool kv_fp8_;
  std::vector<float> kv_;
  std::vector<float> yarn_inv_freq_;  // [rope / 2] under YaRN, else empty (plain RoPE)
  float yarn_attention_factor_ = 1.0f;
};

}  // namespace verifyd::tp
