// The CUDA engine's per-rank device state (see rank_context.h).
#include "tp/cuda/rank_context.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/dense/gemm.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/kv_fp8.h"
#include "kernels/status.h"
#include "kernels/yarn.h"
#include "tp/cuda/rank_weights.h"

namespace verifyd::tp {
namespace {

namespace kc = kernels::cuda;
using bf16 = kernels::bf16_bits;
using Clock = std::chrono::steady_clock;

// Waits for a stream with a deadline (TP = 1 has no communicator to poll).
absl::Status WaitStream(cudaStream_t s, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (int it = 0;; ++it) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      return absl::UnavailableError(
          absl::StrCat("stream failed: ", cudaGetErrorName(e), " ", cudaGetErrorString(e)));
    }
    if (Clock::now() > deadline) {
      return absl::UnavailableError(absl::StrCat("stream not done after ", timeout_ms, " ms"));
    }
    if (it < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

// A device buffer of `count` T with every byte 0xFF (an fp32 / bf16 NaN, an int32 -1), so a
// read of an element nothing wrote shows up.
template <typename T>
absl::StatusOr<T*> AllocPoisoned(CudaRankContext& rk, int64_t count) {
  VERIFYD_ASSIGN_OR_RETURN(T * p, rk.Alloc<T>(count));
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(p, 0xFF, std::max<int64_t>(count, 1) * sizeof(T), rk.stream));
  return p;
}

// The grouped GEMMs of an MLP of intermediate width I over `groups` experts: gate_up
// (groups x 2 I x hid) and down (groups x hid x I).
absl::Status CreateMlpGemms(kc::GroupedGemmKind kind, int groups, int64_t I, int64_t hid,
                            int device, int tile_m, std::unique_ptr<kc::GroupedGemm>& gate_up,
                            std::unique_ptr<kc::GroupedGemm>& down) {
  VERIFYD_ASSIGN_OR_RETURN(gate_up,
                           kc::GroupedGemm::Create({kind, groups, 2 * I, hid, device, tile_m}));
  VERIFYD_ASSIGN_OR_RETURN(down, kc::GroupedGemm::Create({kind, groups, hid, I, device, tile_m}));
  return absl::OkStatus();
}

// The MoE activation buffers for R rows (see the top of rank_context.h), poisoned.
absl::Status AllocMoeBuffers(const ModelConfig& c, int64_t R, CudaRankContext& rk) {
  const int64_t hid = c.hidden_size, E = c.moe.n_routed_experts, K = c.moe.num_experts_per_tok;
  const int64_t P = R * K, Il = rk.moe_inter.size, Sl = rk.moe_shared_inter.size;
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_xf, AllocPoisoned<float>(rk, R * hid));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_logits, AllocPoisoned<float>(rk, R * E));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_experts, AllocPoisoned<int32_t>(rk, P));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_weights, AllocPoisoned<float>(rk, P));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_offsets, AllocPoisoned<int32_t>(rk, E + 1));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_touched, rk.Alloc<int32_t>(c.num_hidden_layers));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_rows, AllocPoisoned<int32_t>(rk, P));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_pos, AllocPoisoned<int32_t>(rk, P));
  VERIFYD_ASSIGN_OR_RETURN(
      rk.moe_permute_ws,
      AllocPoisoned<int32_t>(rk, kc::MoePermuteWorkspaceInts(P, static_cast<int>(E))));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_x, AllocPoisoned<bf16>(rk, P * hid));
  // The shared experts' rows rounded up for cuBLASLt (kc::Fp8LtRows: gate_up, output).
  const int64_t R4 = kc::Fp8LtRows(R);
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_gu, AllocPoisoned<float>(rk, std::max(P * 2 * Il, R4 * 2 * Sl)));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_act, AllocPoisoned<bf16>(rk, std::max(P * Il, R * Sl)));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_y, AllocPoisoned<float>(rk, P * hid));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_shared, AllocPoisoned<float>(rk, R4 * hid));
  if (rk.expert_path == ExpertPath::kFp8Grouped) {
    VERIFYD_ASSIGN_OR_RETURN(rk.moe_xq, AllocPoisoned<uint8_t>(rk, P * hid));
    VERIFYD_ASSIGN_OR_RETURN(rk.moe_xq_scale, AllocPoisoned<float>(rk, P * hid / 128));
    VERIFYD_ASSIGN_OR_RETURN(rk.moe_actq, AllocPoisoned<uint8_t>(rk, P * Il));
    VERIFYD_ASSIGN_OR_RETURN(rk.moe_actq_scale, AllocPoisoned<float>(rk, P * Il / 128));
  }
  if (rk.expert_path != ExpertPath::kBf16PerExpert) {
    const kc::GroupedGemmKind kind = rk.expert_path == ExpertPath::kFp8Grouped
                                         ? kc::GroupedGemmKind::kFp8Block128
                                         : kc::GroupedGemmKind::kBf16;
    // FP8: 64-row tiles (measured faster at every verify batch size, bench/moe_layer_bench;
    // bit-identical to 128-row tiles).
    const int tile_m = kind == kc::GroupedGemmKind::kFp8Block128 ? 64 : 128;
    VERIFYD_RETURN_IF_ERROR(CreateMlpGemms(kind, static_cast<int>(rk.local_experts), Il, hid,
                                           rk.device, tile_m, rk.moe_gemm_gate_up,
                                           rk.moe_gemm_down));
  }
  void* h = nullptr;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h, (E + 1) * sizeof(int32_t)));
  rk.host_allocs.push_back(h);
  rk.moe_offsets_host = static_cast<int32_t*>(h);
  return absl::OkStatus();
}

