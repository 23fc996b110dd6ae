// One step of the CUDA engine (see cuda_engine.h): the plan uploaded to every rank, the
// decoder loop (tp/cuda/mla_layer.h), sampling, acceptance, and the results.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/tree_accept_cuda.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/status.h"
#include "kernels/tree_accept.h"
#include "tp/cuda/engine_impl.h"
#include "tp/cuda/mla_layer.h"
#include "tp/cuda/recording_communicator.h"
#include "tp/sharding.h"

namespace verifyd::tp {
namespace {

namespace kc = kernels::cuda;
using Clock = std::chrono::steady_clock;

// The device plan arena's int32 array at byte offset `off`.
int32_t* DevI32(const CudaRankContext& rk, size_t off) {
  return reinterpret_cast<int32_t*>(rk.plan_dev + off);
}

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

// The verify attention's parameters of a step on a rank with `heads` heads, all but its
// device pointers (the planner reads only these).
kernels::VerifyAttentionParams StepAttentionParams(const ModelConfig& c, const BatchPlan& plan,
                                                   int64_t kv_slots, int heads, bool kv_fp8) {
  kernels::VerifyAttentionParams ap;
  ap.batch = static_cast<int>(plan.batch);
  ap.total_rows = static_cast<int>(plan.total_rows);
  ap.num_heads = heads;
  ap.qk_dim = static_cast<int>(c.latent_dim());
  ap.v_dim = static_cast<int>(c.kv_lora_rank);
  // 1 / sqrt(qk_head_dim) for plain RoPE; YaRN's mscale-corrected scale otherwise.
  ap.softmax_scale = AttentionSoftmaxScale(c);
  ap.dtype = kernels::DType::kBFloat16;
  ap.kv_slots = kv_slots;
  ap.mask_words = kMaskWords;
  ap.kv_fp8 = kv_fp8;  // the pool's format (kernels/kv_fp8.h)
  return ap;
}

bool SameDevice(const kc::VerifyAttentionDeviceInfo& a, const kc::VerifyAttentionDeviceInfo& b) {
  return a.num_sms == b.num_sms && a.cc_major == b.cc_major && a.cc_minor == b.cc_minor &&
         a.max_smem_per_block == b.max_smem_per_block && a.max_smem_per_sm == b.max_smem_per_sm;
}

// Sampling / logprobs specs and hidden-state captures of a step (tp/engine.h: a prefill chunk
// draws and gives logprobs for its last row only).
std::shared_ptr<StepExtras> PlanStepExtras(const std::vector<StepRequest>& batch,
                                           const BatchPlan& plan, const ModelConfig& config) {
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
  return extras;
}

// Logprobs, per request in row order (the specs were made in that order).
void AddLogprobs(const StepExtras& ex, const kc::SampledLogprobs* out,
                 std::vector<StepResult>* results) {
  for (size_t i = 0; i < ex.specs.size(); ++i) {
    const kc::SampleRowSpec& spec = ex.specs[i];
    if (spec.top_logprobs < 0) continue;
    const kc::SampledLogprobs& o = out[i];
    RowLogprobs lp;
    lp.token = o.token;
    lp.logprob = o.logprob;
    for (int k = 0; k < std::min(spec.top_logprobs, kernels::kMaxTopLogprobs); ++k) {
      if (o.top_tokens[k] < 0) break;
      lp.top_tokens.push_back(o.top_tokens[k]);
      lp.top_logprobs.push_back(o.top_logprobs[k]);
    }
    (*results)[ex.spec_request[i]].logprobs.push_back(std::move(lp));
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------
// The verify attention plan: made once a step (PlanStepAttention on the Step thread), read by
// every rank with the same device and head slice.

absl::StatusOr<kc::VerifyAttentionPlan> CudaEngine::Impl::PlanAttention(
    const CudaRankContext& rk, const kernels::VerifyAttentionParams& ap, const BatchPlan& plan,
    const PlanLayout& lay) const {
  // Batch-invariant steps: a positional plan, whose arithmetic for a row depends only on its
  // query and its visible keys in position order (a draft-tree node gets the bits plain
  // decoding gives that token); the planner otherwise picks the kernel and the key splits by
  // the batch's shape.
  kc::VerifyPlanOptions vo;
  if (!rk.batch_invariant) vo.config = options.cuda.verify_config;
  // Requests that share a prefix of their slot lists (forks, a common system prompt) read it
  // once per pack of requests (verify_attention/api.h "Shared prefixes").
  if (options.cuda.shared_prefix_attention && !rk.batch_invariant) {
    vo.host_kv_indices = reinterpret_cast<const int32_t*>(plan_host + lay.kv_indices);
  }
  if (rk.batch_invariant) {
    vo.positional = true;  // configuration: PositionalConfigFor(the device)
    vo.positional_shared_context = rk.shared_context_attention;
    vo.positional_split = rk.positional_split;
    vo.host_tree_mask = plan.tree_mask.data();
  }
  return kc::PlanVerifyAttention(ap, plan.q_indptr.data(), plan.kv_indptr.data(), rk.vk_info,
                                 rk.vk_ws, vo);
}

absl::Status CudaEngine::Impl::PlanStepAttention(const BatchPlan& plan, const PlanLayout& lay,
                                                 StepExtras* ex) const {
  const CudaRankContext& r0 = *ranks[0];
  if (!r0.have_vk) return absl::OkStatus();
  const kernels::VerifyAttentionParams ap =
      StepAttentionParams(config, plan, kv_slots, static_cast<int>(r0.heads.size), r0.kv_fp8);
  if (!kc::SupportsVerifyAttentionCuda(ap, r0.vk_info).ok()) return absl::OkStatus();
  absl::StatusOr<kc::VerifyAttentionPlan> p = PlanAttention(r0, ap, plan, lay);
  // Nothing has run yet: the step fails, the engine keeps serving.
  if (!p.ok()) {
    return absl::InternalError(
        absl::StrCat("cuda engine: the step's verify attention plan: ", p.status().message()));
  }
  ex->attention = std::make_shared<const StepAttentionPlan>(
      StepAttentionPlan{ap.num_heads, r0.vk_info, std::move(*p)});
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------
// The forward of one step on one rank, in its phases.

absl::Status CudaEngine::Impl::UploadStep(CudaRankContext& rk, const BatchPlan& plan,
                                          const PlanLayout& lay, MlaStep* step) {
  rk.profiling = options.cuda.profile && rk.lead;
  rk.events_used = 0;
  MarkProfile(rk, ProfileCategory::kOther);
  if (rk.profiling && rk.moe_touched != nullptr) {
    VERIFYD_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(rk.moe_touched, 0, config.num_hidden_layers * sizeof(int32_t), rk.stream));
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
  step->config = &config;
  step->tp = rk.world;
  step->kv_slots = kv_slots;
  step->rows = plan.total_rows;
  step->batch = plan.batch;
  step->sync_timeout_ms = options.comm_timeout_ms;
  step->tokens = DevI32(rk, lay.tokens);
  step->positions = DevI32(rk, lay.positions);
  step->slots = DevI32(rk, lay.slots);
  // RoPE table for the step's positions: shared by every layer.
  return ComputeRopeTable(*step, rk);
}

absl::Status CudaEngine::Impl::SetUpAttention(CudaRankContext& rk, const BatchPlan& plan,
                                              const PlanLayout& lay, const StepExtras& ex,
                                              MlaStep* step, kc::VerifyAttentionPlan* own) {
  // Attention parameters shared by every layer (only kv changes).
  kernels::VerifyAttentionParams& ap = step->attention;
  ap = StepAttentionParams(config, plan, kv_slots, static_cast<int>(rk.heads.size), rk.kv_fp8);
  ap.q = rk.qatt;
  ap.q_indptr = DevI32(rk, lay.q_indptr);
  ap.kv_indptr = DevI32(rk, lay.kv_indptr);
  ap.kv_indices = DevI32(rk, lay.kv_indices);
  ap.tree_mask = reinterpret_cast<const uint64_t*>(rk.plan_dev + lay.mask);
  ap.out = rk.olat;
  ap.stream = rk.stream;
  rk.last_verify_kernel = "fallback";
  if (!rk.have_vk) return absl::OkStatus();
  ap.kv = rk.kv.empty() ? nullptr : rk.kv[0];
  if (!kc::SupportsVerifyAttentionCuda(ap, rk.vk_info).ok()) return absl::OkStatus();
  const kc::VerifyAttentionPlan* vp = nullptr;
  if (ex.attention != nullptr && ex.attention->num_heads == ap.num_heads &&
      SameDevice(ex.attention->device, rk.vk_info)) {
    vp = &ex.attention->plan;  // the step's plan (PlanStepAttention)
  } else {
    VERIFYD_ASSIGN_OR_RETURN(*own, PlanAttention(rk, ap, plan, lay));
    vp = own;
  }
  rk.shared_prefix_packs = vp->shared_packs;
  rk.last_verify_kernel = kc::VerifyKernelConfigName(vp->config);
  VERIFYD_RETURN_IF_ERROR(kc::UploadVerifyAttentionPlan(*vp, rk.vk_ws, rk.stream));
  step->verify_plan = vp;
  return absl::OkStatus();
}

absl::Status CudaEngine::Impl::RunDecoder(CudaRankContext& rk, const MlaStep& step,
                                          const StepExtras& ex) {
  // Hidden states: the residual stream is the same on every rank after each layer (it changes
  // only by all-reduced sums), so rank 0 copies the asked rows after each asked layer into one
  // device buffer, brought to the host once at the end of the step (no gather across ranks).
  const bool capture = rk.lead && ex.hidden_floats > 0;
  if (capture) {
    VERIFYD_RETURN_IF_ERROR(
        GrowPair(rk, &rk.hidden_dev, &rk.hidden_host, &rk.hidden_capacity, ex.hidden_floats));
  }
  const int64_t hid = config.hidden_size;
  VERIFYD_RETURN_IF_ERROR(EmbedTokens(step, rk));
  // The FP8 linears' one-group offsets {0, R}: once per step for every layer.
  if (rk.fp8_offsets != nullptr) {
    VERIFYD_RETURN_IF_ERROR(kc::SingleGroupOffsetsCuda(rk.fp8_offsets, step.rows, rk.stream));
  }
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    VERIFYD_RETURN_IF_ERROR(RunMlaLayer(step, l, rk));
    if (!capture) continue;
    for (const StepExtras::Capture& cap : ex.by_layer[l]) {
      VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
          rk.hidden_dev + cap.offset, cap.stride * sizeof(float), rk.x + cap.row0 * hid,
          hid * sizeof(float), hid * sizeof(float), cap.rows, cudaMemcpyDeviceToDevice, rk.stream));
    }
  }
  return RunLmHeadArgmax(step, rk);
}

absl::Status CudaEngine::Impl::SampleStepRows(CudaRankContext& rk, const MlaStep& step,
                                              const PlanLayout& lay, bool want_logits,
                                              const StepExtras& ex) {
  // Sampled rows and logprobs need every row's full logits: all-gathered to every rank (a
  // collective) when TP > 1, then drawn on rank 0 before acceptance.
  const int64_t R = step.rows, nspecs = static_cast<int64_t>(ex.specs.size());
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
  if (!rk.lead || nspecs == 0) return absl::OkStatus();
  VERIFYD_RETURN_IF_ERROR(
      GrowPair(rk, &rk.sample_out, &rk.sample_out_host, &rk.sample_capacity, nspecs));
  kc::SampleRowsParams sp;
  sp.rows = static_cast<int>(nspecs);
  sp.specs = reinterpret_cast<const kc::SampleRowSpec*>(rk.plan_dev + lay.specs);
  sp.logits = rk.world > 1 ? rk.logits_gathered : rk.logits;
  sp.vocab = config.vocab_size;
  sp.vmax = rk.vmax;
  sp.shard_stride = R * rk.vmax;
  sp.predictions = rk.preds;
  sp.out = rk.sample_out;
  sp.stream = rk.stream;
  return kc::SampleRowsCuda(sp);
}

absl::Status CudaEngine::Impl::AcceptAndCopyOut(CudaRankContext& rk, const MlaStep& step,
                                                const PlanLayout& lay, const StepExtras& ex) {
  const int64_t R = step.rows, B = step.batch, nspecs = static_cast<int64_t>(ex.specs.size());
  kernels::TreeAcceptParams p;
  p.batch = static_cast<int>(B);
  p.row_indptr = DevI32(rk, lay.q_indptr);
  p.tokens = step.tokens;
  p.parents = DevI32(rk, lay.parents);
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
  auto copy_out = [&](void* dst, const void* src, size_t bytes) {
    return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, rk.stream);
  };
  VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h, rk.preds, rb));
  VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h + R, rk.accepted, rb));
  VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h + 2 * R, rk.kept, rb));
  VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h + 3 * R, rk.freed, rb));
  VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h + 4 * R, rk.num_accepted, bb));
  VERIFYD_CUDA_RETURN_IF_ERROR(copy_out(h + 4 * R + B, rk.bonus, bb));
  if (nspecs > 0) {
    VERIFYD_CUDA_RETURN_IF_ERROR(
        copy_out(rk.sample_out_host, rk.sample_out, nspecs * sizeof(kc::SampledLogprobs)));
  }
  if (rk.lead && ex.hidden_floats > 0) {
    VERIFYD_CUDA_RETURN_IF_ERROR(
        copy_out(rk.hidden_host, rk.hidden_dev, ex.hidden_floats * sizeof(float)));
  }
  return absl::OkStatus();
}

