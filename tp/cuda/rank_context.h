// One rank of the CUDA engine: its device state (stream, cuBLAS handle, NCCL communicator,
// bf16 weight shard, latent KV pool, activation buffers, verify-attention workspace, profile
// events) and the functions that set it up on the rank's own thread and tear it down.
//
// Buffers (R = max_batch * max_tail_rows rows at most; H_l local heads; lat = kv_lora + rope;
// I_l local intermediate; V_l local vocab rows, vmax the largest shard):
//   x     [R, hidden] fp32    residual stream
//   xn    [R, hidden] bf16    RMSNorm(x): input of the projections
//   qa    [R, q_lora] fp32 -> qan bf16 (q_a_layernorm)
//   q     [R, H_l, nope + rope] bf16
//   kva   [R, lat] fp32       kv_a output, normed + roped into the layer's cache
//   qatt  [R, H_l, lat] bf16  absorbed query [q_nope . W_UK | roped q_rope]
//   olat  [R, H_l, kv_lora] bf16  attention output in the latent space
//   attn  [R, H_l * v] bf16   olat . W_UV^T
//   part  [R, hidden] fp32    o_proj / down partial sums (all-reduced when TP > 1)
//   gu    [R, 2 * I_l] fp32   [gate | up];  act [R, I_l] bf16 = silu(gate) * up
//   logits [R, vmax] fp32;  pairs [R] / gathered [world, R] (value, index)
// MoE (models with MoE layers; E experts, K = top-k, P = R * K routed pairs, Ie_l / Is_l the
// local intermediate of a routed expert / of the shared experts; tp/cuda/moe_layer.h):
//   moe_xf [R, hidden] fp32 router input;  moe_logits [R, E] fp32
//   moe_experts [R, K] i32, moe_weights [R, K] fp32;  moe_offsets [E + 1], moe_rows [P],
//   moe_pos [P] i32 (the permutation);  moe_x [P, hidden] bf16 gathered expert inputs
//   moe_gu [max(P * 2 Ie_l, R * 2 Is_l)] fp32;  moe_act [max(P * Ie_l, R * Is_l)] bf16
//   moe_y [P, hidden] fp32 expert outputs;  moe_shared [R, hidden] fp32
//   moe_offsets_host: pinned [E + 1] (the per-expert row counts the host sizes GEMMs with,
//     expert path kBf16PerExpert only)
//   moe_xq [P, hidden] e4m3 + moe_xq_scale, moe_actq [P, Ie_l] e4m3 + moe_actq_scale
//     (expert path kFp8Grouped: the quantized expert inputs and SwiGLU outputs)
// FP8 linears (fp8_attention, fp8_dense, fp8_shared): fp8_offsets [2] = {0, rows} (written
//   once per step), fp8_xq [R, fp8_xq_cols] e4m3 + fp8_xq_scale (a linear's quantized input),
//   fp8_actq [R, max(I_l, Is_l)] e4m3 + fp8_actq_scale (SwiGLU outputs); MLP gate_up in gu /
//   moe_gu (fp32), the output in part / moe_shared.
// FP8 attention (fp8_attention): qkva [R, fp8_qkv_a_cols] fp32 = [q_a | kv_a | 0 pad] (in
//   place of qa and kva), qf [R, H_l * (nope + rope)] fp32 (q_b's output, rounded into q).
//
// Thread-safety: a CudaRankContext is used only by its rank's thread once created (the
// engine reads the results in out_host / profile after the rank finished its job).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/common.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8/fp8_gemm.h"
#include "kernels/cuda/moe/grouped_gemm.h"
#include "kernels/cuda/moe/moe_mlp.h"
#include "kernels/cuda/sampling/argmax.h"
#include "kernels/cuda/sampling/sampling.h"
#include "kernels/cuda/verify_attention/api.h"
#include "tp/cuda/loopback_communicator.h"
#include "tp/cuda/nccl_communicator.h"
#include "tp/cuda/recording_communicator.h"
#include "tp/cuda/step_profile.h"
#include "tp/model_config.h"
#include "tp/sharding.h"
#include "tp/weight_source.h"
#include "tp/weights.h"