// The rank's expert path (rank_context.h): FP8 grouped when the checkpoint stores the routed
// experts in FP8 with 128 x 128 blocks, the rank's slice is 128-aligned and the GPU runs the
// grouped kernels; bf16 grouped when the GPU runs them and the dims are multiples of 16;
// per-expert cuBLAS otherwise.
ExpertPath ChooseExpertPath(const RankSetup& setup, const CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  const int64_t hid = c.hidden_size, Il = rk.moe_inter.size;
  if (Il == 0 || !setup.grouped_experts || !kc::GroupedGemmAvailable(rk.device)) {
    return ExpertPath::kBf16PerExpert;
  }
  int64_t first_moe = -1;
  for (int64_t l = 0; l < c.num_hidden_layers && first_moe < 0; ++l) {
    if (c.IsMoeLayer(l)) first_moe = l;
  }
  if (setup.fp8_experts && first_moe >= 0 &&
      setup.weights.StoredAsFp8(LayerTensorName(first_moe, "mlp.experts.0.gate_proj.weight")) &&
      c.quant.block_rows == 128 && c.quant.block_cols == 128 && hid % 128 == 0 && Il % 128 == 0 &&
      rk.moe_inter.begin % 128 == 0) {
    return ExpertPath::kFp8Grouped;
  }
  if (hid % 16 == 0 && Il % 16 == 0) return ExpertPath::kBf16Grouped;
  return ExpertPath::kBf16PerExpert;
}

// Which FP8-stored SwiGLU MLPs stay FP8 on this rank (rk.fp8_dense, rk.fp8_shared): those
// of a checkpoint with 128 x 128 blocks whose rank slice [begin, +size) of the intermediate
// is 128-aligned (and hidden too), when the GPU runs the grouped kernels and
// RankSetup::fp8_experts is set. The first dense layer's / first MoE layer's gate_proj
// decides for all (a checkpoint quantizes every layer alike).
// What every FP8 linear kept in FP8 needs: the option, FP8 weights (a checkpoint's or
// generated) with 128 x 128 scale blocks, hidden a multiple of 128 and the grouped kernels on
// this GPU.
bool Fp8WeightsCanStayFp8(const RankSetup& setup, const CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  return setup.fp8_experts && c.quant.method == "fp8" && c.quant.block_rows == 128 &&
         c.quant.block_cols == 128 && c.hidden_size % 128 == 0 &&
         kc::GroupedGemmAvailable(rk.device);
}

