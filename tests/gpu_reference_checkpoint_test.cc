// The CUDA engine against Hugging Face transformers on the tiny reference checkpoints of
// tests/data (the same checkpoints and references as tests/tp_reference_checkpoint_test.cc,
// which checks the CPU engine to 1e-4):
//   dense         MLA, dense MLPs, plain RoPE, bf16;
//   moe_yarn      MoE (sigmoid / noaux_tc routing, groups, shared expert) + YaRN, bf16;
//   moe_yarn_fp8  the same as FP8 (dequantized to bf16 when loaded: its 32-wide experts are not
//                 whole 128 x 128 blocks);
//   moe_fp8_block128  FP8 with whole blocks: the routed and shared experts stay FP8
//                 (GpuFp8ExpertsTest);
//   moe_fp8_mlp128  the same with a 128-aligned dense MLP: every MLP stays FP8.
//   moe_fp8_attn128  the same with 128-aligned attention projections: every FP8 linear but
//                 kv_b (absorbed into per-head bf16 GEMMs) stays FP8.
//   mla576        DeepSeek-V3's latent width (kv_lora_rank 512 + rope 64) + YaRN: the only
//                 checkpoint whose attention runs through the optimised verify kernels
//                 (kernels/cuda/verify_attention; the others' 48- to 240-wide latent rows take
//                 the fallback attention), each configuration forced in turn (GpuVerifyKernels).
// For the dense and mla576 checkpoints at TP 1 and at loopback TP 2 and 4 (all ranks on device 0):
//   - prefill + greedy decoding with empty trees driven by transformers' tokens: every logit
//     row within 1.5e-2 relative (max |diff| / max |logit| and rel-L2) of transformers' float32
//     logits, every greedy token equal except at near-ties (top-2 gap below twice the measured
//     max |diff| at that position: counted and printed, never skipped);
//   - draft trees holding the true continuation and wrong siblings accept exactly the
//     reference tokens (lossless speculative decoding through the engine).
// Tolerance: the GPU engine feeds its GEMMs bf16 activations and keeps the latent cache in
// bf16 (transformers' reference is float32), hence 1.5e-2 (see kLogitTol) instead of the CPU
// engine's 1e-4. The MoE checkpoints (GpuMoeControl): with routing pinned by the bias the GPU
// engine must match the CPU engine within 3e-2; see the note above INSTANTIATE_TEST_SUITE_P.
// Also the MoE routing kernel against kernels::ref::MoeRoute (ties included) and the
// permutation's invariants.
// Label gpu; skipped with a message when no CUDA device is visible.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/kv_fp8.h"
#include "kernels/reference/moe.h"
#include "kernels/verify_attention.h"
#include "tests/gpu_test_util.h"
#include "tests/reference_checkpoint_util.h"
#include "tp/cpu/cpu_engine.h"
#include "tp/cuda/cuda_engine.h"
#include "tp/weights.h"

namespace verifyd::tp {
namespace {

using reftest::PromptRef;
using reftest::Reference;

// Relative logit error bound (max abs and L2). The target is 1e-2; bf16 activations give
// 1.18e-2 on the dense checkpoint (H200), so 1.5e-2 is asserted and the target is reported as
// not met (README, current limits).
constexpr double kLogitTol = 1.5e-2;
constexpr int64_t kKvSlots = 1024;
constexpr int kTreeDepth = 4;  // true draft tokens per tree

using VerifyKernel = EngineOptions::Cuda::VerifyKernel;

std::unique_ptr<CudaEngine> MakeEngine(const std::string& name, int tp, bool fp8_experts = true,
                                       bool expert_parallel = true, bool grouped_experts = true,
                                       KvDtype kv_dtype = KvDtype::kAuto,
                                       VerifyKernel verify_kernel = VerifyKernel::kAuto) {
  EngineOptions o;
  o.cuda.verify_config = verify_kernel;
  // A forced kernel is a batch-adaptive plan's (batch-invariant steps plan positionally).
  o.cuda.batch_invariant = verify_kernel == VerifyKernel::kAuto;
  o.kv_dtype = kv_dtype;
  o.model = reftest::CheckpointDir(name);
  o.tp = tp;
  o.cuda.fp8_experts = fp8_experts;
  o.cuda.expert_parallel = expert_parallel;
  o.cuda.grouped_experts = grouped_experts;
  o.kv_slots = kKvSlots;
  // Prompts of up to 105 tokens are prefilled (and, with their continuation, re-read for
  // hidden states) as one chain.
  o.limits.max_tail_rows = kernels::kMaxTailRows;
  if (tp > 1) o.cuda.devices.assign(tp, 0);  // loopback: every rank on device 0
  absl::StatusOr<std::unique_ptr<CudaEngine>> e = CudaEngine::Create(o);
  EXPECT_TRUE(e.ok()) << name << " tp " << tp << ": " << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

class GpuReferenceCheckpointTest : public reftest::CheckpointTpTest<CudaEngine> {
 protected:
  GpuReferenceCheckpointTest() : CheckpointTpTest("cuda ") {}
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    CheckpointTpTest::SetUp();
  }
  std::unique_ptr<CudaEngine> Make(KvDtype kv_dtype) override {
    return MakeEngine(name_, tp_, true, true, true, kv_dtype);
  }
};

// Prefill and greedy decoding with empty trees (the pending token is transformers' token, so
// positions stay comparable after a near-tie): tokens and logits of every position.
TEST_P(GpuReferenceCheckpointTest, GreedyAndLogitsMatchTransformers) {
  reftest::GreedyDecodeAndCompare(*engine_, ref_, label_, kLogitTol, kKvSlots);
}

// Hidden states (every layer's residual stream, as drafters get them) and top-5 logprobs
// against transformers: bf16 activations, so within kLogitTol (as the logits).
TEST_P(GpuReferenceCheckpointTest, HiddenStatesAndLogprobsMatchTransformers) {
  reftest::HiddenStatesAndLogprobsMatchTransformers(*engine_, ref_, label_, kLogitTol, kKvSlots);
}

// Draft trees: per round the pending token, the next kTreeDepth true tokens as a chain, at every
// depth a wrong sibling (before or after the true node), and under each wrong sibling the next
// true token (right token, wrong branch). Exactly the true chain must be accepted.
TEST_P(GpuReferenceCheckpointTest, DraftTreesAcceptTheReferenceTokens) {
  reftest::DraftTreesAcceptTheReferenceTokens(*engine_, ref_, label_, kLogitTol, kKvSlots,
                                              kTreeDepth);
}

// Control for the MoE comparisons. With e_score_correction_bias = 2 x expert index (steps
// larger than any difference of two sigmoid scores) every token routes to the same experts on
// every backend, so no routing decision can flip; the CUDA engine must then match the CPU
// engine (which matches transformers to ~2e-6) as closely as on dense models. With the
// checkpoint's own bias (small random values) the same comparison is printed: the difference
// between the two is what near-tied routing decisions flipped by bf16 activations cost.
// Logit rows of an engine against another's (`want`): relative errors, and greedy flips,
// "unexplained" unless the two tokens' logits in `want` are within twice the row's max |diff|.
struct LogitsDiff {
  double max_rel_l2 = 0, max_rel = 0;
  int64_t rows = 0, rows_over_1e2 = 0, flips = 0, unexplained = 0;