namespace verifyd::tp {

// Profile categories of the step's time split (CudaStepProfile).
enum class ProfileCategory : int {
  kOther = 0,
  kGemm = 1,  // dense GEMMs (projections, dense MLPs, shared experts, LM head)
  kAttention = 2,
  kComm = 3,
  kRouter = 4,    // MoE router logits and top-k
  kDispatch = 5,  // MoE permutation, gathers and the weighted combine
  kExperts = 6,   // routed experts' GEMMs (and their SwiGLU / quantization)
  kSampling = 7,  // argmax, sampling, acceptance and the copy out
};

// One decoder layer's weight shard on the device (bf16).
struct CudaLayerWeights {
  using bf16 = kernels::bf16_bits;
  bf16 *input_norm = nullptr, *q_a = nullptr, *q_a_norm = nullptr, *q_b = nullptr;
  bf16 *kv_a = nullptr, *kv_a_norm = nullptr, *kv_b = nullptr, *o_proj = nullptr;
  bf16 *post_norm = nullptr, *gate_up = nullptr, *down = nullptr;
  // MoE layers (gate_up / down stay null): the replicated router in fp32 (transformers
  // computes it in float32), each routed expert's local [gate rows | up rows] and down
  // columns, the fused shared experts' likewise.
  float* router = nullptr;       // [E, hidden] fp32 mlp.gate.weight
  float* router_bias = nullptr;  // [E] fp32 mlp.gate.e_score_correction_bias
  // Routed experts: the rank's local_experts (E_l) of them, each its Ie_l columns.
  bf16* experts_gate_up = nullptr;  // [E_l, 2 Ie_l, hidden]   (expert paths kBf16*)
  bf16* experts_down = nullptr;     // [E_l, hidden, Ie_l]
  // Expert path kFp8Grouped: the checkpoint's e4m3 bytes and 128 x 128 block scales.
  uint8_t* experts_gate_up_fp8 = nullptr;  // [E, 2 Ie_l, hidden]
  float* experts_gate_up_scale = nullptr;  // [E, 2 Ie_l / 128, hidden / 128]
  uint8_t* experts_down_fp8 = nullptr;     // [E, hidden, Ie_l]
  float* experts_down_scale = nullptr;     // [E, hidden / 128, Ie_l / 128]
  bf16* shared_gate_up = nullptr;          // [2 Is_l, hidden]
  bf16* shared_down = nullptr;             // [hidden, Is_l]
  // FP8 MLP weights (CudaRankContext::fp8_dense / fp8_shared), in place of the bf16 arrays:
  // the checkpoint's e4m3 bytes and 128 x 128 block scales of the dense MLP's [gate | up] and
  // down, and of the shared experts'.
  uint8_t* gate_up_fp8 = nullptr;         // [2 I_l, hidden]
  float* gate_up_scale = nullptr;         // [2 I_l / 128, hidden / 128]
  uint8_t* down_fp8 = nullptr;            // [hidden, I_l]
  float* down_scale = nullptr;            // [hidden / 128, I_l / 128]
  uint8_t* shared_gate_up_fp8 = nullptr;  // [2 Is_l, hidden]
  float* shared_gate_up_scale = nullptr;  // [2 Is_l / 128, hidden / 128]
  uint8_t* shared_down_fp8 = nullptr;     // [hidden, Is_l]
  float* shared_down_scale = nullptr;     // [hidden / 128, Is_l / 128]
  // FP8 attention projections (CudaRankContext::fp8_attention), in place of q_a, kv_a, q_b
  // and o_proj (kv_b stays bf16: the absorbed per-head GEMMs read it):
  uint8_t* qkv_a_fp8 = nullptr;   // [fp8_qkv_a_cols, hidden]: q_a rows, kv_a rows, zero rows
  float* qkv_a_scale = nullptr;   //   [fp8_qkv_a_cols / 128, hidden / 128]
  uint8_t* q_b_fp8 = nullptr;     // [H_l qk, q_lora] (q_proj [H_l qk, hidden] without q_lora)
  float* q_b_scale = nullptr;     //   [H_l qk / 128, q_lora / 128]
  uint8_t* o_proj_fp8 = nullptr;  // [hidden, H_l v]
  float* o_proj_scale = nullptr;  //   [hidden / 128, H_l v / 128]
};

// How a rank runs its routed experts (kernels/cuda/moe/moe_mlp.h ExpertPath), chosen at
// load (ChooseExpertPath in rank_context.cc): kFp8Grouped when the checkpoint stores the routed
// experts in FP8 with 128 x 128 blocks, hidden and the rank's expert slice are multiples of
// 128 and the GPU is sm_90 (EngineOptions::cuda.fp8_experts); kBf16Grouped on sm_90 when the
// dims are multiples of 16; kBf16PerExpert otherwise.
using ExpertPath = kernels::cuda::ExpertPath;

struct CudaRankContext {
  using bf16 = kernels::bf16_bits;