void ChooseFp8Mlps(const RankSetup& setup, CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  const RankWeightInit& host = setup.weights;
  if (!Fp8WeightsCanStayFp8(setup, rk)) return;
  auto aligned = [](const ShardRange& r) {
    return r.size > 0 && r.size % 128 == 0 && r.begin % 128 == 0;
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.IsMoeLayer(l)) {
      rk.fp8_shared = aligned(rk.moe_shared_inter) &&
                      host.StoredAsFp8(LayerTensorName(l, "mlp.shared_experts.gate_proj.weight"));
      break;
    }
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsMoeLayer(l)) {
      rk.fp8_dense =
          aligned(rk.inter) && host.StoredAsFp8(LayerTensorName(l, "mlp.gate_proj.weight"));
      break;
    }
  }
}

// Whether the attention projections stay FP8 on this rank (rk.fp8_attention):
// Fp8WeightsCanStayFp8, and q_lora (when there is one) and the rank's head slices of q_b / q_proj
// (H_l qk rows from h0 qk) and o_proj (H_l v columns from h0 v) 128-aligned; layer 0's
// q_a_proj (or q_proj), kv_a_proj_with_mqa, q_b_proj and o_proj stored as FP8 decide for all.
// kv_a's lat rows (576 on DeepSeek-V3: 4.5 blocks) are padded with zero rows to whole blocks
// and fused behind q_a's into one GEMM (rk.fp8_qkv_a_cols columns).
void ChooseFp8Attention(const RankSetup& setup, CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  if (!Fp8WeightsCanStayFp8(setup, rk) || c.num_hidden_layers == 0) return;
  const int64_t ql = c.q_lora_rank, qk = c.qk_head_dim(), v = c.v_head_dim;
  const int64_t Hl = rk.heads.size, h0 = rk.heads.begin;
  const bool aligned = Hl > 0 && ql % 128 == 0 && (Hl * qk) % 128 == 0 && (h0 * qk) % 128 == 0 &&
                       (Hl * v) % 128 == 0 && (h0 * v) % 128 == 0;
  auto fp8 = [&](const char* suffix) {
    return setup.weights.StoredAsFp8(LayerTensorName(0, suffix));
  };
  const bool stored = (ql > 0 ? fp8("self_attn.q_a_proj.weight") && fp8("self_attn.q_b_proj.weight")
                              : fp8("self_attn.q_proj.weight")) &&
                      fp8("self_attn.kv_a_proj_with_mqa.weight") && fp8("self_attn.o_proj.weight");
  rk.fp8_attention = aligned && stored;
  if (rk.fp8_attention) rk.fp8_qkv_a_cols = ql + (c.latent_dim() + 127) / 128 * 128;
}