  void Add(const float* got, const float* want, int64_t V, int32_t got_token, int32_t want_token) {
    double num = 0, den = 0, mx = 0, ma = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double d = double(got[v]) - want[v];
      num += d * d;
      den += double(want[v]) * want[v];
      mx = std::max(mx, std::fabs(d));
      ma = std::max(ma, std::fabs(double(want[v])));
    }
    const double rel_l2 = std::sqrt(num / den);
    max_rel_l2 = std::max(max_rel_l2, rel_l2);
    max_rel = std::max(max_rel, mx / ma);
    ++rows;
    if (rel_l2 > 1e-2 || mx / ma > 1e-2) ++rows_over_1e2;
    if (got_token != want_token) {
      ++flips;
      if (std::fabs(double(want[want_token]) - want[got_token]) > 2 * mx) ++unexplained;
    }
  }

  // Prints "<what> over <rows> rows: ..." (the errors and greedy differences), and expects rows
  // compared, both relative errors below `tol` and every greedy difference a near-tie.
  void PrintAndExpectWithin(double tol, const std::string& what) const {
    std::printf(
        "%s over %lld rows: max rel-L2 %.3g, max rel %.3g, %lld greedy differences (%lld not "
        "near-ties)\n",
        what.c_str(), static_cast<long long>(rows), max_rel_l2, max_rel,
        static_cast<long long>(flips), static_cast<long long>(unexplained));
    EXPECT_GT(rows, 0) << what;
    EXPECT_LT(max_rel_l2, tol) << what;
    EXPECT_LT(max_rel, tol) << what;
    EXPECT_EQ(unexplained, 0) << what;
  }
};

// Every reference prompt + continuation[:-1] as one prefill chain on engines `a` and `b`
// (fresh slots each): a's logit rows against b's.
LogitsDiff CompareOnReferencePrompts(CudaEngine& a, CudaEngine& b, const Reference& ref) {
  LogitsDiff diff;
  const int64_t V = a.config().vocab_size;
  for (const PromptRef& pr : ref.prompts) {
    reftest::Slots slots(kKvSlots);
    const StepRequest q = reftest::ReferenceChain(pr, slots);
    std::vector<float> la, lb;
    auto ra = a.StepWithLogits({q}, &la);
    auto rb = b.StepWithLogits({q}, &lb);
    EXPECT_TRUE(ra.ok()) << ra.status();
    EXPECT_TRUE(rb.ok()) << rb.status();
    if (!ra.ok() || !rb.ok()) return diff;
    for (size_t r = 0; r < q.tokens.size(); ++r) {
      diff.Add(&la[r * V], &lb[r * V], V, (*ra)[0].predictions[r], (*rb)[0].predictions[r]);
    }
  }
  return diff;
}

LogitsDiff RunGpuVsCpuOnReferencePrompts(const std::string& name, bool fix_routing) {
  LogitsDiff d;
  absl::StatusOr<ModelWeights> w = LoadModelFromDirectory(reftest::CheckpointDir(name));
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return d;
  if (fix_routing) {
    for (int64_t l = 0; l < w->config.num_hidden_layers; ++l) {
      if (!w->config.IsMoeLayer(l)) continue;
      HostTensor& b = w->tensors[LayerTensorName(l, "mlp.gate.e_score_correction_bias")];
      for (size_t e = 0; e < b.data.size(); ++e) b.data[e] = 2.0f * static_cast<float>(e);
    }
  }
  auto weights = std::make_shared<const ModelWeights>(std::move(*w));
  EngineOptions o;
  o.weights = weights;
  o.kv_slots = kKvSlots;
  auto gpu = CudaEngine::Create(o);
  auto cpu = CpuEngine::Create(o);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!gpu.ok() || !cpu.ok()) return d;
  Reference ref;
  reftest::LoadReference(name, &ref);
  const int64_t V = weights->config.vocab_size;
  auto compare = [&](const std::vector<float>& g, const std::vector<float>& c,
                     const std::vector<StepResult>& rg, const std::vector<StepResult>& rc) {
    const int64_t rows = static_cast<int64_t>(c.size()) / V;
    std::vector<int32_t> pg, pc;
    for (const auto& x : rg) pg.insert(pg.end(), x.predictions.begin(), x.predictions.end());
    for (const auto& x : rc) pc.insert(pc.end(), x.predictions.begin(), x.predictions.end());
    for (int64_t r = 0; r < rows; ++r) d.Add(&g[r * V], &c[r * V], V, pg[r], pc[r]);
  };
  for (const PromptRef& pr : ref.prompts) {
    reftest::Slots slots(kKvSlots);
    const StepRequest p = reftest::ChainRequest(pr.prompt, slots);
    std::vector<float> lg, lc;
    auto rg = (*gpu)->StepWithLogits({p}, &lg);
    auto rc = (*cpu)->StepWithLogits({p}, &lc);
    EXPECT_TRUE(rg.ok() && rc.ok());
    if (!rg.ok() || !rc.ok()) return d;
    compare(lg, lc, *rg, *rc);
    std::vector<int32_t> committed = p.tail_slots;
    for (size_t i = 0; i + 1 < pr.continuation.size(); ++i) {
      const StepRequest q = reftest::DecodeStep(committed, pr.continuation[i], slots);
      rg = (*gpu)->StepWithLogits({q}, &lg);
      rc = (*cpu)->StepWithLogits({q}, &lc);
      EXPECT_TRUE(rg.ok() && rc.ok());
      if (!rg.ok() || !rc.ok()) return d;
      compare(lg, lc, *rg, *rc);
      committed.push_back(q.tail_slots[0]);
    }
  }
  std::printf(
      "%s, %s: GPU vs CPU engine over %lld rows: max rel-L2 %.3g, max rel %.3g, %lld rows over "
      "1e-2, %lld greedy flips (%lld not explained by a near-tie)\n",
      name.c_str(), fix_routing ? "routing fixed by the bias" : "checkpoint routing",
      static_cast<long long>(d.rows), d.max_rel_l2, d.max_rel,
      static_cast<long long>(d.rows_over_1e2), static_cast<long long>(d.flips),
      static_cast<long long>(d.unexplained));
  return d;
}

