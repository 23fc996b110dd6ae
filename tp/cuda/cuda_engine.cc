// The CUDA engine: creation and the public API (see cuda_engine.h). The step: engine_step.cc;
// the internal state: engine_impl.h; per-rank state: rank_context.h; the decoder's kernels:
// mla_layer.h.
#include "tp/cuda/cuda_engine.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/cuda/dense/weight_gen.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/tree_accept_cuda.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/kv_fp8.h"
#include "kernels/status.h"
#include "kernels/tree_accept.h"
#include "kernels/verify_attention.h"
#include "kernels/weight_init.h"
#include "tp/batch_plan.h"
#include "tp/cuda/engine_impl.h"
#include "tp/cuda/mla_layer.h"
#include "tp/cuda/nccl_communicator.h"
#include "tp/cuda/rank_context.h"
#include "tp/cuda/rank_order_sum.h"
#include "tp/memory_plan.h"
#include "tp/presets.h"
#include "tp/rank_group.h"
#include "tp/sharding.h"
#include "tp/step.h"
#include "tp/weights.h"

namespace verifyd::tp {
namespace {

namespace kc = kernels::cuda;
using bf16 = kernels::bf16_bits;
using Clock = std::chrono::steady_clock;

// What the CUDA engine does not implement yet, refused at Create: Unimplemented naming the
// config key. MoE (kernels/cuda/moe/moe.h), YaRN and FP8 checkpoints run (FP8 weights stay
// FP8 on sm_90 where their slices are 128-aligned, else are dequantized to bf16 when loaded);
// the limits left are the MoE kernels' sizes.
absl::Status CheckCudaSupports(const ModelConfig& c) {
  auto refuse = [](const std::string& what) {
    return absl::UnimplementedError(
        absl::StrCat("cuda engine: ", what,
                     " is not implemented on the CUDA backend yet; --backend cpu runs it"));
  };
  if (c.moe.n_routed_experts > kc::kMoeMaxExperts) {
    return refuse(absl::StrCat("'n_routed_experts' = ", c.moe.n_routed_experts, " (more than ",
                               kc::kMoeMaxExperts, " experts)"));
  }
  if (c.moe.n_routed_experts > 0 && c.moe.num_experts_per_tok > kc::kMoeMaxTopK) {
    return refuse(absl::StrCat("'num_experts_per_tok' = ", c.moe.num_experts_per_tok,
                               " (more than ", kc::kMoeMaxTopK, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

CudaEngine::Impl::~Impl() {
  if (group) group->Stop();  // each rank thread frees its context on exit
  if (plan_host != nullptr) cudaFreeHost(plan_host);
}

RankGroup::Outcome CudaEngine::Impl::RunOnRanks(std::function<absl::Status(CudaRankContext&)> fn) {
  // A healthy step never takes the collective timeout; a rank that does is declared hung.
  const auto guard = std::chrono::milliseconds(2 * options.comm_timeout_ms + 1000);
  return group->Run([this, fn = std::move(fn)](int r) { return fn(*ranks[r]); },
                    RankGroup::Clock::now() + guard,
                    std::chrono::milliseconds(options.comm_timeout_ms), [this] { AbortComms(); });
}

void CudaEngine::Impl::AbortComms() {
  for (auto& r : ranks) {
    if (r->comm) r->comm->Abort();
  }
}

// ------------------------------------------------------------------------------------------
// Public API.

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

bool CudaDevicesAvailable() { return CudaDeviceCount() > 0; }

CudaEngine::CudaEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaEngine::~CudaEngine() = default;

const ModelConfig& CudaEngine::config() const { return impl_->config; }
int CudaEngine::tp_size() const { return impl_->options.tp; }
int64_t CudaEngine::kv_slots() const { return impl_->kv_slots; }
EngineLimits CudaEngine::limits() const { return impl_->limits; }
bool CudaEngine::batch_invariant() const {
  // A slice's answers are not the model's: never reported exact.
  return impl_->options.cuda.batch_invariant && impl_->options.cuda.slice_rank < 0;
}
bool CudaEngine::failed() const { return impl_->failed.load(); }

absl::StatusOr<std::vector<StepResult>> CudaEngine::Step(const std::vector<StepRequest>& batch,
                                                         StepTiming* timing) {
  return impl_->RunStep(batch, nullptr, timing);
}

absl::StatusOr<std::vector<StepResult>> CudaEngine::StepWithLogits(
    const std::vector<StepRequest>& batch, std::vector<float>* logits, StepTiming* timing) {
  if (logits == nullptr) return absl::InvalidArgumentError("logits must not be null");
  if (impl_->options.cuda.slice_rank >= 0) {
    return absl::FailedPreconditionError(
        "StepWithLogits: a slice (slice_rank) holds one rank's vocabulary rows only");
  }
  return impl_->RunStep(batch, logits, timing);
}

EngineMemory CudaEngine::memory() const { return impl_->memory; }

void CudaEngine::set_profile(bool on) {
  std::lock_guard<std::mutex> lock(impl_->step_mu);
  impl_->options.cuda.profile = on;
}

std::string CudaEngine::kv_cache_dtype() const {
  return impl_->options.kv_dtype == KvDtype::kFp8 ? "fp8_e4m3" : "bfloat16";
}

CudaLoadReport CudaEngine::load_report() const {
  CudaLoadReport r;
  if (impl_->ranks.empty()) return r;
  const CudaRankContext& rk = *impl_->ranks[0];
  if (impl_->config.moe.n_routed_experts > 0) {
    r.expert_mode = kc::ExpertPathName(rk.expert_path);
    r.local_experts = rk.local_experts;
  }
  if (rk.fp8_dense && rk.fp8_shared) {
    r.fp8_mlps = "dense, shared experts";
  } else {
    r.fp8_mlps = rk.fp8_dense ? "dense" : rk.fp8_shared ? "shared experts" : "";
  }
  r.fp8_attention = rk.fp8_attention;
  if (rk.fp8_offsets != nullptr) r.fp8_gemm = rk.fp8_lt != nullptr ? "cublaslt" : "grouped";
  return r;
}

CudaStepReport CudaEngine::last_step() const {
  std::lock_guard<std::mutex> lock(impl_->step_mu);
  CudaStepReport r;
  r.collectives = impl_->last_collectives;
  if (impl_->ranks.empty()) return r;
  const CudaRankContext& rk = *impl_->ranks[0];
  r.profile = rk.profile;
  r.shared_prefix_packs = rk.shared_prefix_packs;
  r.verify_kernel = rk.last_verify_kernel;
  return r;
}

absl::StatusOr<std::vector<float>> CudaEngine::LatentRow(int rank, int64_t layer, int32_t slot) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> step_lock(m.step_mu);
  if (rank < 0 || rank >= m.tp) return absl::InvalidArgumentError("rank out of range");
  if (layer < 0 || layer >= m.config.num_hidden_layers)
    return absl::InvalidArgumentError("layer out of range");
  if (slot < 0 || slot >= m.kv_slots) return absl::InvalidArgumentError("slot out of range");
  const int64_t lat = m.config.latent_dim();
  const int64_t kvl = m.config.kv_lora_rank;
  std::vector<uint8_t> raw;
  bool fp8 = false;
  RankGroup::Outcome run = m.RunOnRanks([&](CudaRankContext& rk) -> absl::Status {
    if (rk.rank != rank) return absl::OkStatus();
    fp8 = rk.kv_fp8;
    raw.resize(static_cast<size_t>(rk.kv_row_bytes));
    VERIFYD_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(raw.data(), static_cast<const uint8_t*>(rk.kv[layer]) + slot * rk.kv_row_bytes,
                   raw.size(), cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  });
  if (!run.status.ok()) return run.status;
  std::vector<float> out(lat);
  if (fp8) {
    kernels::KvFp8DecodeRow(raw.data(), kvl, lat - kvl, kernels::kKvFp8Group, out.data());
  } else {
    for (int64_t i = 0; i < lat; ++i) {
      bf16 b;
      std::memcpy(&b, raw.data() + 2 * i, 2);
      out[i] = kernels::Bf16ToFloat(b);
    }
  }
  return out;
}

absl::Status CudaEngine::FillLatentCacheRandom(uint64_t seed) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> step_lock(m.step_mu);
  if (m.failed.load()) return absl::UnavailableError("cuda engine: a rank failed earlier");
  const int64_t lat = m.config.latent_dim();
  return m
      .RunOnRanks([&](CudaRankContext& rk) -> absl::Status {
        // An FP8 pool: bf16 rows generated into a staging buffer a chunk at a time, then
        // stored in the format.
        constexpr int64_t kChunkRows = 65536;
        bf16* staging = nullptr;
        if (rk.kv_fp8) {
          VERIFYD_CUDA_RETURN_IF_ERROR(
              cudaMalloc(reinterpret_cast<void**>(&staging),
                         std::min(kChunkRows, m.kv_slots) * lat * sizeof(bf16)));
        }
        absl::Status st = absl::OkStatus();
        for (size_t l = 0; l < rk.kv.size() && st.ok(); ++l) {
          const int64_t chunk = rk.kv_fp8 ? kChunkRows : m.kv_slots;
          for (int64_t r0 = 0; r0 < m.kv_slots && st.ok(); r0 += chunk) {
            const int64_t rows = std::min(chunk, m.kv_slots - r0);
            kc::GenerateWeightsParams g;
            // Same values on every rank (each keeps the full latent cache).
            g.tensor_key = kernels::WeightTensorKey(
                seed, kernels::WeightNameHash(absl::StrCat("kv_pool.", l)));
            g.scale = 1.0f;
            g.rows = rows;
            g.row0 = r0;
            g.cols = lat;
            g.full_cols = lat;
            g.out = rk.kv_fp8 ? staging : static_cast<bf16*>(rk.kv[l]);
            g.ld_out = lat;
            g.stream = rk.stream;
            st = kc::GenerateWeightsCuda(g);
            if (st.ok() && rk.kv_fp8) {
              kc::KvFp8EncodeRowsParams e;
              e.rows = rows;
              e.kv_lora = static_cast<int>(m.config.kv_lora_rank);
              e.rope_dim = static_cast<int>(m.config.qk_rope_head_dim);
              e.in = staging;
              e.ld_in = lat;
              e.out = static_cast<uint8_t*>(rk.kv[l]) + r0 * rk.kv_row_bytes;
              e.stream = rk.stream;
              st = kc::KvFp8EncodeRowsCuda(e);
            }
          }
        }
        const cudaError_t sync = cudaStreamSynchronize(rk.stream);
        if (staging != nullptr) cudaFree(staging);
        VERIFYD_RETURN_IF_ERROR(st);
        VERIFYD_CUDA_RETURN_IF_ERROR(sync);
        return absl::OkStatus();
      })
      .status;
}

namespace {

// The options CudaEngine::Create checks before touching a device: InvalidArgument naming the
// field.
absl::Status ValidateCudaEngineOptions(const EngineOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (o.tp < 1) return bad("tp: ", o.tp, " must be >= 1");
  const EngineLimits& lim = o.limits;
  if (lim.max_batch < 1) return bad("max_batch: ", lim.max_batch, " must be >= 1");
  if (lim.max_tail_rows < 1 || lim.max_tail_rows > kernels::kMaxTailRows) {
    return bad("max_tail_rows: ", lim.max_tail_rows, " must be in [1, ", kernels::kMaxTailRows,
               "]");
  }
  if (lim.max_context < 0) return bad("max_context: ", lim.max_context, " must be >= 0");
  if (o.kv_slots < 0 || o.kv_slots > INT32_MAX)
    return bad("kv_slots: ", o.kv_slots, " out of range");
  const double kv_fraction = o.cuda.kv_memory_fraction;
  if (o.kv_slots == 0 && !(kv_fraction > 0 && kv_fraction < 1)) {
    return bad("kv_memory_fraction: ", kv_fraction, " must be in (0, 1)");
  }
  if (o.comm_timeout_ms <= 0) return bad("comm_timeout_ms must be > 0");
  if (o.cuda.positional_chunk_keys < 64 || o.cuda.positional_chunk_keys % 64 != 0) {
    return bad("positional_chunk_keys: ", o.cuda.positional_chunk_keys,
               " must be a positive multiple of 64");
  }
  if (o.cuda.positional_partial_rows < 4096) {
    return bad("positional_partial_rows: ", o.cuda.positional_partial_rows, " must be >= 4096");
  }
  if (o.cuda.positional_max_splits < 1 || o.cuda.positional_max_splits > 256) {
    return bad("positional_max_splits: ", o.cuda.positional_max_splits, " must be in [1, 256]");
  }
  if (o.cuda.batch_invariant && o.cuda.verify_config != EngineOptions::Cuda::VerifyKernel::kAuto) {
    return bad(
        "verify_config: a forced verify-attention configuration needs batch_invariant = false "
        "(batch-invariant steps run positional plans on the device's own kernel)");
  }

  return absl::OkStatus();
}

// The device of each local rank (every rank of tp, or the one rank of a slice) and whether the
// ranks share one device (loopback); InvalidArgument naming the field, FailedPrecondition
// without a device, Unimplemented for TP across GPUs without NCCL.
struct RankDevices {
  std::vector<int> devices;
  bool shared = false;
};
absl::StatusOr<RankDevices> ResolveRankDevices(const EngineOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  // A slice (cuda.slice_rank) runs one rank of the tp ranks, alone on one device.
  const bool slice = o.cuda.slice_rank >= 0;
  if (slice && (o.tp < 2 || o.cuda.slice_rank >= o.tp || o.tp > kMaxRankOrderSources)) {
    return bad("slice_rank: ", o.cuda.slice_rank, " needs tp in [2, ", kMaxRankOrderSources,
               "] and slice_rank < tp (tp ", o.tp, ")");
  }
  const int nranks = slice ? 1 : o.tp;
  const int ndev = CudaDeviceCount();
  if (ndev == 0) return absl::FailedPreconditionError("cuda engine: no CUDA device is visible");
  std::vector<int> devices = o.cuda.devices;
  if (devices.empty()) {
    for (int r = 0; r < nranks; ++r) devices.push_back(r);
  }
  if (static_cast<int>(devices.size()) != nranks) {
    return bad("devices: ", devices.size(), " entries for ",
               slice ? "one rank (slice_rank)" : absl::StrCat("tp ", o.tp));
  }
  for (int d : devices) {
    if (d < 0 || d >= ndev) return bad("devices: device ", d, " is not in [0, ", ndev, ")");
  }
  // Ranks sharing one device talk through the loopback communicator (every rank on that
  // device); ranks on distinct devices through NCCL.
  const bool shared_device = std::set<int>(devices.begin(), devices.end()).size() < devices.size();
  if (shared_device) {
    for (int d : devices) {
      if (d != devices[0]) {
        return bad("devices: ranks that share a GPU (loopback) must all be on one device; got ",
                   absl::StrJoin(devices, ","));
      }
    }
    if (o.tp > kMaxLoopbackRanks)
      return bad("devices: at most ", kMaxLoopbackRanks, " loopback ranks");
  } else if (!slice && o.tp > 1 && !NcclCommunicator::Available()) {
    return absl::UnimplementedError("tp > 1 on distinct GPUs needs a build with NCCL");
  }

  return RankDevices{std::move(devices), shared_device};
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(const EngineOptions& o) {
  VERIFYD_RETURN_IF_ERROR(ValidateCudaEngineOptions(o));
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  const EngineLimits& lim = o.limits;
  const double kv_fraction = o.cuda.kv_memory_fraction;
  const bool slice = o.cuda.slice_rank >= 0;
  const int nranks = slice ? 1 : o.tp;
  VERIFYD_ASSIGN_OR_RETURN(RankDevices placed, ResolveRankDevices(o));
  const std::vector<int>& devices = placed.devices;
  const bool shared_device = placed.shared;

  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.options = o;
  m.tp = nranks;
  // The model, by EngineOptions' precedence (tp/engine_options.h): a source (explicit, or a
  // checkpoint directory opened here: headers only) that each rank reads its bf16 slices from
  // through a bounded staging buffer (FillTensor, rank_context.cc), or none: the rank's slices
  // are generated on the device from the specs and the seed.
  {
    VERIFYD_ASSIGN_OR_RETURN(EngineModel model, ResolveEngineModel(o));
    m.config = std::move(model.config);
    m.source = std::move(model.source);
  }
  VERIFYD_RETURN_IF_ERROR(ValidateModelConfig(m.config));
  VERIFYD_RETURN_IF_ERROR(CheckCudaSupports(m.config));
  const bool kv_fp8 = o.kv_dtype == KvDtype::kFp8;
  if (o.cuda.fp8_staging_keys < 0 || o.cuda.fp8_staging_keys > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda.fp8_staging_keys: ", o.cuda.fp8_staging_keys, " is outside [0, 2^31)"));
  }
  if (kv_fp8 && m.config.kv_lora_rank % 4 != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "kv_dtype: fp8 on the cuda backend needs kv_lora_rank % 4 == 0 (aligned scales), got ",
        m.config.kv_lora_rank));
  }
  VERIFYD_RETURN_IF_ERROR(ValidateTpSize(m.config, o.tp));
  if (m.config.qk_rope_head_dim % 2 != 0) return bad("qk_rope_head_dim must be even");
  for (const TensorSpec& s : ModelTensorSpecs(m.config)) m.specs[s.name] = s;
  m.limits.max_batch = lim.max_batch;
  m.limits.max_tail_rows = lim.max_tail_rows;
  m.limits.max_context = lim.max_context == 0
                             ? m.config.max_position_embeddings
                             : std::min(lim.max_context, m.config.max_position_embeddings);
  RankSetup setup;
  setup.config = &m.config;
  setup.weights.host = m.source.get();
  setup.weights.specs = &m.specs;
  setup.weights.seed = o.seed;
  setup.weights.config = &m.config;
  setup.max_rows = static_cast<int64_t>(lim.max_batch) * lim.max_tail_rows;
  setup.max_batch = lim.max_batch;
  setup.use_verify_kernel = o.cuda.use_verify_kernel;
  setup.fp8_experts = o.cuda.fp8_experts;
  setup.fp8_cublaslt = o.cuda.fp8_cublaslt;
  setup.expert_parallel = o.cuda.expert_parallel;
  setup.grouped_experts = o.cuda.grouped_experts;
  setup.batch_invariant = o.cuda.batch_invariant;
  setup.shared_context_attention = o.cuda.shared_context_attention;
  setup.positional_split.chunk_keys = o.cuda.positional_chunk_keys;
  setup.positional_split.max_splits = o.cuda.positional_max_splits;
  setup.positional_partial_rows = o.cuda.positional_partial_rows;
  setup.fp8_staging_keys = kv_fp8 && !o.cuda.batch_invariant ? o.cuda.fp8_staging_keys : 0;
  setup.comm_timeout_ms = o.comm_timeout_ms;
  m.max_rows = setup.max_rows;
  if (slice) {
    setup.recording = true;
  } else if (o.tp > 1 && shared_device) {
    setup.loopback = std::make_shared<LoopbackGroup>(o.tp, o.comm_timeout_ms);
  } else if (o.tp > 1) {
    absl::StatusOr<std::string> id = NcclCommunicator::NewUniqueId();
    if (!id.ok()) return id.status();
    setup.nccl_id = *id;
    setup.nccl_group = std::make_shared<NcclGroupState>();
  }
  for (int r = 0; r < nranks; ++r) {
    auto rk = std::make_unique<CudaRankContext>();
    rk->rank = slice ? o.cuda.slice_rank : r;
    rk->device = devices[r];
    rk->world = o.tp;
    rk->lead = r == 0;
    m.ranks.push_back(std::move(rk));
  }
  m.group = std::make_unique<RankGroup>(
      nranks, [&m](int r) { cudaSetDevice(m.ranks[r]->device); },
      [&m](int r) { FreeRankContext(*m.ranks[r]); });

  // The first rank's memory plan (tp/memory_plan.h) on its device: weights, workspaces and a
  // requested KV pool that cannot fit are refused here, before anything is loaded.
  {
    size_t free_b = 0, total_b = 0;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaSetDevice(devices[0]));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
    MemoryPlanOptions po = MemoryPlanOptionsOf(o, static_cast<int64_t>(total_b));
    po.rank = slice ? o.cuda.slice_rank : 0;
    m.memory.device_bytes = static_cast<int64_t>(total_b);
    if (absl::StatusOr<MemoryPlan> plan = PlanRankMemory(m.config, po); plan.ok()) {
      if (o.kv_slots > 0 && !plan->fit.ok()) {
        return absl::Status(plan->fit.code(), absl::StrCat("cuda engine: ", plan->fit.message()));
      }
      m.memory.weight_bytes = plan->weight_bytes;
      m.memory.workspace_bytes = plan->buffer_bytes;
      m.memory.planned_before_kv_bytes = plan->weight_bytes + plan->buffer_bytes;
    }
  }

  // Phase 1: devices, communicators, weights, buffers; phase 2: the KV pool, sized from the
  // smallest free memory over the ranks.
  RankGroup::Outcome run =
      m.RunOnRanks([&setup](CudaRankContext& rk) { return InitRankContext(setup, rk); });
  if (!run.status.ok()) {
    return absl::Status(run.status.code(), absl::StrCat("cuda engine init: ", run.failure));
  }
  if (o.kv_slots > 0) {
    m.kv_slots = o.kv_slots;
  } else {
    size_t free_min = std::numeric_limits<size_t>::max();
    for (const auto& r : m.ranks) free_min = std::min(free_min, r->free_bytes);
    const double per_slot = static_cast<double>(m.config.num_hidden_layers) *
                            static_cast<double>(KvRowBytes(m.config, kv_fp8));
    m.kv_slots =
        std::min<int64_t>(INT32_MAX, static_cast<int64_t>(kv_fraction * free_min / per_slot));
    if (m.kv_slots < 1) {
      return absl::ResourceExhaustedError("cuda engine: no device memory left for the KV pool");
    }
  }
  m.memory.used_before_kv_bytes =
      m.memory.device_bytes - static_cast<int64_t>(m.ranks[0]->free_bytes);
  run = m.RunOnRanks([&m, kv_fp8](CudaRankContext& rk) {
    return AllocateKvPool(m.config, m.kv_slots, kv_fp8, rk);
  });
  if (!run.status.ok()) {
    return absl::Status(run.status.code(), absl::StrCat("cuda engine init: ", run.failure));
  }
  m.memory.kv_bytes_per_token = m.config.num_hidden_layers * KvRowBytes(m.config, kv_fp8);
  m.memory.kv_tokens = m.kv_slots;
  m.memory.kv_cache_bytes = m.kv_slots * m.memory.kv_bytes_per_token;
  return std::unique_ptr<CudaEngine>(new CudaEngine(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Engine>> CreateCudaEngine(const EngineOptions& options) {
  absl::StatusOr<std::unique_ptr<CudaEngine>> e = CudaEngine::Create(options);
  if (!e.ok()) return e.status();
  return std::unique_ptr<Engine>(std::move(*e));
}

}  // namespace verifyd::tp