// The one-group FP8 GEMMs and scratch of the FP8 linears for R rows (rk.fp8_attention,
// fp8_dense, fp8_shared).
absl::Status AllocFp8Buffers(const RankSetup& setup, const ModelConfig& c, int64_t R,
                             CudaRankContext& rk) {
  const int64_t hid = c.hidden_size;
  const int64_t inter =
      std::max(rk.fp8_dense ? rk.inter.size : 0, rk.fp8_shared ? rk.moe_shared_inter.size : 0);
  if (inter == 0 && !rk.fp8_attention) return absl::OkStatus();
  using kc::GroupedGemm;
  constexpr kc::GroupedGemmKind kFp8 = kc::GroupedGemmKind::kFp8Block128;
  const int64_t ql = c.q_lora_rank, qk = c.qk_head_dim(), Hl = rk.heads.size;
  const int64_t v = c.v_head_dim;
  rk.fp8_xq_cols = hid;
  if (rk.fp8_attention) rk.fp8_xq_cols = std::max({hid, ql, Hl * v});
  VERIFYD_ASSIGN_OR_RETURN(rk.fp8_offsets, AllocPoisoned<int32_t>(rk, 2));
  // Rows rounded up for cuBLASLt (kc::Fp8LtRows: it computes whole groups of 4 rows).
  R = kc::Fp8LtRows(R);
  VERIFYD_ASSIGN_OR_RETURN(rk.fp8_xq, AllocPoisoned<uint8_t>(rk, R * rk.fp8_xq_cols));
  VERIFYD_ASSIGN_OR_RETURN(rk.fp8_xq_scale, AllocPoisoned<float>(rk, R * rk.fp8_xq_cols / 128));
  if (inter > 0) {
    VERIFYD_ASSIGN_OR_RETURN(rk.fp8_actq, AllocPoisoned<uint8_t>(rk, R * inter));
    VERIFYD_ASSIGN_OR_RETURN(rk.fp8_actq_scale, AllocPoisoned<float>(rk, R * inter / 128));
  }

  // 64-row tiles, as the routed experts' (few rows per step at verify batch sizes).
  if (rk.fp8_attention) {
    const int64_t na = rk.fp8_qkv_a_cols, qin = ql > 0 ? ql : hid;
    VERIFYD_ASSIGN_OR_RETURN(rk.attn_gemm_qkv_a,
                             GroupedGemm::Create({kFp8, 1, na, hid, rk.device, 64}));
    VERIFYD_ASSIGN_OR_RETURN(rk.attn_gemm_q_b,
                             GroupedGemm::Create({kFp8, 1, Hl * qk, qin, rk.device, 64}));
    VERIFYD_ASSIGN_OR_RETURN(rk.attn_gemm_o,
                             GroupedGemm::Create({kFp8, 1, hid, Hl * v, rk.device, 64}));
    VERIFYD_ASSIGN_OR_RETURN(rk.qkva, AllocPoisoned<float>(rk, R * na));
    VERIFYD_ASSIGN_OR_RETURN(rk.qf, AllocPoisoned<float>(rk, R * Hl * qk));
  }
  if (rk.fp8_dense) {
    VERIFYD_RETURN_IF_ERROR(CreateMlpGemms(kFp8, 1, rk.inter.size, hid, rk.device, 64,
                                           rk.dense_gemm_gate_up, rk.dense_gemm_down));
  }
  if (rk.fp8_shared) {
    VERIFYD_RETURN_IF_ERROR(CreateMlpGemms(kFp8, 1, rk.moe_shared_inter.size, hid, rk.device, 64,
                                           rk.shared_gemm_gate_up, rk.shared_gemm_down));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// The rank's device, stream and cuBLAS handle with a fixed workspace (pinned GEMM algorithms
// in batch-invariant steps).
absl::Status InitDevice(const RankSetup& setup, CudaRankContext& rk) {
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaSetDevice(rk.device));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&rk.stream, cudaStreamNonBlocking));
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasCreate(&rk.cublas));
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasSetStream(rk.cublas, rk.stream));
  {
    // A fixed cuBLAS workspace: no allocation inside a step (graph-capture safe).
    constexpr size_t kCublasWs = size_t{32} << 20;
    absl::StatusOr<char*> ws = rk.Alloc<char>(kCublasWs);
    if (!ws.ok()) return ws.status();
    VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(rk.cublas, *ws, kCublasWs));
    rk.batch_invariant = setup.batch_invariant;
    rk.shared_context_attention = setup.shared_context_attention;
    rk.positional_split = setup.positional_split;
    if (rk.batch_invariant) {
      VERIFYD_RETURN_IF_ERROR(
          kc::EnableFixedGemmAlgorithms(rk.cublas, *ws, kCublasWs, setup.max_rows));
    }
  }
  return absl::OkStatus();
}