TEST(GpuMoeControl, RoutingFixedByTheBiasMatchesTheCpuEngine) {
  SKIP_WITHOUT_GPU();
  for (const std::string name : {"moe_yarn", "moe_yarn_fp8"}) {
    const LogitsDiff fixed = RunGpuVsCpuOnReferencePrompts(name, /*fix_routing=*/true);
    EXPECT_GT(fixed.rows, 0) << name;
    EXPECT_LT(fixed.max_rel_l2, 3e-2) << name << ": with routing fixed";
    EXPECT_EQ(fixed.unexplained, 0) << name << ": with routing fixed";
    // Informational: the checkpoint's own routing (not asserted; see above).
    RunGpuVsCpuOnReferencePrompts(name, /*fix_routing=*/false);
  }
}

// The strict comparison with transformers runs on the dense checkpoint. On the tiny MoE
// checkpoints (8 experts, small random router) many routing decisions are nearly tied, bf16
// activations flip some, and a flipped expert changes its row grossly (measured on an H200: up
// to 0.73 relative, a few greedy tokens): no tolerance separates that from a bug, so the MoE
// path is checked instead by GpuMoeControl above (routing pinned: within 2e-2 of the CPU
// engine, which equals transformers to 2e-6) and by gpu_engine_test (tiny-moe vs the CPU
// engine; lossless speculative decoding), and the MoE-vs-transformers figures are printed.
INSTANTIATE_TEST_SUITE_P(Checkpoints, GpuReferenceCheckpointTest,
                         ::testing::Combine(::testing::Values("dense", "mla576"),
                                            ::testing::Values(1, 2, 4)),
                         reftest::CheckpointTpName);

// The FP8 latent KV cache (--kv_dtype=fp8) on the GPU against transformers, as
// KvFp8CheckpointTest does on the CPU: every latent row stored in the format (c_kv e4m3 with a
// scale per 128 columns, k_pe bf16), read by the GPU attention kernels. The CPU engine with the
// same cache measured max rel logit error 8.1e-2 on the dense checkpoint (kv_lora 32: one
// scale group; peaky random weights, far more sensitive than real models), bf16 activations add
// ~1.2e-2: the CPU test's 0.15 holds (measured on an H200: max rel 8.44e-2, rel-L2 6.46e-2;
// 18 of 131 greedy tokens flipped, all at near-ties). Greedy tokens must equal transformers'
// except at counted near-ties (the printed line gives how many flipped), and draft trees must
// accept exactly the reference tokens.
constexpr double kKvFp8LogitTol = 0.15;