  int rank = 0;
  int device = 0;
  int world = 1;
  // The rank whose results the engine reads (acceptance, sampling, hidden states, profile):
  // rank 0, or the one rank of a slice (EngineOptions::cuda.slice_rank).
  bool lead = false;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  std::unique_ptr<DeviceCommunicator> comm;  // TP > 1: NCCL, or loopback on a shared GPU
  std::vector<void*> allocs;                 // freed on this rank's thread at shutdown
  std::vector<void*> host_allocs;
  ShardRange heads, vocab, inter;
  ShardRange moe_inter, moe_shared_inter;  // of moe_intermediate_size (x n_shared_experts)
  // The routed experts this rank holds: [expert_begin, expert_begin + local_experts), each
  // with the moe_inter columns: every expert and an IntermediateShard (tensor-parallel
  // experts), or E / world whole experts (expert parallelism, RankSetup::expert_parallel).
  int64_t expert_begin = 0, local_experts = 0;
  int64_t vmax = 0;
  float rope_attention_factor = 1.0f;  // YaRN's cos / sin factor (1: plain RoPE)

  // Weights.
  bf16* embed = nullptr;
  bf16* final_norm = nullptr;
  bf16* lm_head = nullptr;
  std::vector<CudaLayerWeights> layers;
  // [layers] -> [kv_slots, kv_row_bytes]: the latent KV pool, bf16 rows [lat] or (kv_fp8) rows
  // of the FP8 format (kernels/kv_fp8.h).
  std::vector<void*> kv;
  bool kv_fp8 = false;
  int64_t kv_row_bytes = 0;

  // Activations for the largest step (see the top of the file).
  float *x = nullptr, *qa = nullptr, *kva = nullptr, *part = nullptr, *gu = nullptr;
  float *logits = nullptr, *cos_t = nullptr, *sin_t = nullptr, *inv_freq = nullptr;
  bf16 *xn = nullptr, *qan = nullptr, *q = nullptr, *qatt = nullptr, *olat = nullptr;
  bf16 *attn = nullptr, *act = nullptr;
  kernels::cuda::ArgmaxPair *pairs = nullptr, *gathered = nullptr;
  int32_t *preds = nullptr, *accepted = nullptr, *num_accepted = nullptr, *bonus = nullptr;
  int32_t *kept = nullptr, *freed = nullptr;
  float* logits_gathered = nullptr;  // [world, R, vmax] on demand (StepWithLogits, TP > 1)
  // MoE activations (null without MoE layers).
  float* moe_xf = nullptr;
  float* moe_logits = nullptr;
  float* moe_weights = nullptr;
  float* moe_gu = nullptr;
  float* moe_y = nullptr;
  float* moe_shared = nullptr;
  int32_t* moe_experts = nullptr;
  int32_t* moe_offsets = nullptr;
  int32_t* moe_rows = nullptr;
  int32_t* moe_pos = nullptr;
  int32_t* moe_permute_ws = nullptr;    // MoePermuteWorkspaceInts(P, E)
  int32_t* moe_offsets_host = nullptr;  // pinned
  bf16* moe_x = nullptr;
  bf16* moe_act = nullptr;
  ExpertPath expert_path = ExpertPath::kBf16PerExpert;
  std::unique_ptr<kernels::cuda::GroupedGemm> moe_gemm_gate_up, moe_gemm_down;  // grouped modes
  uint8_t* moe_xq = nullptr;        // kFp8Grouped: [P, hidden] e4m3 expert inputs
  float* moe_xq_scale = nullptr;    //   [P, hidden / 128]
  uint8_t* moe_actq = nullptr;      //   [P, Ie_l] e4m3 SwiGLU output
  float* moe_actq_scale = nullptr;  //   [P, Ie_l / 128]
  // FP8 dense MLPs and shared experts (ChooseFp8Mlps in rank_context.cc: an FP8 checkpoint
  // with 128 x 128 blocks, 128-aligned slices, the grouped kernels on this GPU and
  // RankSetup::fp8_experts): kernels/cuda/moe/moe_mlp.h RunFp8Mlp with one-group GEMMs.
  bool fp8_dense = false, fp8_shared = false;
  std::unique_ptr<kernels::cuda::GroupedGemm> dense_gemm_gate_up, dense_gemm_down;
  std::unique_ptr<kernels::cuda::GroupedGemm> shared_gemm_gate_up, shared_gemm_down;
  // FP8 attention projections (ChooseFp8Attention in rank_context.cc: the same conditions,
  // q_lora and the rank's head slices of q_b / o_proj 128-aligned): the fused q_a | kv_a
  // GEMM (kv_a's rows padded with zero rows to a whole block), q_b and o_proj, each a
  // kernels/cuda/moe/moe_mlp.h RunFp8Linear.
  bool fp8_attention = false;
  int64_t fp8_qkv_a_cols = 0;  // q_lora + lat rounded up to 128
  std::unique_ptr<kernels::cuda::GroupedGemm> attn_gemm_qkv_a, attn_gemm_q_b, attn_gemm_o;
  float* qkva = nullptr;  // [R, fp8_qkv_a_cols]
  float* qf = nullptr;    // [R, H_l qk]
  // cuBLASLt's block-scaled FP8 GEMM for those one-group linears (RankSetup::fp8_cublaslt,
  // not in batch-invariant steps, when cuBLASLt has it for the GPU); null: the grouped kernel.
  std::unique_ptr<kernels::cuda::Fp8BlockGemmLt> fp8_lt;
  int32_t* fp8_offsets = nullptr;   // [2] = {0, rows}: written once per step
  int64_t fp8_xq_cols = 0;          // the widest FP8 linear input
  uint8_t* fp8_xq = nullptr;        // [R, fp8_xq_cols] e4m3 linear inputs
  float* fp8_xq_scale = nullptr;    //   [R, fp8_xq_cols / 128]
  uint8_t* fp8_actq = nullptr;      // [R, max(I_l, Is_l)] e4m3 SwiGLU outputs
  float* fp8_actq_scale = nullptr;  //   [R, max(I_l, Is_l) / 128]

