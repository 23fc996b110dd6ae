// The CUDA engine: creation, the step (plan upload, the decoder loop, acceptance) and the
// rank jobs (see cuda_engine.h). Per-rank state: rank_context.h; the decoder's kernels:
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
#include "kernels/cuda/dense/moe.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/cuda/dense/weight_gen.h"
#include "kernels/cuda/tree_accept_cuda.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/kv_fp8.h"
#include "kernels/status.h"
#include "kernels/tree_accept.h"
#include "kernels/verify_attention.h"
#include "kernels/weight_init.h"
#include "tp/batch_plan.h"
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

// Offsets (bytes) of the step plan's arrays in one arena (host pinned and device copies).
struct PlanLayout {
  size_t mask = 0, tokens = 0, positions = 0, slots = 0, parents = 0, q_indptr = 0, kv_indptr = 0,
         kv_indices = 0, specs = 0, total = 0;
  static PlanLayout For(int64_t rows, int64_t batch, int64_t kv_total, int64_t specs = 0) {
    PlanLayout l;
    size_t o = 0;
    auto take = [&o](size_t bytes) {
      const size_t at = o;
      o += (bytes + 255) / 256 * 256;
      return at;
    };
    l.mask = take(rows * kMaskWords * sizeof(uint64_t));
    l.tokens = take(rows * 4);
    l.positions = take(rows * 4);
    l.slots = take(rows * 4);
    l.parents = take(rows * 4);
    l.q_indptr = take((batch + 1) * 4);
    l.kv_indptr = take((batch + 1) * 4);
    l.kv_indices = take(std::max<int64_t>(kv_total, 1) * 4);
    l.specs = take(specs * sizeof(kernels::cuda::SampleRowSpec));
    l.total = o;
    return l;
  }
};

// EngineOptions::Cuda::verify_kernel as the planner's configuration.
kc::VerifyKernelConfig VerifyKernelConfigOf(EngineOptions::Cuda::VerifyKernel k) {
  using K = EngineOptions::Cuda::VerifyKernel;
  switch (k) {
    case K::kM16:
      return kc::VerifyKernelConfig::kM16;
    case K::kS64:
      return kc::VerifyKernelConfig::kS64;
    case K::kKm16:
      return kc::VerifyKernelConfig::kKm16;
    case K::kS64Staged:
      return kc::VerifyKernelConfig::kS64Staged;
    case K::kAuto:
      break;
  }
  return kc::VerifyKernelConfig::kAuto;
}

// What the CUDA engine does not implement yet, refused at Create: Unimplemented naming the
// config key. MoE (kernels/cuda/dense/moe.h), YaRN and FP8 checkpoints run (FP8 weights stay
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

// Sampling, logprobs and hidden states of one step (tp/engine.h), planned on the Step thread
// and shared read-only with the ranks.
struct StepExtras {
  std::vector<kc::SampleRowSpec> specs;  // rows to draw and / or give logprobs for
  std::vector<int32_t> spec_request;     // [specs] the request of each spec
  // Hidden-state capture on rank 0 (tp/step.h PlanHiddenCaptures).
  using Capture = HiddenCapture;
  std::vector<std::vector<Capture>> by_layer;  // [layers] or empty
  std::vector<int64_t> hidden_base;            // [batch] first float of each request
  int64_t hidden_floats = 0;
};