class GpuKvFp8CheckpointTest : public GpuReferenceCheckpointTest {
 protected:
  GpuKvFp8CheckpointTest() { kv_dtype_ = KvDtype::kFp8; }
};

TEST_P(GpuKvFp8CheckpointTest, MatchesTransformersWithinItsError) {
  reftest::GreedyDecodeAndCompare(*engine_, ref_, label_ + " kv fp8", kKvFp8LogitTol, kKvSlots);
}

TEST_P(GpuKvFp8CheckpointTest, DraftTreesAcceptTheReferenceTokens) {
  reftest::DraftTreesAcceptTheReferenceTokens(*engine_, ref_, label_ + " kv fp8", kKvFp8LogitTol,
                                              kKvSlots, kTreeDepth);
}

// The rows the GPU engine stores are the format's (every c_kv value an e4m3 code times its
// group's scale, k_pe bf16): each is a fixed point of the format's round trip, on every layer
// and rank.
TEST_P(GpuKvFp8CheckpointTest, StoredRowsAreTheFormats) {
  reftest::Slots slots(kKvSlots);
  StepRequest q = reftest::ReferenceChain(ref_.prompts[0], slots);
  q.accept = false;
  ASSERT_TRUE(engine_->Step({q}).ok());
  const ModelConfig& c = engine_->config();
  const int64_t kvl = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  int64_t changed_by_rounding = 0;
  for (int rank = 0; rank < tp_; ++rank) {
    for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
      for (const int32_t slot : q.tail_slots) {
        absl::StatusOr<std::vector<float>> row = engine_->LatentRow(rank, layer, slot);
        ASSERT_TRUE(row.ok()) << row.status();
        ASSERT_EQ(static_cast<int64_t>(row->size()), kvl + rope);
        std::vector<float> again = *row;
        kernels::KvFp8RoundTrip(again.data(), kvl, rope, kernels::kKvFp8Group);
        for (int64_t j = 0; j < kvl + rope; ++j) {
          ASSERT_EQ(again[j], (*row)[j])
              << "rank " << rank << " layer " << layer << " slot " << slot << " column " << j;
        }
        // A bf16 row is almost never a fixed point: round the row's bf16 neighbour to show
        // the check could fail (the first c_kv value moved by one bf16 step).
        std::vector<float> moved = *row;
        moved[0] = moved[0] == 0.0f ? 1e-3f : moved[0] * (1.0f + 1.0f / 128.0f);
        std::vector<float> moved_again = moved;
        kernels::KvFp8RoundTrip(moved_again.data(), kvl, rope, kernels::kKvFp8Group);
        changed_by_rounding += moved_again != moved;
      }
    }
  }
  EXPECT_GT(changed_by_rounding, 0) << "the round trip never changed a perturbed row";
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, GpuKvFp8CheckpointTest,
                         ::testing::Combine(::testing::Values("dense", "mla576"),
                                            ::testing::Values(1, 2)),
                         reftest::CheckpointTpName);

// Every configuration of the optimised verify attention, forced, through the whole engine
// against transformers on mla576 (576-wide latent rows: what the kernels take), bf16 and FP8
// caches (s64staged: the FP8 keys staged as bf16 rows first), TP 1 (8 heads a rank: decode rows
// fold 8 heads, trees 5 x 8 rows, prefill up to 105 x 8): greedy decoding and draft trees as above,
// with the bf16 / FP8 tolerances. Each step's plan must be the forced configuration (the engine's
// test API names it; kAuto: not the fallback). s64 and km16 need sm_90a.
struct KernelCase {
  KvDtype kv_dtype;
  VerifyKernel kernel;
  const char* name;  // the configuration's name (kernels/cuda/verify_attention/api.h)
};

class GpuVerifyKernels : public ::testing::TestWithParam<KernelCase> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    const KernelCase& c = GetParam();
    int dev = 0, major = 0;
    ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
    if (c.kernel != VerifyKernel::kAuto && c.kernel != VerifyKernel::kM16 && major != 9) {
      GTEST_SKIP() << c.name << " runs on sm_90a only";
    }
    ASSERT_NO_FATAL_FAILURE(reftest::LoadReference("mla576", &ref_));
    fp8_ = c.kv_dtype == KvDtype::kFp8;
    label_ = absl::StrCat("cuda mla576 ", fp8_ ? "kv fp8 " : "", c.name);
    engine_ = MakeEngine("mla576", 1, true, true, true, c.kv_dtype, c.kernel);
    ASSERT_NE(engine_, nullptr);
  }

  void ExpectLastStepOnTheKernel() {
    const std::string ran = engine_->last_step().verify_kernel;
    if (GetParam().kernel == VerifyKernel::kAuto) {
      EXPECT_NE(ran, "fallback") << label_;
    } else {
      EXPECT_EQ(ran, GetParam().name) << label_;
    }
  }

  Reference ref_;
  bool fp8_ = false;
  std::string label_;
  std::unique_ptr<CudaEngine> engine_;
};

TEST_P(GpuVerifyKernels, GreedyAndLogitsMatchTransformers) {
  reftest::GreedyDecodeAndCompare(*engine_, ref_, label_, fp8_ ? kKvFp8LogitTol : kLogitTol,
                                  kKvSlots);
  ExpectLastStepOnTheKernel();
}