  char* plan_dev = nullptr;  // the step plan's device arena (grown on demand)
  size_t plan_dev_bytes = 0;
  char* out_host = nullptr;  // pinned: preds, accepted, kept, freed [R] + num_accepted, bonus [B]
  // Sampling / logprobs and hidden-state capture (rank 0; grown on demand by the step,
  // tp/cuda/cuda_engine.cc): the per-spec logprobs and the captured residual rows, on the
  // device and their pinned host copies (one device-to-host copy each per step).
  kernels::cuda::SampledLogprobs* sample_out = nullptr;
  kernels::cuda::SampledLogprobs* sample_out_host = nullptr;
  int64_t sample_capacity = 0;
  float* hidden_dev = nullptr;
  float* hidden_host = nullptr;
  int64_t hidden_capacity = 0;

  // The optimised verify attention (kernels/cuda/verify_attention/api.h), when enabled.
  bool have_vk = false;
  kernels::cuda::VerifyAttentionDeviceInfo vk_info;
  kernels::cuda::VerifyAttentionWorkspace vk_ws;

  // Profiling (rank 0 with the profile option): events in stream order and the category of
  // the segment each opens.
  bool profiling = false;  // this step records events
  std::vector<cudaEvent_t> events;
  std::vector<ProfileCategory> event_cat;
  size_t events_used = 0;
  CudaStepProfile profile;
  // Profiled steps of MoE models: per layer, the local experts that routed pairs reached
  // (kernels/cuda/moe/moe.h MoeCountTouchedCuda), [num_hidden_layers] int32.
  int32_t* moe_touched = nullptr;

  // The weight upload's two pinned staging buffers (InitRankContext only, freed after it):
  // one is filled from the host source while the other's copy to the device runs; done[i]
  // marks buffer i's last copy.
  struct UploadStaging {
    char* buf[2] = {nullptr, nullptr};
    size_t bytes[2] = {0, 0};
    cudaEvent_t done[2] = {nullptr, nullptr};
    int next = 0;
  } staging;

  size_t free_bytes = 0;                  // device memory free after InitRankContext
  bool batch_invariant = false;           // RankSetup::batch_invariant (GEMMs pinned on `cublas`)
  bool shared_context_attention = false;  // RankSetup::shared_context_attention
  kernels::cuda::PositionalSplitRule positional_split;  // RankSetup::positional_split
  int shared_prefix_packs = 0;  // the last step's plan (CudaEngine::last_step)
  // The last step's attention: its plan's configuration name, or "fallback"
  // (CudaEngine::last_step).
  const char* last_verify_kernel = "fallback";