// Grows a device buffer and its pinned host copy to at least `need` elements (frees the old
// ones after draining the stream: earlier steps may still read them).
template <typename T>
absl::Status GrowPair(CudaRankContext& rk, T** dev, T** host, int64_t* capacity, int64_t need) {
  if (*capacity >= need) return absl::OkStatus();
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
  if (*dev != nullptr) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaFree(*dev));
    rk.allocs.erase(std::find(rk.allocs.begin(), rk.allocs.end(), static_cast<void*>(*dev)));
    *dev = nullptr;
  }
  if (*host != nullptr) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaFreeHost(*host));
    rk.host_allocs.erase(
        std::find(rk.host_allocs.begin(), rk.host_allocs.end(), static_cast<void*>(*host)));
    *host = nullptr;
  }
  *capacity = 0;
  const int64_t n = need + need / 4;
  absl::StatusOr<T*> d = rk.Alloc<T>(n);
  if (!d.ok()) return d.status();
  *dev = *d;
  void* h = nullptr;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h, static_cast<size_t>(n) * sizeof(T)));
  rk.host_allocs.push_back(h);
  *host = static_cast<T*>(h);
  *capacity = n;
  return absl::OkStatus();
}

}  // namespace

struct CudaEngine::Impl {
  EngineOptions options;
  ModelConfig config;
  // Host weights (explicit ones or a mapped checkpoint), read by the ranks; null: generated
  // on the device.
  std::shared_ptr<const WeightSource> source;
  std::map<std::string, TensorSpec> specs;
  int tp = 1;
  int64_t kv_slots = 0;
  EngineLimits limits;
  int64_t max_rows = 0;
  std::atomic<bool> failed{false};

  std::vector<std::unique_ptr<CudaRankContext>> ranks;
  std::unique_ptr<RankGroup> group;  // ranks[r] is used by group thread r only

  std::mutex step_mu;  // serialises Step calls and the test / benchmark APIs
  int64_t step_index = 0;
  EngineMemory memory;  // set by Create
  // A slice's collectives of the last step (RecordingCommunicator), else empty.
  std::vector<CollectiveCall> last_collectives;

  // Host plan arena (pinned), written by the Step thread before the ranks run.
  char* plan_host = nullptr;
  size_t plan_host_bytes = 0;

  ~Impl();
  // Runs fn on every rank's thread (RankGroup::Run): a rank that takes longer than twice the
  // collective timeout is declared hung; then the NCCL group is aborted.
  RankGroup::Outcome RunOnRanks(std::function<absl::Status(CudaRankContext&)> fn);
  void AbortComms();
  absl::Status Forward(CudaRankContext& rk, const BatchPlan& plan, const PlanLayout& lay,
                       bool want_logits, const StepExtras& ex);
  absl::StatusOr<std::vector<StepResult>> RunStep(const std::vector<StepRequest>& batch,
                                                  std::vector<float>* logits, StepTiming* timing);
};

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
// The forward of one step on one rank.