TEST_P(GpuVerifyKernels, DraftTreesAcceptTheReferenceTokens) {
  reftest::DraftTreesAcceptTheReferenceTokens(
      *engine_, ref_, label_, fp8_ ? kKvFp8LogitTol : kLogitTol, kKvSlots, kTreeDepth);
  ExpectLastStepOnTheKernel();
}

INSTANTIATE_TEST_SUITE_P(
    Mla576, GpuVerifyKernels,
    ::testing::Values(KernelCase{KvDtype::kAuto, VerifyKernel::kAuto, "auto"},
                      KernelCase{KvDtype::kAuto, VerifyKernel::kM16, "m16"},
                      KernelCase{KvDtype::kAuto, VerifyKernel::kS64, "s64"},
                      KernelCase{KvDtype::kFp8, VerifyKernel::kAuto, "auto"},
                      KernelCase{KvDtype::kFp8, VerifyKernel::kS64, "s64"},
                      KernelCase{KvDtype::kFp8, VerifyKernel::kKm16, "km16"},
                      KernelCase{KvDtype::kFp8, VerifyKernel::kS64Staged, "s64staged"}),
    [](const ::testing::TestParamInfo<KernelCase>& info) {
      return absl::StrCat(info.param.kv_dtype == KvDtype::kFp8 ? "fp8_" : "bf16_", info.param.name);
    });

// moe_fp8_block128 (FP8, whole 128 x 128 blocks in the experts): the engine opened from the
// checkpoint directory keeps the routed and shared experts in FP8 (e4m3 + block scales,
// block-scaled GEMMs) and quantizes their inputs per 128 columns (W8A8, as DeepSeek-V3's own
// inference does), while transformers' reference holds the dequantized weights in float32:
// hence Fp8LogitTol. Greedy tokens must still equal transformers' except at counted near-ties,
// and draft trees must accept exactly the reference tokens. An e4m3 rounding has a relative
// error of rms ~3.6 % (uniform within half of a 1/8 step); an MLP's inputs are rounded twice
// (gate_up and down inputs), so its output moves by ~5 %. moe_fp8_block128 quantizes one MLP
// layer (its last, MoE), measured on an H200: rel-L2 5.3e-2, max rel 7.7e-2 against the
// bf16-MLP engine, 8.3e-2 max rel against transformers: hence 0.1. moe_fp8_mlp128 quantizes
// both of its MLP layers (the dense layer 0 too, whose error then passes through layer 1):
// measured rel-L2 0.107, max rel 0.134 against the bf16-MLP engine, 0.133 against
// transformers: hence 0.15. moe_fp8_attn128 also quantizes the attention projections' three
// inputs per layer (xn for the fused q_a | kv_a, the normed q_a output, the attention output
// before o_proj) through the same W8A8 GEMMs: measured on an H200 (cuBLASLt path) max rel
// 0.206, rel-L2 0.237 against transformers and 0.211 / 0.236 against the bf16-weight engine,
// greedy tokens equal except at near-ties (8 of 73 flipped, all near-ties): hence 0.3. A wrong
// scale layout measured 0.66-0.99 (kernels/cuda/fp8/fp8_gemm.h). The checkpoints' routing
// is pinned (tests/data/make_reference_checkpoints.py), so no routing decision can flip.
double Fp8LogitTol(const std::string& name) {
  if (name == "moe_fp8_attn128") return 0.3;
  return name == "moe_fp8_mlp128" ? 0.15 : 0.1;
}
// The same checkpoint with the experts in bf16 (bf16 activations through the MoE MLP as well
// as attention): measured 3.5e-2 against transformers (the dense checkpoint: 1.2e-2).
constexpr double kMoeBf16LogitTol = 5e-2;

class GpuFp8ExpertsTest : public GpuReferenceCheckpointTest {};

TEST_P(GpuFp8ExpertsTest, KeepsExpertsInFp8AndMatchesTransformers) {
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  if (major == 9) {
    EXPECT_EQ(engine_->load_report().expert_mode, "fp8 block-scaled grouped GEMMs");
    // The dense MLP (intermediate 256) is 128-aligned on every rank in moe_fp8_mlp128 and
    // moe_fp8_attn128; moe_fp8_block128's (160) is not. Every shared expert is (256). Only
    // moe_fp8_attn128's attention projections are whole blocks.
    EXPECT_EQ(engine_->load_report().fp8_mlps,
              name_ == "moe_fp8_block128" ? "shared experts" : "dense, shared experts");
    EXPECT_EQ(engine_->load_report().fp8_attention, name_ == "moe_fp8_attn128");
  }
  std::printf(
      "%s: experts run as %s; other FP8 MLPs: %s; FP8 attention projections: %s\n", label_.c_str(),
      engine_->load_report().expert_mode.c_str(),
      engine_->load_report().fp8_mlps.empty() ? "none" : engine_->load_report().fp8_mlps.c_str(),
      engine_->load_report().fp8_attention ? "yes" : "no");
  reftest::GreedyDecodeAndCompare(*engine_, ref_, label_, Fp8LogitTol(name_), kKvSlots);
}

TEST_P(GpuFp8ExpertsTest, DraftTreesAcceptTheReferenceTokens) {
  reftest::DraftTreesAcceptTheReferenceTokens(*engine_, ref_, label_, Fp8LogitTol(name_), kKvSlots,
                                              kTreeDepth);
}