// The rank's communicator (TP > 1): the recording stand-in of a slice, loopback ranks on one
// GPU, or NCCL (with the rank-order reduction of batch-invariant steps).
absl::Status CreateCommunicator(const RankSetup& setup, CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  const int tp = rk.world;
  if (tp > 1 && setup.recording) {
    const size_t rank_order_bytes =
        setup.batch_invariant ? static_cast<size_t>(setup.max_rows * c.hidden_size) * sizeof(float)
                              : 0;
    VERIFYD_ASSIGN_OR_RETURN(rk.comm,
                             RecordingCommunicator::Create(rk.rank, tp, rk.device, rank_order_bytes,
                                                           setup.comm_timeout_ms));
  } else if (tp > 1 && setup.loopback != nullptr) {
    VERIFYD_ASSIGN_OR_RETURN(rk.comm,
                             LoopbackCommunicator::Create(setup.loopback, rk.rank, rk.device));
  } else if (tp > 1) {
    VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                             NcclCommunicator::Create(setup.nccl_id, rk.rank, tp, rk.device,
                                                      setup.comm_timeout_ms, setup.nccl_group));
    // Batch-invariant steps: the layer reductions ([rows, hidden] fp32) summed in rank order.
    if (setup.batch_invariant) {
      VERIFYD_RETURN_IF_ERROR(nccl->EnableRankOrderReduce(
          static_cast<size_t>(setup.max_rows * c.hidden_size) * sizeof(float)));
    }
    rk.comm = std::move(nccl);
  }
  return absl::OkStatus();
}

// The rank's slices (heads, vocabulary, MLP columns, routed experts) and how it runs its FP8
// weights (expert path, FP8 MLPs / attention, cuBLASLt).
absl::Status ShardRank(const RankSetup& setup, CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  const int tp = rk.world;
  rk.heads = HeadShard(c.num_attention_heads, tp, rk.rank);
  rk.vocab = VocabShard(c.vocab_size, tp, rk.rank);
  rk.inter = IntermediateShard(c.intermediate_size, tp, rk.rank);
  // Routed experts: expert parallelism (a block of whole experts per rank) when asked for and
  // the experts divide evenly, else a slice of every expert (tensor-parallel experts).
  const int64_t E = c.moe.n_routed_experts;
  if (setup.expert_parallel && tp > 1 && E > 0 && E % tp == 0) {
    rk.expert_begin = rk.rank * (E / tp);
    rk.local_experts = E / tp;
    rk.moe_inter = ShardRange{0, c.moe.moe_intermediate_size};
  } else {
    rk.expert_begin = 0;
    rk.local_experts = E;
    rk.moe_inter = IntermediateShard(c.moe.moe_intermediate_size, tp, rk.rank);
  }
  rk.moe_shared_inter =
      IntermediateShard(c.moe.moe_intermediate_size * c.moe.n_shared_experts, tp, rk.rank);
  rk.vmax = CeilShardMax(c.vocab_size, tp);
  if (c.moe.n_routed_experts > 0) rk.expert_path = ChooseExpertPath(setup, rk);
  ChooseFp8Mlps(setup, rk);
  ChooseFp8Attention(setup, rk);
  // The one-group FP8 linears through cuBLASLt (before the weights: it sets their scale
  // layout), unless the steps are batch-invariant or it has no algorithm for this GPU.
  if ((rk.fp8_attention || rk.fp8_dense || rk.fp8_shared) && setup.fp8_cublaslt &&
      !setup.batch_invariant) {
    absl::StatusOr<std::unique_ptr<kc::Fp8BlockGemmLt>> lt = kc::Fp8BlockGemmLt::Create();
    if (lt.ok()) {
      rk.fp8_lt = std::move(*lt);
    } else if (lt.status().code() != absl::StatusCode::kFailedPrecondition) {
      return lt.status();
    }  // else: the grouped kernel (CudaEngine::fp8_gemm says which)
  }
  return absl::OkStatus();
}