absl::Status CudaEngine::Impl::Forward(CudaRankContext& rk, const BatchPlan& plan,
                                       const PlanLayout& lay, bool want_logits,
                                       const StepExtras& ex) {
  const ModelConfig& c = config;
  const int64_t R = plan.total_rows, B = plan.batch;
  rk.profiling = options.cuda.profile && rk.lead;
  rk.events_used = 0;
  MarkProfile(rk, ProfileCategory::kOther);
  if (rk.profiling && rk.moe_touched != nullptr) {
    VERIFYD_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(rk.moe_touched, 0, c.num_hidden_layers * sizeof(int32_t), rk.stream));
  }

  // Plan: one copy of the whole arena (grown when a step has more context slots).
  if (rk.plan_dev_bytes < lay.total) {
    if (rk.plan_dev != nullptr) {
      VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
      VERIFYD_CUDA_RETURN_IF_ERROR(cudaFree(rk.plan_dev));
      rk.allocs.erase(std::find(rk.allocs.begin(), rk.allocs.end(), rk.plan_dev));
      rk.plan_dev = nullptr;
    }
    absl::StatusOr<char*> p = rk.Alloc<char>(static_cast<int64_t>(lay.total * 5 / 4));
    if (!p.ok()) return p.status();
    rk.plan_dev = *p;
    rk.plan_dev_bytes = lay.total * 5 / 4;
  }
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(rk.plan_dev, plan_host, lay.total, cudaMemcpyHostToDevice, rk.stream));
  auto dev_i32 = [&](size_t off) { return reinterpret_cast<int32_t*>(rk.plan_dev + off); };
  MlaStep step;
  step.config = &c;
  step.tp = rk.world;
  step.kv_slots = kv_slots;
  step.rows = R;
  step.batch = B;
  step.sync_timeout_ms = options.comm_timeout_ms;
  step.tokens = dev_i32(lay.tokens);
  step.positions = dev_i32(lay.positions);
  step.slots = dev_i32(lay.slots);
  const int32_t* d_parents = dev_i32(lay.parents);
  const int32_t* d_q_indptr = dev_i32(lay.q_indptr);

  // RoPE table for the step's positions: shared by every layer.
  VERIFYD_RETURN_IF_ERROR(ComputeRopeTable(step, rk));

  // Attention parameters shared by every layer (only kv changes).
  kernels::VerifyAttentionParams& ap = step.attention;
  ap.batch = static_cast<int>(B);
  ap.total_rows = static_cast<int>(R);
  ap.num_heads = static_cast<int>(rk.heads.size);
  ap.qk_dim = static_cast<int>(c.latent_dim());
  ap.v_dim = static_cast<int>(c.kv_lora_rank);
  // 1 / sqrt(qk_head_dim) as before for plain RoPE; YaRN's mscale-corrected scale otherwise.
  ap.softmax_scale = AttentionSoftmaxScale(c);
  ap.dtype = kernels::DType::kBFloat16;
  ap.q = rk.qatt;
  ap.kv_slots = kv_slots;
  ap.q_indptr = d_q_indptr;
  ap.kv_indptr = dev_i32(lay.kv_indptr);
  ap.kv_indices = dev_i32(lay.kv_indices);
  ap.tree_mask = reinterpret_cast<const uint64_t*>(rk.plan_dev + lay.mask);
  ap.mask_words = kMaskWords;
  ap.out = rk.olat;
  ap.stream = rk.stream;
  ap.kv_fp8 = rk.kv_fp8;  // the pool's format (kernels/kv_fp8.h)
  kc::VerifyAttentionPlan vk_plan;
  rk.last_verify_kernel = "fallback";
  if (rk.have_vk) {
    ap.kv = rk.kv.empty() ? nullptr : rk.kv[0];
    if (kc::SupportsVerifyAttentionCuda(ap, rk.vk_info).ok()) {
      // Batch-invariant steps: a positional plan, whose arithmetic for a row depends only on
      // its query and its visible keys in position order (a draft-tree node gets the bits
      // plain decoding gives that token); the planner otherwise picks the kernel and the key
      // splits by the batch's shape.
      kc::VerifyPlanOptions vo;
      if (!rk.batch_invariant) vo.config = VerifyKernelConfigOf(options.cuda.verify_kernel);
      // Requests that share a prefix of their slot lists (forks, a common system prompt)
      // read it once per pack of requests (verify_attention/api.h "Shared prefixes").
      if (options.cuda.shared_prefix_attention && !rk.batch_invariant) {
        vo.host_kv_indices = reinterpret_cast<const int32_t*>(plan_host + lay.kv_indices);
      }
      if (rk.batch_invariant) {
        vo.positional = true;  // configuration: PositionalConfigFor(the device)
        vo.positional_shared_context = rk.shared_context_attention;
        vo.positional_split = rk.positional_split;
        vo.host_tree_mask = plan.tree_mask.data();
      }
      absl::StatusOr<kc::VerifyAttentionPlan> p = kc::PlanVerifyAttention(
          ap, plan.q_indptr.data(), plan.kv_indptr.data(), rk.vk_info, rk.vk_ws, vo);
      if (!p.ok()) return p.status();
      vk_plan = std::move(*p);
      rk.shared_prefix_packs = vk_plan.shared_packs;
      rk.last_verify_kernel = kc::VerifyKernelConfigName(vk_plan.config);
      VERIFYD_RETURN_IF_ERROR(kc::UploadVerifyAttentionPlan(vk_plan, rk.vk_ws, rk.stream));
      step.verify_plan = &vk_plan;
    }
  }

  // Hidden states: the residual stream is the same on every rank after each layer (it changes
  // only by all-reduced sums), so rank 0 copies the asked rows after each asked layer into one
  // device buffer, brought to the host once at the end of the step (no gather across ranks).
  const bool capture = rk.lead && ex.hidden_floats > 0;
  if (capture) {
    VERIFYD_RETURN_IF_ERROR(
        GrowPair(rk, &rk.hidden_dev, &rk.hidden_host, &rk.hidden_capacity, ex.hidden_floats));
  }
  const int64_t hid = c.hidden_size;
  VERIFYD_RETURN_IF_ERROR(EmbedTokens(step, rk));
  // The FP8 linears' one-group offsets {0, R}: once per step for every layer.
  if (rk.fp8_offsets != nullptr) {
    VERIFYD_RETURN_IF_ERROR(kc::SingleGroupOffsetsCuda(rk.fp8_offsets, R, rk.stream));
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    VERIFYD_RETURN_IF_ERROR(RunMlaLayer(step, l, rk));
    if (!capture) continue;
    for (const StepExtras::Capture& cap : ex.by_layer[l]) {
      VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
          rk.hidden_dev + cap.offset, cap.stride * sizeof(float), rk.x + cap.row0 * hid,
          hid * sizeof(float), hid * sizeof(float), cap.rows, cudaMemcpyDeviceToDevice, rk.stream));
    }
  }
  VERIFYD_RETURN_IF_ERROR(RunLmHeadArgmax(step, rk));

  // Sampled rows and logprobs need every row's full logits: all-gathered to every rank (a
  // collective) when TP > 1, then drawn on rank 0 before acceptance.
  const int64_t nspecs = static_cast<int64_t>(ex.specs.size());
  if ((want_logits || nspecs > 0) && rk.world > 1) {
    if (rk.logits_gathered == nullptr) {
      absl::StatusOr<float*> g =
          rk.Alloc<float>(static_cast<int64_t>(rk.world) * max_rows * rk.vmax);
      if (!g.ok()) return g.status();
      rk.logits_gathered = *g;
    }
    VERIFYD_RETURN_IF_ERROR(
        rk.comm->AllGather(rk.logits, rk.logits_gathered, R * rk.vmax * sizeof(float), rk.stream));
  }
  if (rk.lead && nspecs > 0) {
    VERIFYD_RETURN_IF_ERROR(
        GrowPair(rk, &rk.sample_out, &rk.sample_out_host, &rk.sample_capacity, nspecs));
    kc::SampleRowsParams sp;
    sp.rows = static_cast<int>(nspecs);
    sp.specs = reinterpret_cast<const kc::SampleRowSpec*>(rk.plan_dev + lay.specs);
    sp.logits = rk.world > 1 ? rk.logits_gathered : rk.logits;
    sp.vocab = c.vocab_size;
    sp.vmax = rk.vmax;
    sp.shard_stride = R * rk.vmax;
    sp.predictions = rk.preds;
    sp.out = rk.sample_out;
    sp.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::SampleRowsCuda(sp));
  }
  // Acceptance and the kept / freed slot lists, once, on rank 0; one copy out.
  if (rk.lead) {
    kernels::TreeAcceptParams p;
    p.batch = static_cast<int>(B);
    p.row_indptr = d_q_indptr;
    p.tokens = step.tokens;
    p.parents = d_parents;
    p.predictions = rk.preds;
    p.tail_slots = step.slots;
    p.accepted = rk.accepted;
    p.num_accepted = rk.num_accepted;
    p.bonus = rk.bonus;
    p.kept_slots = rk.kept;
    p.freed_slots = rk.freed;
    p.stream = rk.stream;
    VERIFYD_RETURN_IF_ERROR(kc::TreeAcceptCuda(p));
    int32_t* h = reinterpret_cast<int32_t*>(rk.out_host);
    const size_t rb = R * sizeof(int32_t), bb = B * sizeof(int32_t);
    auto copy_out = [&](int32_t* dst, const int32_t* src, size_t bytes) {
      return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, rk.stream);
    };
    VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h, rk.preds, rb));
    VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h + R, rk.accepted, rb));
    VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h + 2 * R, rk.kept, rb));
    VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h + 3 * R, rk.freed, rb));
    VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h + 4 * R, rk.num_accepted, bb));
    VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h + 4 * R + B, rk.bonus, bb));
    if (nspecs > 0) {
      VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rk.sample_out_host, rk.sample_out,
                                                   nspecs * sizeof(kc::SampledLogprobs),
                                                   cudaMemcpyDeviceToHost, rk.stream));
    }
    if (capture) {
      VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rk.hidden_host, rk.hidden_dev,
                                                   ex.hidden_floats * sizeof(float),
                                                   cudaMemcpyDeviceToHost, rk.stream));
    }
  }
  MarkProfile(rk, ProfileCategory::kOther);
  VERIFYD_RETURN_IF_ERROR(WaitRankStream(rk, options.comm_timeout_ms));
  if (rk.profiling) VERIFYD_RETURN_IF_ERROR(CollectProfile(rk));
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------
// Step.