// FP8 weights against the same engine with them dequantized to bf16, on the reference prompts
// (prefill + greedy steps driven by transformers' tokens). The checkpoints' routing is pinned
// and their only MoE layer is the last, so both engines route every row identically and the
// difference is the W8A8 GEMMs alone (the MLPs', and moe_fp8_attn128's attention
// projections'). Asserted: every logit row within Fp8LogitTol (rel-L2 and
// max |diff| / max |logit|); printed: the bf16 engine against transformers for comparison.
TEST_P(GpuFp8ExpertsTest, Fp8ExpertsMatchBf16Experts) {
  CudaEngine* f = engine_.get();  // FP8 experts (the default)
  std::unique_ptr<CudaEngine> b = MakeEngine(name_, tp_, /*fp8_experts=*/false);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(b->load_report().expert_mode, "fp8 block-scaled grouped GEMMs");
  EXPECT_EQ(b->load_report().fp8_mlps, "");
  EXPECT_FALSE(b->load_report().fp8_attention);
  const int64_t V = f->config().vocab_size;
  LogitsDiff diff;
  for (const PromptRef& pr : ref_.prompts) {
    reftest::Slots slots(kKvSlots);
    std::vector<int32_t> committed;
    std::vector<int32_t> seq = pr.prompt;
    seq.insert(seq.end(), pr.continuation.begin(), pr.continuation.end() - 1);
    // The prompt as one prefill, then one step per continuation token.
    size_t at = 0;
    while (at < seq.size()) {
      StepRequest q;
      q.context_slots = committed;
      const size_t n = at == 0 ? pr.prompt.size() : 1;
      for (size_t t = 0; t < n; ++t) {
        q.tokens.push_back(seq[at + t]);
        q.parents.push_back(static_cast<int32_t>(t) - 1);
        q.tail_slots.push_back(slots.Next());
      }
      q.accept = false;
      std::vector<float> lf, lb;
      auto rf = f->StepWithLogits({q}, &lf);
      auto rb = b->StepWithLogits({q}, &lb);
      ASSERT_TRUE(rf.ok()) << rf.status();
      ASSERT_TRUE(rb.ok()) << rb.status();
      for (size_t r = 0; r < n; ++r) {
        diff.Add(&lf[r * V], &lb[r * V], V, (*rf)[0].predictions[r], (*rb)[0].predictions[r]);
      }
      committed.insert(committed.end(), q.tail_slots.begin(), q.tail_slots.end());
      at += n;
    }
  }
  diff.PrintAndExpectWithin(Fp8LogitTol(name_), label_ + ": fp8 vs bf16 experts");
  // The bf16-expert engine against transformers, as strictly as the dense checkpoint.
  reftest::GreedyDecodeAndCompare(*b, ref_, label_ + " bf16 experts", kMoeBf16LogitTol, kKvSlots);
}

INSTANTIATE_TEST_SUITE_P(Fp8, GpuFp8ExpertsTest,
                         ::testing::Combine(::testing::Values("moe_fp8_block128", "moe_fp8_mlp128",
                                                              "moe_fp8_attn128"),
                                            ::testing::Values(1, 2)),
                         reftest::CheckpointTpName);

// Expert parallelism (each rank E / tp whole experts) against tensor-parallel experts (a slice
// of each on every rank), loopback TP 2 and 4, on moe_fp8_block128 (routing pinned, so no
// routing decision can differ): with the experts in bf16, and in FP8 where both layouts keep
// them FP8 (at TP 4 a 64-column slice is not a whole FP8 block, so the TP layout runs bf16
// there and that pair is not compared, which is printed). The same rows and the same routing;
// only the grouping of the fp32 sums differs, which can move a bf16 rounding of an
// activation: every logit row within 1e-2 (rel-L2 and max |diff| / max |logit|), greedy
// tokens equal except where the two tokens' logits are within twice the row's max |diff|.
TEST(GpuExpertParallel, MatchesTensorParallelExperts) {
  SKIP_WITHOUT_GPU();
  const std::string name = "moe_fp8_block128";
  Reference ref;
  reftest::LoadReference(name, &ref);
  for (const int tp : {2, 4}) {
    for (const bool fp8 : {false, true}) {
      std::unique_ptr<CudaEngine> ep = MakeEngine(name, tp, fp8, /*expert_parallel=*/true);
      std::unique_ptr<CudaEngine> tpx = MakeEngine(name, tp, fp8, /*expert_parallel=*/false);
      ASSERT_NE(ep, nullptr);
      ASSERT_NE(tpx, nullptr);
      const int64_t E = ep->config().moe.n_routed_experts;
      EXPECT_EQ(ep->load_report().local_experts, E / tp) << "tp " << tp;
      EXPECT_EQ(tpx->load_report().local_experts, E) << "tp " << tp;
      if (ep->load_report().expert_mode != tpx->load_report().expert_mode) {
        std::printf(
            "tp=%d fp8_experts=%d: not compared (expert parallel: %s; tensor-parallel "
            "experts: %s)\n",
            tp, fp8, ep->load_report().expert_mode.c_str(), tpx->load_report().expert_mode.c_str());
        EXPECT_TRUE(fp8) << "only the FP8 request may end in different paths";
        continue;
      }
      const LogitsDiff diff = CompareOnReferencePrompts(*ep, *tpx, ref);
      diff.PrintAndExpectWithin(1e-2, absl::StrCat(name, " tp=", tp, " fp8_experts=", fp8, " ",
                                                   ep->load_report().expert_mode,
                                                   ": expert-parallel vs tensor-parallel experts"));
    }
  }
}