// Activations and scratch for the largest step (see the top of rank_context.h), the RoPE
// frequencies and the pinned result buffer.
absl::Status AllocActivations(const RankSetup& setup, CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  const int tp = rk.world;
  const int64_t hid = c.hidden_size, qk = c.qk_head_dim();
  const int64_t v = c.v_head_dim, kvl = c.kv_lora_rank, lat = c.latent_dim();
  const int64_t Hl = rk.heads.size, Il = rk.inter.size;
  const int64_t ql = c.q_lora_rank, R = setup.max_rows;
  VERIFYD_ASSIGN_OR_RETURN(rk.x, rk.Alloc<float>(R * hid));
  VERIFYD_ASSIGN_OR_RETURN(rk.xn, rk.Alloc<bf16>(R * hid));
  if (ql > 0) {
    if (!rk.fp8_attention) {
      VERIFYD_ASSIGN_OR_RETURN(rk.qa, rk.Alloc<float>(R * ql));
    }
    VERIFYD_ASSIGN_OR_RETURN(rk.qan, rk.Alloc<bf16>(R * ql));
  }
  VERIFYD_ASSIGN_OR_RETURN(rk.q, rk.Alloc<bf16>(R * Hl * qk));
  if (!rk.fp8_attention) {
    VERIFYD_ASSIGN_OR_RETURN(rk.kva, rk.Alloc<float>(R * lat));
  }
  VERIFYD_ASSIGN_OR_RETURN(rk.qatt, rk.Alloc<bf16>(R * Hl * lat));
  VERIFYD_ASSIGN_OR_RETURN(rk.olat, rk.Alloc<bf16>(R * Hl * kvl));
  VERIFYD_ASSIGN_OR_RETURN(rk.attn, rk.Alloc<bf16>(R * Hl * v));
  // part and gu take FP8 linears' outputs: rows rounded up for cuBLASLt (kc::Fp8LtRows).
  VERIFYD_ASSIGN_OR_RETURN(rk.part, rk.Alloc<float>(kc::Fp8LtRows(R) * hid));
  VERIFYD_ASSIGN_OR_RETURN(rk.gu, rk.Alloc<float>(kc::Fp8LtRows(R) * 2 * std::max<int64_t>(Il, 1)));
  VERIFYD_ASSIGN_OR_RETURN(rk.act, rk.Alloc<bf16>(R * std::max<int64_t>(Il, 1)));
  VERIFYD_ASSIGN_OR_RETURN(rk.logits, rk.Alloc<float>(R * rk.vmax));
  VERIFYD_ASSIGN_OR_RETURN(rk.cos_t, rk.Alloc<float>(R * c.qk_rope_head_dim / 2));
  VERIFYD_ASSIGN_OR_RETURN(rk.sin_t, rk.Alloc<float>(R * c.qk_rope_head_dim / 2));
  VERIFYD_ASSIGN_OR_RETURN(rk.inv_freq, rk.Alloc<float>(c.qk_rope_head_dim / 2));
  VERIFYD_ASSIGN_OR_RETURN(rk.pairs, rk.Alloc<kc::ArgmaxPair>(R));
  VERIFYD_ASSIGN_OR_RETURN(rk.gathered, rk.Alloc<kc::ArgmaxPair>(R * tp));
  VERIFYD_ASSIGN_OR_RETURN(rk.preds, rk.Alloc<int32_t>(R));
  VERIFYD_ASSIGN_OR_RETURN(rk.accepted, rk.Alloc<int32_t>(R));
  VERIFYD_ASSIGN_OR_RETURN(rk.kept, rk.Alloc<int32_t>(R));
  VERIFYD_ASSIGN_OR_RETURN(rk.freed, rk.Alloc<int32_t>(R));
  VERIFYD_ASSIGN_OR_RETURN(rk.num_accepted, rk.Alloc<int32_t>(setup.max_batch));
  VERIFYD_ASSIGN_OR_RETURN(rk.bonus, rk.Alloc<int32_t>(setup.max_batch));
  bool has_moe = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) has_moe = has_moe || c.IsMoeLayer(l);
  if (has_moe) VERIFYD_RETURN_IF_ERROR(AllocMoeBuffers(c, R, rk));
  VERIFYD_RETURN_IF_ERROR(AllocFp8Buffers(setup, c, R, rk));
  {
    // Plain RoPE: RopeInvFreq (factor 1); YaRN: the reference's table and cos / sin factor.
    std::vector<float> inv;
    if (c.rope_scaling.type == "yarn") {
      const kernels::YarnParams y = YarnParamsOf(c);
      inv = kernels::YarnInvFreq(y);
      rk.rope_attention_factor = static_cast<float>(kernels::YarnAttentionFactor(y));
    } else {
      inv = kc::RopeInvFreq(static_cast<int>(c.qk_rope_head_dim), c.rope_theta);
      rk.rope_attention_factor = 1.0f;
    }
    // Synchronous below (cudaStreamSynchronize before return): inv outlives the copy.
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        rk.inv_freq, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice, rk.stream));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
  }
  {
    void* h = nullptr;
    VERIFYD_CUDA_RETURN_IF_ERROR(
        cudaMallocHost(&h, (4 * R + 2 * setup.max_batch) * sizeof(int32_t)));
    rk.host_allocs.push_back(h);
    rk.out_host = static_cast<char*>(h);
  }
  return absl::OkStatus();
}