absl::StatusOr<std::vector<StepResult>> CudaEngine::Impl::RunStep(
    const std::vector<StepRequest>& batch, std::vector<float>* logits, StepTiming* timing) {
  std::lock_guard<std::mutex> step_lock(step_mu);
  const auto t0 = Clock::now();
  if (failed.load()) return absl::UnavailableError("cuda engine: a rank failed earlier");
  absl::StatusOr<BatchPlan> planned =
      BuildBatchPlan(batch, config, limits, kv_slots, /*with_kv_indices=*/false);
  if (!planned.ok()) return planned.status();
  // Shared with the rank jobs by value: a rank that outlives a timed-out step still reads a
  // live plan.
  auto shared_plan = std::make_shared<const BatchPlan>(std::move(*planned));
  const BatchPlan& plan = *shared_plan;
  if (plan.total_rows == 0) {
    if (logits) logits->clear();
    return std::vector<StepResult>{};
  }
  const int64_t R = plan.total_rows, B = plan.batch;
  // Sampling / logprobs specs and hidden-state captures (tp/engine.h: a prefill chunk draws
  // and gives logprobs for its last row only).
  auto extras = std::make_shared<StepExtras>();
  for (size_t b = 0; b < batch.size(); ++b) {
    const StepRequest& q = batch[b];
    const int32_t row0 = plan.q_indptr[b], n = plan.q_indptr[b + 1] - row0;
    const bool draw = q.sampling.sampled();
    if (draw || q.top_logprobs >= 0) {
      for (int32_t t = q.accept ? 0 : n - 1; t < n; ++t) {
        kc::SampleRowSpec spec;
        spec.row = row0 + t;
        spec.draw = draw ? 1 : 0;
        spec.top_logprobs = q.top_logprobs;
        spec.top_k = q.sampling.top_k;
        spec.temperature = q.sampling.temperature;
        spec.top_p = q.sampling.top_p;
        spec.seed = q.sampling.seed;
        spec.position = int64_t{plan.positions[row0 + t]} + 1;
        extras->specs.push_back(spec);
        extras->spec_request.push_back(static_cast<int32_t>(b));
      }
    }
  }
  {
    HiddenCapturePlan captures = PlanHiddenCaptures(batch, plan, config);
    extras->by_layer = std::move(captures.by_layer);
    extras->hidden_base = std::move(captures.base);
    extras->hidden_floats = captures.floats;
  }
  const int64_t nspecs = static_cast<int64_t>(extras->specs.size());
  const PlanLayout lay = PlanLayout::For(R, B, static_cast<int64_t>(plan.kv_indptr.back()), nspecs);
  if (plan_host_bytes < lay.total) {
    if (plan_host != nullptr) cudaFreeHost(plan_host);
    plan_host = nullptr;
    plan_host_bytes = 0;
    void* h = nullptr;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h, lay.total * 5 / 4));
    plan_host = static_cast<char*>(h);
    plan_host_bytes = lay.total * 5 / 4;
  }
  auto put = [&](size_t off, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(plan_host + off, src, bytes);
  };
  put(lay.mask, plan.tree_mask.data(), plan.tree_mask.size() * sizeof(uint64_t));
  put(lay.tokens, plan.tokens.data(), R * 4);
  put(lay.positions, plan.positions.data(), R * 4);
  put(lay.slots, plan.tail_slots.data(), R * 4);
  put(lay.parents, plan.parents.data(), R * 4);
  put(lay.q_indptr, plan.q_indptr.data(), (B + 1) * 4);
  put(lay.kv_indptr, plan.kv_indptr.data(), (B + 1) * 4);
  put(lay.specs, extras->specs.data(), nspecs * sizeof(kc::SampleRowSpec));
  // Slot lists straight from the requests into the pinned buffer (the plan holds only their
  // offsets): context slots then tail slots, per request.
  {
    size_t off = lay.kv_indices;
    for (const StepRequest& q : batch) {
      put(off, q.context_slots.data(), q.context_slots.size() * 4);
      off += q.context_slots.size() * 4;
      put(off, q.tail_slots.data(), q.tail_slots.size() * 4);
      off += q.tail_slots.size() * 4;
    }
  }

  const int64_t step_no = step_index++;
  const bool want_logits = logits != nullptr;
  RankGroup::Outcome run = RunOnRanks(
      [this, shared_plan, lay, step_no, want_logits, extras](CudaRankContext& rk) -> absl::Status {
        if (options.fault_hook) VERIFYD_RETURN_IF_ERROR(options.fault_hook(rk.rank, step_no));
        return Forward(rk, *shared_plan, lay, want_logits, *extras);
      });
  if (auto* rec = dynamic_cast<RecordingCommunicator*>(ranks[0]->comm.get())) {
    last_collectives = rec->TakeRecords();
  }
  if (!run.status.ok()) {
    failed.store(true);
    AbortComms();
    return absl::UnavailableError(absl::StrCat("cuda engine step failed: ", run.failure));
  }

  CudaRankContext& r0 = *ranks[0];
  const int32_t* h = reinterpret_cast<const int32_t*>(r0.out_host);
  const int32_t* preds = h;
  const int32_t* accepted = h + R;
  const int32_t* kept = h + 2 * R;
  const int32_t* freed = h + 3 * R;
  const int32_t* num_acc = h + 4 * R;
  const int32_t* bonus = h + 4 * R + B;
  for (int64_t r = 0; r < R; ++r) {
    if (preds[r] < 0) {
      return absl::InternalError(absl::StrCat("cuda forward: row ", r, " has no finite logit"));
    }
  }
  const StepAcceptance acceptance{accepted, kept, freed, num_acc, bonus};
  std::vector<StepResult> results = AssembleStepResults(
      batch, plan, preds, acceptance, r0.hidden_host, extras->hidden_base, config.hidden_size);
  // Logprobs, per request in row order (the specs were made in that order).
  for (int64_t i = 0; i < nspecs; ++i) {
    const kc::SampleRowSpec& spec = extras->specs[i];
    if (spec.top_logprobs < 0) continue;
    const kc::SampledLogprobs& o = r0.sample_out_host[i];
    RowLogprobs lp;
    lp.token = o.token;
    lp.logprob = o.logprob;
    for (int k = 0; k < std::min(spec.top_logprobs, kernels::kMaxTopLogprobs); ++k) {
      if (o.top_tokens[k] < 0) break;
      lp.top_tokens.push_back(o.top_tokens[k]);
      lp.top_logprobs.push_back(o.top_logprobs[k]);
    }
    results[extras->spec_request[i]].logprobs.push_back(std::move(lp));
  }
  if (want_logits) {
    // [world, R, Vmax] (TP > 1, gathered on every rank) or [R, Vmax] -> [R, vocab].
    const int64_t V = config.vocab_size, vmax = r0.vmax;
    std::vector<float> raw(static_cast<size_t>(tp) * R * vmax);
    const float* src = tp > 1 ? r0.logits_gathered : r0.logits;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaSetDevice(r0.device));
    VERIFYD_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(raw.data(), src, raw.size() * sizeof(float), cudaMemcpyDeviceToHost));
    logits->assign(R * V, 0.f);
    for (int k = 0; k < tp; ++k) {
      const ShardRange vr = VocabShard(V, tp, k);
      for (int64_t r = 0; r < R; ++r) {
        std::memcpy(logits->data() + r * V + vr.begin, raw.data() + (k * R + r) * vmax,
                    vr.size * sizeof(float));
      }
    }
  }
  if (timing) {
    timing->per_rank_s = run.seconds;
    timing->total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return results;
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

std::vector<CollectiveCall> CudaEngine::last_collectives() const {
  std::lock_guard<std::mutex> lock(impl_->step_mu);
  return impl_->last_collectives;
}

void CudaEngine::set_profile(bool on) {
  std::lock_guard<std::mutex> lock(impl_->step_mu);
  impl_->options.cuda.profile = on;
}

CudaStepProfile CudaEngine::last_profile() const {
  std::lock_guard<std::mutex> lock(impl_->step_mu);
  return impl_->ranks.empty() ? CudaStepProfile{} : impl_->ranks[0]->profile;
}

int64_t CudaEngine::local_experts() const {
  if (impl_->config.moe.n_routed_experts == 0 || impl_->ranks.empty()) return 0;
  return impl_->ranks[0]->local_experts;
}

std::string CudaEngine::expert_mode() const {
  if (impl_->config.moe.n_routed_experts == 0 || impl_->ranks.empty()) return "";
  return kc::ExpertPathName(impl_->ranks[0]->expert_path);
}

std::string CudaEngine::fp8_mlps() const {
  if (impl_->ranks.empty()) return "";
  const CudaRankContext& rk = *impl_->ranks[0];
  if (rk.fp8_dense && rk.fp8_shared) return "dense, shared experts";
  return rk.fp8_dense ? "dense" : rk.fp8_shared ? "shared experts" : "";
}

int CudaEngine::last_shared_prefix_packs() const {
  return impl_->ranks.empty() ? 0 : impl_->ranks[0]->shared_prefix_packs;
}

std::string CudaEngine::last_verify_kernel() const {
  return impl_->ranks.empty() ? "" : impl_->ranks[0]->last_verify_kernel;
}

std::string CudaEngine::kv_cache_dtype() const {
  return impl_->options.kv_dtype == KvDtype::kFp8 ? "fp8_e4m3" : "bfloat16";
}

bool CudaEngine::fp8_attention() const {
  return !impl_->ranks.empty() && impl_->ranks[0]->fp8_attention;
}

std::string CudaEngine::fp8_gemm() const {
  if (impl_->ranks.empty()) return "";
  const CudaRankContext& rk = *impl_->ranks[0];
  if (rk.fp8_offsets == nullptr) return "";
  return rk.fp8_lt != nullptr ? "cublaslt" : "grouped";
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

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(const EngineOptions& o) {
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
  if (o.cuda.batch_invariant && o.cuda.verify_kernel != EngineOptions::Cuda::VerifyKernel::kAuto) {
    return bad(
        "verify_kernel: a forced verify-attention kernel needs batch_invariant = false "
        "(batch-invariant steps run positional plans on the device's own kernel)");
  }

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
