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
#include "kernels/cuda/dense/moe.h"
#include "kernels/cuda/dense/rope.h"
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

}  // namespace verifyd::tp
