// The CPU engine: rank jobs, failure handling and acceptance (see cpu_engine.h).
#include "tp/cpu/cpu_engine.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "kernels/reference/sampling_ref.h"
#include "kernels/status.h"
#include "kernels/tree_accept.h"
#include "kernels/verify_attention.h"
#include "tp/batch_plan.h"
#include "tp/presets.h"
#include "tp/sharding.h"
#include "tp/step.h"

namespace verifyd::tp {

absl::StatusOr<std::unique_ptr<CpuEngine>> CpuEngine::Create(const EngineOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  const EngineLimits& lim = o.limits;
  if (o.tp < 1) return bad("tp: ", o.tp, " must be >= 1");
  if (o.kv_slots < 1 || o.kv_slots > INT32_MAX) {
    return bad("kv_slots: ", o.kv_slots, " must be in [1, 2^31)");
  }
  if (lim.max_batch < 1) return bad("max_batch: ", lim.max_batch, " must be >= 1");
  if (lim.max_tail_rows < 1 || lim.max_tail_rows > kernels::kMaxTailRows) {
    return bad("max_tail_rows: ", lim.max_tail_rows, " must be in [1, ", kernels::kMaxTailRows,
               "]");
  }
  if (lim.max_context < 0) return bad("max_context: ", lim.max_context, " must be >= 0");
  if (o.comm_timeout_ms < 1) return bad("comm_timeout_ms: ", o.comm_timeout_ms, " must be >= 1");
  if (o.cpu.step_timeout_ms < 0) {
    return bad("step_timeout_ms: ", o.cpu.step_timeout_ms, " must be >= 0");
  }
  // The weights come through a WeightSource (engine_options.h has the precedence); generated
  // ones are made whole on the host and read through an InMemoryWeightSource.
  VERIFYD_ASSIGN_OR_RETURN(EngineModel model, ResolveEngineModel(o));
  if (!model.source) {
    VERIFYD_ASSIGN_OR_RETURN(ModelWeights generated, GenerateRandomWeights(model.config, o.seed));
    model.source = std::make_shared<const InMemoryWeightSource>(std::move(generated));
  }
  const ModelConfig& config = model.config;
  VERIFYD_RETURN_IF_ERROR(ValidateTpSize(config, o.tp));

  std::unique_ptr<CpuEngine> e(new CpuEngine());
  e->config_ = config;
  e->tp_ = o.tp;
  e->kv_slots_ = o.kv_slots;
  e->kv_fp8_ = o.kv_dtype == KvDtype::kFp8;
  e->limits_.max_tail_rows = lim.max_tail_rows;
  e->limits_.max_batch = lim.max_batch;
  e->limits_.max_context = lim.max_context == 0
                               ? config.max_position_embeddings
                               : std::min(lim.max_context, config.max_position_embeddings);
  e->comm_timeout_ms_ = o.comm_timeout_ms;
  e->step_timeout_ms_ = o.cpu.step_timeout_ms;
  e->fault_hook_ = o.fault_hook;
  e->comms_ = CreateInProcessGroup(o.tp, o.comm_timeout_ms);
  // One rank after another: the peak is the shards built so far plus one block of scratch.
  for (int r = 0; r < o.tp; ++r) {
    VERIFYD_ASSIGN_OR_RETURN(RankWeights shard, ShardWeights(*model.source, o.tp, r));
    e->forwards_.push_back(std::make_unique<RankForward>(
        config, std::move(shard), e->comms_[r].get(), o.kv_slots, o.kv_dtype == KvDtype::kFp8));
  }
  e->group_ = std::make_unique<RankGroup>(o.tp);
  return e;
}

CpuEngine::~CpuEngine() {
  AbortComms();  // frees ranks waiting in a collective
  if (group_) group_->Stop();
}

void CpuEngine::AbortComms() {
  for (auto& c : comms_) c->Abort();
}

absl::StatusOr<std::vector<StepResult>> CpuEngine::Step(const std::vector<StepRequest>& batch,
                                                        StepTiming* timing) {
  return RunStep(batch, nullptr, timing);
}

absl::StatusOr<std::vector<StepResult>> CpuEngine::StepWithLogits(
    const std::vector<StepRequest>& batch, std::vector<float>* logits, StepTiming* timing) {
  if (logits == nullptr) return absl::InvalidArgumentError("StepWithLogits: logits is null");
  return RunStep(batch, logits, timing);
}

absl::StatusOr<std::vector<StepResult>> CpuEngine::RunStep(const std::vector<StepRequest>& batch,
                                                           std::vector<float>* logits,
                                                           StepTiming* timing) {
  std::lock_guard<std::mutex> step_lock(step_mu_);
  const auto t0 = std::chrono::steady_clock::now();
  if (failed_.load()) return absl::UnavailableError("cpu engine: a rank failed earlier");
  absl::StatusOr<BatchPlan> plan = BuildBatchPlan(batch, config_, limits_, kv_slots_);
  if (!plan.ok()) return plan.status();
  if (plan->total_rows == 0) {
    if (logits) logits->clear();
    return std::vector<StepResult>{};
  }
  auto shared_plan = std::make_shared<const BatchPlan>(std::move(*plan));
  const BatchPlan& p = *shared_plan;

  // Sampling, logprobs and hidden states: which rows need their full logits gathered, and
  // which residual rows rank 0 copies after which layer (tp/cpu/cpu_forward.h).
  auto extras = std::make_shared<ForwardExtras>();
  std::vector<int64_t> logit_index(p.total_rows, -1);  // plan row -> row of row_logits
  for (size_t b = 0; b < batch.size(); ++b) {
    const StepRequest& q = batch[b];
    const int32_t row0 = p.q_indptr[b], n = p.q_indptr[b + 1] - row0;
    if (q.sampling.sampled() || q.top_logprobs >= 0) {
      for (int32_t t = q.accept ? 0 : n - 1; t < n; ++t) {
        logit_index[row0 + t] = static_cast<int64_t>(extras->logit_rows.size());
        extras->logit_rows.push_back(row0 + t);
      }
    }
  }
  HiddenCapturePlan captures = PlanHiddenCaptures(batch, p, config_);
  extras->by_layer = std::move(captures.by_layer);
  extras->hidden_floats = captures.floats;
  const std::vector<int64_t>& hidden_base = captures.base;  // request -> its first hidden float
  const bool want_extras = !extras->logit_rows.empty() || !extras->by_layer.empty();

  // What each rank produces; shared with the jobs so that a rank that outlives a failed step
  // writes into memory that is still alive.
  struct RankOutputs {
    std::vector<std::vector<int32_t>> predictions;
    std::vector<std::vector<float>> logits;
    std::vector<std::vector<float>> row_logits;
    std::vector<float> hidden;  // rank 0's
  };
  auto outputs = std::make_shared<RankOutputs>();
  outputs->predictions.resize(tp_);
  outputs->logits.resize(tp_);
  outputs->row_logits.resize(tp_);
  const bool want_logits = logits != nullptr;
  const int64_t step = step_index_++;
  RankGroup::Job job = [this, shared_plan, outputs, want_logits, step, extras,
                        want_extras](int r) -> absl::Status {
    absl::Status s;
    if (fault_hook_) s = fault_hook_(r, step);
    if (s.ok() && failed_.load()) s = absl::UnavailableError("engine already failed");
    if (s.ok()) {
      s = forwards_[r]->Forward(*shared_plan, &outputs->predictions[r],
                                want_logits ? &outputs->logits[r] : nullptr,
                                want_extras ? extras.get() : nullptr, &outputs->row_logits[r],
                                r == 0 ? &outputs->hidden : nullptr);
    }
    if (!s.ok()) {
      group_->ClaimFailure(r);  // this rank, not one that then sees the aborted collective
      comms_[r]->Abort();       // the other ranks stop waiting for this one
    }
    return s;
  };
  std::optional<RankGroup::Clock::time_point> deadline;
  if (step_timeout_ms_ > 0) deadline = t0 + std::chrono::milliseconds(step_timeout_ms_);
  RankGroup::Outcome run =
      group_->Run(std::move(job), deadline, std::chrono::milliseconds(comm_timeout_ms_),
                  [this] { AbortComms(); });
  std::string failure = run.failure;
  if (failure.empty()) {
    for (int r = 1; r < tp_; ++r) {
      if (outputs->predictions[r] != outputs->predictions[0]) {
        failure = absl::StrCat("rank ", r, " predictions differ from rank 0's");
        break;
      }
    }
  }
  if (!failure.empty()) {
    failed_.store(true);
    AbortComms();
    return absl::UnavailableError(absl::StrCat("cpu engine step failed: ", failure));
  }
  std::vector<int32_t>& preds = outputs->predictions[0];
  if (logits) *logits = std::move(outputs->logits[0]);
  if (timing) timing->per_rank_s = run.seconds;

  // Sampled rows: the draw replaces the argmax (before acceptance, so acceptance is coupled).
  const int64_t V = config_.vocab_size;
  const std::vector<float>& row_logits = outputs->row_logits[0];
  for (size_t b = 0; b < batch.size(); ++b) {
    if (!batch[b].sampling.sampled()) continue;
    for (int32_t r = p.q_indptr[b]; r < p.q_indptr[b + 1]; ++r) {
      if (logit_index[r] < 0) continue;
      const int32_t tok = kernels::ref::SampleToken(row_logits.data() + logit_index[r] * V, V,
                                                    batch[b].sampling, int64_t{p.positions[r]} + 1);
      if (tok < 0) {
        return absl::InternalError(absl::StrCat("cpu engine: row ", r, " has no finite logit"));
      }
      preds[r] = tok;
    }
  }

  // Acceptance, once, from the predictions every rank agrees on (over every request: a
  // prefill chunk's is not read), then each request's result (tp/step.h).
  const int64_t R = p.total_rows, B = static_cast<int64_t>(batch.size());
  std::vector<int32_t> accepted(R), kept(R), freed(R), num_accepted(B), bonus(B);
  kernels::TreeAcceptParams ap;
  ap.batch = static_cast<int>(B);
  ap.row_indptr = p.q_indptr.data();
  ap.tokens = p.tokens.data();
  ap.parents = p.parents.data();
  ap.predictions = preds.data();
  ap.tail_slots = p.tail_slots.data();
  ap.accepted = accepted.data();
  ap.num_accepted = num_accepted.data();
  ap.bonus = bonus.data();
  ap.kept_slots = kept.data();
  ap.freed_slots = freed.data();
  if (absl::Status s = kernels::TreeAcceptReference(ap); !s.ok()) {
    return absl::InternalError(absl::StrCat("tree acceptance: ", s.message()));
  }
  const StepAcceptance acceptance{accepted.data(), kept.data(), freed.data(), num_accepted.data(),
                                  bonus.data()};
  std::vector<StepResult> results = AssembleStepResults(
      batch, p, preds.data(), acceptance, outputs->hidden.data(), hidden_base, config_.hidden_size);
  for (size_t b = 0; b < batch.size(); ++b) {
    if (batch[b].top_logprobs < 0) continue;
    for (int32_t r = p.q_indptr[b]; r < p.q_indptr[b + 1]; ++r) {
      if (logit_index[r] < 0) continue;
      kernels::ref::TokenLogprobs lp = kernels::ref::ComputeLogprobs(
          row_logits.data() + logit_index[r] * V, V, batch[b].sampling.temperature,
          batch[b].sampling.sampled(), preds[r], batch[b].top_logprobs);
      results[b].logprobs.push_back(
          RowLogprobs{lp.token, lp.logprob, std::move(lp.top_tokens), std::move(lp.top_logprobs)});
    }
  }
  if (timing) {
    timing->total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return results;
}

std::vector<float> CpuEngine::LatentRow(int rank, int64_t layer, int32_t slot) const {
  const int64_t lat = config_.latent_dim();
  const float* base = forwards_.at(rank)->kv_layer(layer) + int64_t{slot} * lat;
  return std::vector<float>(base, base + lat);
}

absl::StatusOr<std::unique_ptr<Engine>> CreateCpuEngine(const EngineOptions& options) {
  absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(options);
  if (!e.ok()) return e.status();
  return std::unique_ptr<Engine>(std::move(*e));
}

}  // namespace verifyd::tp