// The per-expert cuBLAS path (GPUs without the grouped kernels) against the bf16 grouped
// GEMMs, TP 1 and loopback TP 2 (expert parallel), on moe_fp8_block128 with the experts in
// bf16: the same arithmetic up to the GEMMs' k order, so within 1e-2 (a moved bf16 rounding of
// an activation) and greedy tokens equal except at near-ties.
TEST(GpuExpertPaths, PerExpertMatchesGrouped) {
  SKIP_WITHOUT_GPU();
  const std::string name = "moe_fp8_block128";
  Reference ref;
  reftest::LoadReference(name, &ref);
  for (const int tp : {1, 2}) {
    std::unique_ptr<CudaEngine> grouped = MakeEngine(name, tp, /*fp8_experts=*/false);
    std::unique_ptr<CudaEngine> each =
        MakeEngine(name, tp, /*fp8_experts=*/false, true, /*grouped_experts=*/false);
    ASSERT_NE(grouped, nullptr);
    ASSERT_NE(each, nullptr);
    EXPECT_EQ(each->load_report().expert_mode, "bf16 per-expert cuBLAS GEMMs");
    const LogitsDiff diff = CompareOnReferencePrompts(*each, *grouped, ref);
    diff.PrintAndExpectWithin(
        1e-2, absl::StrCat(name, " tp=", tp, ": per-expert vs grouped bf16 experts"));
  }
}

// ---- The MoE kernels against the reference ---------------------------------------------------

// A device array (tests/gpu_test_util.h) poisoned when made.
template <typename T>
struct DeviceBuffer : test_util::DeviceArray<T> {
  explicit DeviceBuffer(size_t n) : test_util::DeviceArray<T>(n) {
    if (this->p != nullptr) this->Poison();
  }
};

struct RouteCase {
  int E, K, G, topk_group;
  bool norm;
  float scaling;
  float quantum;  // logits and biases are multiples of it: 0 = continuous, else many ties
};

void RunRouteCase(const RouteCase& rc, uint64_t seed, int rows) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  auto draw = [&] {
    const float x = u(rng);
    return rc.quantum > 0 ? std::round(x / rc.quantum) * rc.quantum : x;
  };
  std::vector<float> logits(rows * rc.E), bias(rc.E);
  for (float& x : logits) x = draw();
  for (float& x : bias) x = 0.1f * draw();
  kernels::ref::MoeRouting p;
  p.num_experts = rc.E;
  p.top_k = rc.K;
  p.n_group = rc.G;
  p.topk_group = rc.topk_group;
  p.norm_topk_prob = rc.norm;
  p.routed_scaling_factor = rc.scaling;
  std::vector<int32_t> want_e(rows * rc.K);
  std::vector<float> want_w(rows * rc.K);
  kernels::ref::MoeRoute(logits.data(), rows, bias.data(), p, want_e.data(), want_w.data());

  DeviceBuffer<float> d_logits(logits.size()), d_bias(bias.size()), d_w(want_w.size());
  DeviceBuffer<int32_t> d_e(want_e.size()), d_off(rc.E + 1), d_rows(want_e.size()),
      d_pos(want_e.size()),
      d_ws(kernels::cuda::MoePermuteWorkspaceInts(static_cast<int64_t>(rows) * rc.K, rc.E));
  ASSERT_NE(d_logits.p, nullptr);
  CUDA_ASSERT(d_logits.Put(logits));
  CUDA_ASSERT(d_bias.Put(bias));
  kernels::cuda::MoeRouteParams rp;
  rp.rows = rows;
  rp.num_experts = rc.E;
  rp.top_k = rc.K;
  rp.n_group = rc.G;
  rp.topk_group = rc.topk_group;
  rp.norm_topk_prob = rc.norm;
  rp.routed_scaling_factor = rc.scaling;
  rp.logits = d_logits.p;
  rp.bias = d_bias.p;
  rp.experts = d_e.p;
  rp.weights = d_w.p;
  ASSERT_TRUE(kernels::cuda::MoeRouteCuda(rp).ok());
  kernels::cuda::MoePermuteParams pp;
  pp.rows = rows;
  pp.num_experts = rc.E;
  pp.top_k = rc.K;
  pp.experts = d_e.p;
  pp.offsets = d_off.p;
  pp.perm_rows = d_rows.p;
  pp.pair_pos = d_pos.p;
  pp.workspace = d_ws.p;
  ASSERT_TRUE(kernels::cuda::MoePermuteCuda(pp).ok());
  CUDA_ASSERT(cudaDeviceSynchronize());
  std::vector<int32_t> got_e(want_e.size()), off(rc.E + 1), prow(want_e.size()), pos(want_e.size());
  std::vector<float> got_w(want_w.size());
  CUDA_ASSERT(d_e.Read(&got_e));
  CUDA_ASSERT(d_w.Read(&got_w));
  CUDA_ASSERT(d_off.Read(&off));
  CUDA_ASSERT(d_rows.Read(&prow));
  CUDA_ASSERT(d_pos.Read(&pos));
  const std::string what =
      absl::StrCat("rows=", rows, " E=", rc.E, " K=", rc.K, " G=", rc.G, " keep ", rc.topk_group,
                   " quantum ", rc.quantum, " seed ", seed);
  // Experts exactly (ties included); weights up to the sigmoid's expf (an ulp or two).
  EXPECT_EQ(got_e, want_e) << what;
  for (size_t i = 0; i < want_w.size(); ++i) {
    EXPECT_NEAR(got_w[i], want_w[i], 1e-6f * std::max(1.f, std::fabs(want_w[i])))
        << what << " " << i;
  }
  // Permutation: expert e's pairs are [off[e], off[e + 1]), rows ascending, each pair once.
  ASSERT_EQ(off[0], 0);
  ASSERT_EQ(off[rc.E], rows * rc.K);
  for (int r = 0; r < rows; ++r) {
    for (int k = 0; k < rc.K; ++k) {
      const int32_t e = got_e[r * rc.K + k], at = pos[r * rc.K + k];
      ASSERT_GE(at, off[e]) << what;
      ASSERT_LT(at, off[e + 1]) << what;
      EXPECT_EQ(prow[at], r) << what;
    }
  }
  for (int e = 0; e < rc.E; ++e) {
    for (int32_t i = off[e] + 1; i < off[e + 1]; ++i) EXPECT_LT(prow[i - 1], prow[i]) << what;
  }
}