absl::Status CudaEngine::Impl::Forward(CudaRankContext& rk, const BatchPlan& plan,
                                       const PlanLayout& lay, bool want_logits,
                                       const StepExtras& ex) {
  MlaStep step;
  kc::VerifyAttentionPlan own_plan;  // a rank the step's plan does not fit plans for itself
  VERIFYD_RETURN_IF_ERROR(UploadStep(rk, plan, lay, &step));
  VERIFYD_RETURN_IF_ERROR(SetUpAttention(rk, plan, lay, ex, &step, &own_plan));
  VERIFYD_RETURN_IF_ERROR(RunDecoder(rk, step, ex));
  VERIFYD_RETURN_IF_ERROR(SampleStepRows(rk, step, lay, want_logits, ex));
  // Acceptance and the kept / freed slot lists, once, on rank 0; one copy out.
  if (rk.lead) VERIFYD_RETURN_IF_ERROR(AcceptAndCopyOut(rk, step, lay, ex));
  MarkProfile(rk, ProfileCategory::kOther);
  VERIFYD_RETURN_IF_ERROR(WaitRankStream(rk, options.comm_timeout_ms));
  if (rk.profiling) VERIFYD_RETURN_IF_ERROR(CollectProfile(rk));
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------
// Step.

absl::Status CudaEngine::Impl::WriteHostArena(const std::vector<StepRequest>& batch,
                                              const BatchPlan& plan, const PlanLayout& lay,
                                              const StepExtras& ex) {
  const int64_t R = plan.total_rows, B = plan.batch;
  const int64_t nspecs = static_cast<int64_t>(ex.specs.size());
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
  put(lay.specs, ex.specs.data(), nspecs * sizeof(kc::SampleRowSpec));
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
  return absl::OkStatus();
}

absl::Status CudaEngine::Impl::CopyLogits(int64_t R, std::vector<float>* logits) {
  // [world, R, Vmax] (TP > 1, gathered on every rank) or [R, Vmax] -> [R, vocab].
  const CudaRankContext& r0 = *ranks[0];
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
  return absl::OkStatus();
}

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
  const std::shared_ptr<StepExtras> extras = PlanStepExtras(batch, plan, config);
  const int64_t nspecs = static_cast<int64_t>(extras->specs.size());
  const PlanLayout lay = PlanLayout::For(R, B, static_cast<int64_t>(plan.kv_indptr.back()), nspecs);
  VERIFYD_RETURN_IF_ERROR(WriteHostArena(batch, plan, lay, *extras));

  VERIFYD_RETURN_IF_ERROR(PlanStepAttention(plan, lay, extras.get()));

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
  AddLogprobs(*extras, r0.sample_out_host, &results);
  if (want_logits) VERIFYD_RETURN_IF_ERROR(CopyLogits(R, logits));
  if (timing) {
    timing->per_rank_s = run.seconds;
    timing->total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return results;
}

}  // namespace verifyd::tp