// The optimised verify attention's device info and workspace (when enabled).
absl::Status SetUpVerifyAttention(const RankSetup& setup, CudaRankContext& rk) {
  if (setup.use_verify_kernel) {
    absl::StatusOr<kc::VerifyAttentionDeviceInfo> info = kc::VerifyAttentionDeviceInfo::Query();
    if (!info.ok()) return info.status();
    rk.vk_info = *info;
    // Batch-invariant steps: room for every row of a full step at the most splits, partial
    // rows (EngineOptions::cuda.positional_partial_rows: 1 GiB by default) and index entries
    // (64 MB) for a pass (PositionalCapacity; tp/memory_plan.cc counts the same). A step that
    // needs more runs in passes, one after another, each launch holding only its pass's work:
    // with 128k partial rows a step of 32 trees of 64 nodes over 65k tokens at 64 heads took
    // 33 passes of fewer CTAs than SMs (2.1x the batch-adaptive attention time; docs/PERF.md).
    absl::StatusOr<kc::VerifyAttentionWorkspace> ws =
        rk.batch_invariant
            ? kc::VerifyAttentionWorkspace::AllocateLike(
                  kc::VerifyAttentionWorkspace::PositionalCapacity(
                      setup.max_rows, rk.heads.size, setup.positional_split.max_splits,
                      setup.positional_partial_rows))
            : kc::VerifyAttentionWorkspace::AllocateDefault(
                  rk.vk_info.cc_major == 9 ? setup.fp8_staging_keys : 0);
    if (!ws.ok()) return ws.status();
    rk.vk_ws = *ws;
    rk.have_vk = true;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status InitRankContext(const RankSetup& setup, CudaRankContext& rk) {
  VERIFYD_RETURN_IF_ERROR(InitDevice(setup, rk));
  VERIFYD_RETURN_IF_ERROR(CreateCommunicator(setup, rk));
  VERIFYD_RETURN_IF_ERROR(ShardRank(setup, rk));
  // Weights: the rank's shard of every tensor (rank_weights.h).
  VERIFYD_RETURN_IF_ERROR(FillRankWeights(setup, rk));
  VERIFYD_RETURN_IF_ERROR(AllocActivations(setup, rk));
  VERIFYD_RETURN_IF_ERROR(SetUpVerifyAttention(setup, rk));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
  size_t free_b = 0, total_b = 0;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  rk.free_bytes = free_b;
  return absl::OkStatus();
}

int64_t KvRowBytes(const ModelConfig& config, bool kv_fp8) {
  return kv_fp8 ? kernels::KvFp8RowBytes(config.kv_lora_rank, config.qk_rope_head_dim,
                                         kernels::kKvFp8Group)
                : config.latent_dim() * static_cast<int64_t>(sizeof(bf16));
}

absl::Status AllocateKvPool(const ModelConfig& config, int64_t kv_slots, bool kv_fp8,
                            CudaRankContext& rk) {
  rk.kv_fp8 = kv_fp8;
  rk.kv_row_bytes = KvRowBytes(config, kv_fp8);
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    absl::StatusOr<uint8_t*> p = rk.Alloc<uint8_t>(kv_slots * rk.kv_row_bytes);
    if (!p.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("latent KV pool of ", kv_slots, " slots: ", p.status().message()));
    }
    // Poison: every byte 0xFF is a bf16 NaN (FP8: NaN codes and scales), so a read of a slot
    // nothing wrote shows up.
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(*p, 0xFF, kv_slots * rk.kv_row_bytes, rk.stream));
    rk.kv.push_back(*p);
  }
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
  return absl::OkStatus();
}