TEST(GpuMoeKernels, RouteAndPermuteMatchReference) {
  SKIP_WITHOUT_GPU();
  const RouteCase cases[] = {
      {8, 2, 4, 2, true, 2.5f, 0.f},      // moe_yarn's shape
      {16, 4, 4, 2, true, 2.5f, 0.f},     // tiny-moe's shape
      {16, 4, 4, 2, true, 2.5f, 0.5f},    // many ties
      {64, 6, 8, 3, false, 1.f, 0.f},     // no normalisation
      {256, 8, 8, 4, true, 2.5f, 0.f},    // DeepSeek-V3's shape
      {384, 8, 1, 1, true, 2.827f, 0.f},  // Kimi-K2's shape (one group)
      {32, 3, 32, 7, true, 1.f, 0.25f},   // one expert per group, ties
  };
  for (const RouteCase& rc : cases) {
    // 97 rows: a few permutation chunks of 256 pairs; 600 rows: many.
    for (uint64_t seed : {1u, 2u}) RunRouteCase(rc, seed, seed == 1 ? 97 : 600);
  }
}

// The router's fp32 logits kernels against a double-precision host dot product, for row
// counts around their 16-row tiles (37: the one-warp-per-expert kernel; 150: beyond
// kMoeRouterKernelMaxRows, the tiled kernel with staged rows, 40 experts = one whole and one
// partial 32-expert tile), a hidden size that is not a multiple of the 512-column chunk (900)
// and one that is not a multiple of 4 (130: scalar path); a row's logits must not depend on
// how many rows share the launch, hence on which kernel ran (bit-identical).
TEST(GpuMoeKernels, RouterLogitsMatchHostAndDoNotDependOnRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const auto& [H, rows] : std::vector<std::pair<int64_t, int>>{
           {7168, 37}, {7168, 150}, {900, 150}, {130, 37}, {130, 150}}) {
    const int E = 40;
    std::vector<float> x(rows * H), w(E * H);
    for (float& v : x) v = u(rng);
    for (float& v : w) v = u(rng);
    DeviceBuffer<float> d_x(x.size()), d_w(w.size()), d_y(rows * E), d_y1(E);
    CUDA_ASSERT(d_y.Poison());  // NaN: every logit must be written
    CUDA_ASSERT(d_x.Put(x));
    CUDA_ASSERT(d_w.Put(w));
    kernels::cuda::MoeRouterLogitsParams p;
    p.rows = rows;
    p.num_experts = E;
    p.hidden = H;
    p.x = d_x.p;
    p.ldx = H;
    p.w = d_w.p;
    p.ldw = H;
    p.y = d_y.p;
    p.ldy = E;
    ASSERT_TRUE(kernels::cuda::MoeRouterLogitsCuda(p).ok());
    // Row 20 alone.
    kernels::cuda::MoeRouterLogitsParams one = p;
    one.rows = 1;
    one.x = d_x.p + 20 * H;
    one.y = d_y1.p;
    ASSERT_TRUE(kernels::cuda::MoeRouterLogitsCuda(one).ok());
    CUDA_ASSERT(cudaDeviceSynchronize());
    std::vector<float> y(rows * E), y1(E);
    CUDA_ASSERT(d_y.Read(&y));
    CUDA_ASSERT(d_y1.Read(&y1));
    for (int r = 0; r < rows; ++r) {
      for (int e = 0; e < E; ++e) {
        double want = 0, mag = 0;
        for (int64_t k = 0; k < H; ++k) {
          want += double(x[r * H + k]) * w[e * H + k];
          mag += std::fabs(double(x[r * H + k]) * w[e * H + k]);
        }
        ASSERT_NEAR(y[r * E + e], want, 1e-6 * mag)
            << "H=" << H << " rows=" << rows << " row " << r << " e " << e;
      }
    }
    for (int e = 0; e < E; ++e) {
      ASSERT_EQ(y1[e], y[20 * E + e])
          << "H=" << H << " rows=" << rows << " expert " << e << ": row 20 alone differs";
    }
  }
}

}  // namespace
}  // namespace verifyd::tp