  template <typename T>
  absl::StatusOr<T*> Alloc(int64_t count) {
    void* p = nullptr;
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    allocs.push_back(p);
    return static_cast<T*>(p);
  }
};

// Where a rank's weights come from: a host WeightSource (explicit weights or a mapped
// checkpoint, read block by block through a bounded staging buffer: FP8 tensors as stored
// where the rank keeps them in FP8, else dequantized to bf16 on the host), or null: generated
// on the device from the specs and the seed (kernels/cuda/dense/weight_gen.h; FP8 codes and
// block scales for the FP8-quantized tensors of a config with FP8 quantization).
struct RankWeightInit {
  const tp::WeightSource* host = nullptr;                    // not owned; outlives InitRankContext
  const std::map<std::string, TensorSpec>* specs = nullptr;  // by name (generation)
  uint64_t seed = 0;                                         // generation seed
  const ModelConfig* config = nullptr;                       // generation: its quantization

  // Whether tensor `name` comes as FP8 codes + 128 x 128 block scales: stored so in the host
  // source, or generated so (a config with FP8 quantization, tp::IsFp8QuantizedWeight).
  bool StoredAsFp8(const std::string& name) const {
    if (host != nullptr) return host->StoredAsFp8(name);
    return config != nullptr && IsFp8QuantizedWeight(*config, name);
  }
};

// What InitRankContext needs besides the context's rank / device / world.
struct RankSetup {
  const ModelConfig* config = nullptr;
  RankWeightInit weights;
  int64_t max_rows = 0;  // max_batch * max_tail_rows
  int max_batch = 0;
  bool use_verify_kernel = true;
  bool fp8_experts = true;                // EngineOptions::cuda.fp8_experts (all FP8 weights)
  bool fp8_cublaslt = true;               // EngineOptions::cuda.fp8_cublaslt
  bool expert_parallel = true;            // EngineOptions::cuda.expert_parallel
  bool grouped_experts = true;            // EngineOptions::cuda.grouped_experts
  bool batch_invariant = false;           // EngineOptions::cuda.batch_invariant
  bool shared_context_attention = false;  // EngineOptions::cuda.shared_context_attention
  // EngineOptions::cuda.positional_chunk_keys / positional_max_splits
  kernels::cuda::PositionalSplitRule positional_split;
  int64_t positional_partial_rows = 0;  // EngineOptions::cuda.positional_partial_rows
  // EngineOptions::cuda.fp8_staging_keys with an FP8 cache (else 0); used on sm_90 only.
  int64_t fp8_staging_keys = 0;
  // NCCL (TP > 1): the group's unique id and shared failure flag.
  std::string nccl_id;
  std::shared_ptr<NcclGroupState> nccl_group;
  std::shared_ptr<LoopbackGroup> loopback;  // set: the ranks share one GPU (loopback)
  bool recording = false;  // one rank run alone: a RecordingCommunicator (cuda.slice_rank)
  int comm_timeout_ms = 60000;
};

// On the rank's thread: selects the device, creates the stream, cuBLAS handle (fixed
// workspace) and communicator, uploads or generates the weight shard, allocates the
// activation buffers, sets up the verify attention, and records the free device memory.
absl::Status InitRankContext(const RankSetup& setup, CudaRankContext& rk);

// Bytes of one latent row of the pool: bf16 [latent_dim], or the FP8 format's row.
int64_t KvRowBytes(const ModelConfig& config, bool kv_fp8);

// On the rank's thread: the latent KV pool (bf16, or with kv_fp8 the FP8 format), every byte
// 0xFF (bf16 NaN; FP8 NaN codes and scales: a read of a slot nothing wrote shows up).
// ResourceExhausted when it does not fit.
absl::Status AllocateKvPool(const ModelConfig& config, int64_t kv_slots, bool kv_fp8,
                            CudaRankContext& rk);

// On the rank's thread: frees everything (after draining the stream).
void FreeRankContext(CudaRankContext& rk);

// Waits for the rank's stream with a deadline: through the communicator when there is one
// (it also watches the group), else polling the stream. Unavailable on error or timeout.
absl::Status WaitRankStream(CudaRankContext& rk, int timeout_ms);

// Records a profile event opening a segment of category `cat` (when rk.profiling).
void MarkProfile(CudaRankContext& rk, ProfileCategory cat);

// Sums the recorded segments into rk.profile (after the stream is done).
absl::Status CollectProfile(CudaRankContext& rk);

}  // namespace verifyd::tp