void FreeRankContext(CudaRankContext& rk) {
  cudaSetDevice(rk.device);
  if (rk.stream != nullptr) cudaStreamSynchronize(rk.stream);
  rk.comm.reset();
  rk.moe_gemm_gate_up.reset();
  rk.moe_gemm_down.reset();
  rk.fp8_lt.reset();
  rk.attn_gemm_qkv_a.reset();
  rk.attn_gemm_q_b.reset();
  rk.attn_gemm_o.reset();
  rk.dense_gemm_gate_up.reset();
  rk.dense_gemm_down.reset();
  rk.shared_gemm_gate_up.reset();
  rk.shared_gemm_down.reset();
  if (rk.vk_ws.device != nullptr) (void)rk.vk_ws.Free();
  for (cudaEvent_t e : rk.events) cudaEventDestroy(e);
  rk.events.clear();
  if (rk.cublas != nullptr) {
    kc::DisableFixedGemmAlgorithms(rk.cublas);
    cublasDestroy(rk.cublas);
  }
  rk.cublas = nullptr;
  for (void* p : rk.allocs) cudaFree(p);
  rk.allocs.clear();
  (void)FreeStaging(rk);
  for (void* p : rk.host_allocs) cudaFreeHost(p);
  rk.host_allocs.clear();
  if (rk.stream != nullptr) cudaStreamDestroy(rk.stream);
  rk.stream = nullptr;
}

absl::Status WaitRankStream(CudaRankContext& rk, int timeout_ms) {
  if (rk.comm) return rk.comm->Synchronize(rk.stream);
  return WaitStream(rk.stream, timeout_ms);
}

void MarkProfile(CudaRankContext& rk, ProfileCategory cat) {
  if (!rk.profiling) return;
  if (rk.events_used == rk.events.size()) {
    cudaEvent_t e;
    if (cudaEventCreate(&e) != cudaSuccess) return;
    rk.events.push_back(e);
    rk.event_cat.push_back(ProfileCategory::kOther);
  }
  cudaEventRecord(rk.events[rk.events_used], rk.stream);
  rk.event_cat[rk.events_used] = cat;
  ++rk.events_used;
}

namespace {

// The profile field a category's time adds to (kOther and any unlisted value: other_ms).
double CudaStepProfile::*CategoryMs(ProfileCategory cat) {
  // Indexed by ProfileCategory's values (rank_context.h), kOther = 0 to kSampling = 7.
  static constexpr double CudaStepProfile::*kByCategory[] = {
      &CudaStepProfile::other_ms,   &CudaStepProfile::gemm_ms,     &CudaStepProfile::attention_ms,
      &CudaStepProfile::comm_ms,    &CudaStepProfile::router_ms,   &CudaStepProfile::dispatch_ms,
      &CudaStepProfile::experts_ms, &CudaStepProfile::sampling_ms,
  };
  static_assert(std::size(kByCategory) == static_cast<size_t>(ProfileCategory::kSampling) + 1);
  const auto i = static_cast<size_t>(cat);
  return i < std::size(kByCategory) ? kByCategory[i] : &CudaStepProfile::other_ms;
}

}  // namespace

absl::Status CollectProfile(CudaRankContext& rk) {
  CudaStepProfile p;
  for (size_t i = 0; i + 1 < rk.events_used; ++i) {
    float ms = 0;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, rk.events[i], rk.events[i + 1]));
    p.*CategoryMs(rk.event_cat[i]) += ms;
    p.total_ms += ms;
  }
  if (rk.moe_touched != nullptr) {
    std::vector<int32_t> touched(rk.layers.size());
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        touched.data(), rk.moe_touched, touched.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (int32_t t : touched) p.experts_touched += t;
  }
  rk.profile = p;
  return absl::OkStatus();
}

}  // namespace verifyd::tp
