// The CUDA engine's internal state (CudaEngine::Impl) and the step plan's host-side forms,
// shared by cuda_engine.cc (creation, the public API) and engine_step.cc (one step: plan
// upload, the decoder loop on every rank, acceptance, results). Not a public header.
// Thread-safety: see cuda_engine.h (Step calls serialised by step_mu).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/sampling/sampling.h"
#include "kernels/cuda/verify_attention/api.h"
#include "tp/batch_plan.h"
#include "tp/comm_model.h"
#include "tp/cuda/cuda_engine.h"
#include "tp/cuda/mla_layer.h"
#include "tp/cuda/rank_context.h"
#include "tp/rank_group.h"
#include "tp/step.h"

namespace verifyd::tp {

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

// The step's verify attention plan (kernels/cuda/verify_attention/api.h), made once on the
// Step thread for ranks[0]'s device and head slice (CudaEngine::Impl::PlanStepAttention);
// every rank with the same device and head count uploads it, one that differs plans for itself.
struct StepAttentionPlan {
  int num_heads = 0;
  kernels::cuda::VerifyAttentionDeviceInfo device;
  kernels::cuda::VerifyAttentionPlan plan;
};

// Sampling, logprobs, hidden states and the attention plan of one step (tp/engine.h), planned
// on the Step thread and shared read-only with the ranks.
struct StepExtras {
  std::vector<kernels::cuda::SampleRowSpec> specs;  // rows to draw and / or give logprobs for
  std::vector<int32_t> spec_request;                // [specs] the request of each spec
  // Hidden-state capture on rank 0 (tp/step.h PlanHiddenCaptures).
  using Capture = HiddenCapture;
  std::vector<std::vector<Capture>> by_layer;  // [layers] or empty
  std::vector<int64_t> hidden_base;            // [batch] first float of each request
  int64_t hidden_floats = 0;
  std::shared_ptr<const StepAttentionPlan> attention;  // null: every rank plans (or fallback)
};

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
  // Forward's phases (engine_step.cc): the plan arena to the device and the step's scalars;
  // the attention parameters and plan; embedding, layers and LM head; the logits gather and
  // sampling; acceptance (rank 0) and the copy out.
  absl::Status UploadStep(CudaRankContext& rk, const BatchPlan& plan, const PlanLayout& lay,
                          MlaStep* step);
  absl::Status SetUpAttention(CudaRankContext& rk, const BatchPlan& plan, const PlanLayout& lay,
                              const StepExtras& ex, MlaStep* step,
                              kernels::cuda::VerifyAttentionPlan* own);
  absl::Status RunDecoder(CudaRankContext& rk, const MlaStep& step, const StepExtras& ex);
  absl::Status SampleStepRows(CudaRankContext& rk, const MlaStep& step, const PlanLayout& lay,
                              bool want_logits, const StepExtras& ex);
  absl::Status AcceptAndCopyOut(CudaRankContext& rk, const MlaStep& step, const PlanLayout& lay,
                                const StepExtras& ex);
  // RunStep's host parts: the plan arena written (pinned, grown when needed); the logits of
  // the last step from rank 0 as [R, vocab].
  absl::Status WriteHostArena(const std::vector<StepRequest>& batch, const BatchPlan& plan,
                              const PlanLayout& lay, const StepExtras& ex);
  absl::Status CopyLogits(int64_t R, std::vector<float>* logits);
  // The verify attention plan of the step for rank rk (its device, head slice, workspace).
  absl::StatusOr<kernels::cuda::VerifyAttentionPlan> PlanAttention(
      const CudaRankContext& rk, const kernels::VerifyAttentionParams& ap, const BatchPlan& plan,
      const PlanLayout& lay) const;
  // Sets ex->attention when ranks[0] runs the optimised kernel (after the host arena is
  // written: shared-prefix plans read its slot lists).
  absl::Status PlanStepAttention(const BatchPlan& plan, const PlanLayout& lay,
                                 StepExtras* ex) const;
  absl::StatusOr<std::vector<StepResult>> RunStep(const std::vector<StepRequest>& batch,
                                                  std::vector<float>* logits, StepTiming* timing);
};

}  // namespace verifyd::tp
