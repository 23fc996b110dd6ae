// The CUDA engine (tp/cuda/cuda_engine.h) against the CPU engine on the same seeded models, and
// its session-level behaviour:
//   - logits of a prefill chunk and of a draft-tree step within a stated tolerance of the CPU
//     engine's, and the same greedy tokens on a fixed seed set except at near-ties that the
//     measured logit error explains (counted and printed; at most 10 %), for `tiny` (kv_lora 64 +
//     rope 16: the fallback attention) and `tiny576` (kv_lora 512 + rope 64: the optimised
//     verify kernel's shape) and `tiny-moe` (a dense layer, two MoE layers, YaRN: the GPU
//     MoE kernels and YaRN RoPE table), with the weights generated on the GPU from the seed;
//   - the same through host weights uploaded from GenerateRandomWeights (loader path);
//   - lossless speculative decoding on the GPU (speculative == plain greedy), with the
//     mismatch rate printed; a mismatch is allowed only at a near-tie of the top two logits;
//   - KV slot accounting: kept + freed = the tail slots, pool exhaustion refused before the
//     step, invalid input writes no KV, every slot free after the sessions close;
//   - a failed rank makes the engine Unavailable for good.
// Tolerance: the GPU engine keeps the residual stream and GEMM accumulation in fp32 but feeds
// the GEMMs bf16 activations and stores the latent cache in bf16 (the CPU engine keeps fp32
// everywhere), so logits differ by ~bf16 rounding: relative L2 error per step < 3e-2.
// Label gpu; skipped with a message when no CUDA device is visible.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/moe/grouped_gemm.h"
#include "kernels/cuda/sampling/argmax.h"
#include "kernels/kv_fp8.h"
#include "tests/gpu_test_util.h"
#include "tests/model_dims_util.h"
#include "tests/speculative_rounds_util.h"
#include "tp/cpu/cpu_engine.h"
#include "tp/cuda/cuda_engine.h"
#include "tp/presets.h"

namespace verifyd::tp {
namespace {

constexpr double kLogitRelTol = 3e-2;
// Latent rows of the FP8 cache, GPU vs CPU engine (both dequantized): each side rounds its
// own values (bf16 activations vs fp32) to e4m3 codes, a code step is 6-12 % of a value, and
// near a rounding boundary the two pick neighbouring codes. Rows differ by a few such steps.
constexpr double kKvFp8LatentTol = 6e-2;

// A small model with the real latent width (kv_lora 512 + rope 64 = 576), so the optimised
// verify kernel runs; few layers, heads and hidden units so the CPU engine stays fast.
ModelConfig Tiny576() {
  ModelConfig c;
  c.name = "tiny576";
  c.max_position_embeddings = 4096;
  // vocab 512, hidden 256, 2 layers, 8 heads, q_lora 96, kv_lora 512, nope 32, rope 64, v 32,
  // intermediate 384.
  return test_util::WithDims(c, {512, 256, 2, 8, 96, 512, 32, 64, 32, 384});
}

// tiny-moe widened to 128-aligned slices with an FP8 quantization_config: generated weights
// are FP8 codes + block scales (tp::IsFp8QuantizedWeight) and the GPU keeps them in FP8 (routed
// and shared experts, dense MLP, attention projections but kv_b).
ModelConfig TinyMoeFp8() {
  ModelConfig c = *PresetConfig("tiny-moe");
  c.name = "tiny-moe-fp8";
  c.hidden_size = 256;
  c.q_lora_rank = 128;
  c.intermediate_size = 256;
  c.moe.moe_intermediate_size = 128;
  c.quant.method = "fp8";
  c.quant.fmt = "e4m3";
  c.quant.block_rows = 128;
  c.quant.block_cols = 128;
  return c;
}

ModelConfig ConfigByName(const std::string& name) {
  if (name == "tiny576") return Tiny576();
  if (name == "tiny-moe-fp8") return TinyMoeFp8();
  return *PresetConfig(name);
}

// tp > 1: every rank on device 0 (the loopback communicator).
using VerifyKernel = EngineOptions::Cuda::VerifyKernel;
std::unique_ptr<CudaEngine> MakeGpu(const ModelConfig& c, uint64_t seed, int64_t kv,
                                    bool host_weights = false, int tp = 1, bool kv_fp8 = false,
                                    VerifyKernel verify_kernel = VerifyKernel::kAuto,
                                    bool batch_invariant = true) {
  EngineOptions o;
  if (kv_fp8) o.kv_dtype = KvDtype::kFp8;
  o.cuda.verify_config = verify_kernel;
  // A forced kernel is a batch-adaptive plan's (batch-invariant steps plan positionally).
  o.cuda.batch_invariant = batch_invariant && verify_kernel == VerifyKernel::kAuto;
  if (host_weights) {
    auto w = GenerateRandomWeights(c, seed);
    if (!w.ok()) return nullptr;
    o.weights = std::make_shared<const ModelWeights>(std::move(*w));
  } else {
    o.config = std::make_shared<const ModelConfig>(c);
  }
  o.seed = seed;
  o.kv_slots = kv;
  o.limits.max_batch = 8;
  o.tp = tp;
  if (tp > 1) o.cuda.devices.assign(tp, 0);
  auto e = CudaEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

std::unique_ptr<CpuEngine> MakeCpu(const ModelConfig& c, uint64_t seed, int64_t kv,
                                   bool kv_fp8 = false) {
  EngineOptions o;
  if (kv_fp8) o.kv_dtype = KvDtype::kFp8;
  auto w = GenerateRandomWeights(c, seed);
  if (!w.ok()) return nullptr;
  o.weights = std::make_shared<const ModelWeights>(std::move(*w));
  o.kv_slots = kv;
  o.limits.max_batch = 8;
  auto e = CpuEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// A free list of KV slots, handed out in a shuffled order (scattered slots, page size 1).
class SlotPool {
 public:
  SlotPool(int64_t capacity, uint64_t seed) : capacity_(capacity) {
    for (int64_t i = 0; i < capacity; ++i) free_.push_back(static_cast<int32_t>(i));
    std::mt19937 rng(seed);
    std::shuffle(free_.begin(), free_.end(), rng);
  }
  // All or nothing: n slots, or an empty vector when fewer are free.
  std::vector<int32_t> Take(size_t n) {
    if (free_.size() < n) return {};
    std::vector<int32_t> out(free_.end() - n, free_.end());
    free_.resize(free_.size() - n);
    return out;
  }
  void Free(const std::vector<int32_t>& s) { free_.insert(free_.end(), s.begin(), s.end()); }
  int64_t free_count() const { return static_cast<int64_t>(free_.size()); }
  int64_t capacity() const { return capacity_; }

 private:
  int64_t capacity_;
  std::vector<int32_t> free_;
};

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

// One step's inputs for the logits comparison: a prefill chunk per request, then a random
// draft tree on top of it. Slots are fixed (the same for both engines).
struct TwoSteps {
  std::vector<StepRequest> prefill, tree;
};
TwoSteps MakeTwoSteps(std::mt19937& rng, int vocab, int requests) {
  TwoSteps s;
  int32_t next = 0;
  for (int b = 0; b < requests; ++b) {
    StepRequest p;
    const int n = 5 + static_cast<int>(rng() % 60);
    p.tokens = RandomTokens(rng, n, vocab);
    for (int t = 0; t < n; ++t) {
      p.parents.push_back(t - 1);
      p.tail_slots.push_back(next + 3 * t);  // scattered
    }
    next += 3 * n;
    p.accept = false;
    s.prefill.push_back(p);
  }
  for (int b = 0; b < requests; ++b) {
    StepRequest q;
    q.context_slots = s.prefill[b].tail_slots;
    const int n = 1 + static_cast<int>(rng() % 65);
    q.tokens = RandomTokens(rng, n, vocab);
    for (int t = 0; t < n; ++t) {
      q.parents.push_back(t == 0 ? -1 : static_cast<int32_t>(rng() % t));
      q.tail_slots.push_back(next + 3 * t + 1);
    }
    next += 3 * n;
    s.tree.push_back(q);
  }
  return s;
}

struct Compare {
  double rel_l2 = 0, max_abs = 0;
  int64_t token_mismatches = 0, unexplained = 0, rows = 0;
};

// Top-2 gap of a row of logits.
double TopGap(const float* row, int64_t vocab) {
  float a = -INFINITY, b = -INFINITY;
  for (int64_t j = 0; j < vocab; ++j) {
    if (row[j] > a) {
      b = a;
      a = row[j];
    } else if (row[j] > b) {
      b = row[j];
    }
  }
  return a - b;
}

// Logit error and greedy agreement. A row where the GPU picks another token than the CPU is
// "explained" when the CPU logits of the two tokens differ by at most twice the row's largest
// GPU-CPU logit difference (then the measured error alone can swap them: a near-tie).
void CompareLogits(const std::vector<float>& gpu, const std::vector<float>& cpu,
                   const std::vector<int32_t>& gpu_pred, const std::vector<int32_t>& cpu_pred,
                   int64_t vocab, Compare* c) {
  ASSERT_EQ(gpu.size(), cpu.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i])) << "GPU logit " << i << " is not finite";
    const double d = double(gpu[i]) - cpu[i];
    num += d * d;
    den += double(cpu[i]) * cpu[i];
    c->max_abs = std::max(c->max_abs, std::fabs(d));
  }
  c->rel_l2 = std::max(c->rel_l2, std::sqrt(num / den));
  for (size_t r = 0; r < cpu_pred.size(); ++r) {
    ++c->rows;
    if (gpu_pred[r] == cpu_pred[r]) continue;
    ++c->token_mismatches;
    double row_err = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      row_err = std::max(row_err, std::fabs(double(gpu[r * vocab + j]) - cpu[r * vocab + j]));
    }
    const double cpu_margin = double(cpu[r * vocab + cpu_pred[r]]) - cpu[r * vocab + gpu_pred[r]];
    if (cpu_margin > 2 * row_err) {
      ++c->unexplained;
      ADD_FAILURE() << "row " << r << ": GPU token " << gpu_pred[r] << " vs CPU " << cpu_pred[r]
                    << ", CPU margin " << cpu_margin << " > 2 x row logit error " << row_err;
    }
  }
}

std::vector<int32_t> AllPredictions(const std::vector<StepResult>& r) {
  std::vector<int32_t> p;
  for (const auto& x : r) p.insert(p.end(), x.predictions.begin(), x.predictions.end());
  return p;
}

// kv_fp8: both engines store the latent cache in the FP8 format (kernels/kv_fp8.h).
// verify_kernel: the GPU engine's verify attention configuration (kAuto: the planner's).
// logit_tol / latent_tol > 0 replace the default tolerances (FP8 weights: W8A8 GEMMs).
void RunGpuVsCpu(const std::string& model, bool host_weights, bool kv_fp8 = false,
                 VerifyKernel verify_kernel = VerifyKernel::kAuto, double logit_tol = 0,
                 double latent_tol_override = 0) {
  const ModelConfig cfg = ConfigByName(model);
  Compare cmp;
  for (uint64_t seed : {1u, 2u, 3u}) {
    auto gpu = MakeGpu(cfg, seed, 4096, host_weights, /*tp=*/1, kv_fp8, verify_kernel);
    auto cpu = MakeCpu(cfg, seed, 4096, kv_fp8);
    ASSERT_NE(gpu, nullptr);
    ASSERT_NE(cpu, nullptr);
    std::mt19937 rng(100 + seed);
    const TwoSteps s = MakeTwoSteps(rng, static_cast<int>(cfg.vocab_size), 4);
    for (const auto* batch : {&s.prefill, &s.tree}) {
      std::vector<float> lg, lc;
      auto rg = gpu->StepWithLogits(*batch, &lg);
      auto rc = cpu->StepWithLogits(*batch, &lc);
      ASSERT_TRUE(rg.ok()) << rg.status();
      ASSERT_TRUE(rc.ok()) << rc.status();
      CompareLogits(lg, lc, AllPredictions(*rg), AllPredictions(*rc), cfg.vocab_size, &cmp);
      // Acceptance is decided from the predictions: equal predictions, equal acceptance.
      if (AllPredictions(*rg) == AllPredictions(*rc)) {
        for (size_t b = 0; b < batch->size(); ++b) {
          EXPECT_EQ((*rg)[b].accepted_rows, (*rc)[b].accepted_rows);
          EXPECT_EQ((*rg)[b].bonus, (*rc)[b].bonus);
          EXPECT_EQ((*rg)[b].kept_slots, (*rc)[b].kept_slots);
          EXPECT_EQ((*rg)[b].freed_slots, (*rc)[b].freed_slots);
        }
      }
    }
    // The latent rows written agree too (bf16 cache vs fp32 cache). With the FP8 cache the
    // GPU's rows must be the format's values: rounding them through it again moves nothing
    // beyond the last bits of a recomputed scale (a bf16 row would move by up to ~6 %).
    double num = 0, den = 0;
    int64_t off_format = 0;
    for (int32_t slot : s.tree[0].tail_slots) {
      const auto g = gpu->LatentRow(0, cfg.num_hidden_layers - 1, slot);
      const auto c = cpu->LatentRow(0, cfg.num_hidden_layers - 1, slot);
      ASSERT_TRUE(g.ok()) << g.status();
      for (size_t i = 0; i < c.size(); ++i) {
        num += (double((*g)[i]) - c[i]) * (double((*g)[i]) - c[i]);
        den += double(c[i]) * c[i];
      }
      if (kv_fp8) {
        std::vector<float> again = *g;
        kernels::KvFp8RoundTrip(again.data(), cfg.kv_lora_rank, cfg.qk_rope_head_dim,
                                kernels::kKvFp8Group);
        for (size_t i = 0; i < again.size(); ++i) {
          off_format += std::fabs(again[i] - (*g)[i]) > 1e-5f * std::fabs((*g)[i]);
        }
      }
    }
    EXPECT_EQ(off_format, 0) << "GPU latent values off the FP8 format, seed " << seed;
    // MoE models: a near-tied routing decision that bf16 activations flip changes that row's
    // residual and so its later latent rows (gpu_reference_checkpoint_test's GpuMoeControl shows
    // the GPU MoE path within 2e-2 of the CPU engine when routing cannot flip); measured 3.7e-2
    // on tiny-moe seed 2, hence a wider bound for the latent rows of MoE models only.
    // FP8 cache: a value that bf16 activations move across a rounding boundary of its e4m3
    // code changes by a whole step (1/8 of its binade): KvFp8LatentTol.
    const double latent_tol = latent_tol_override > 0        ? latent_tol_override
                              : kv_fp8                       ? kKvFp8LatentTol
                              : cfg.moe.n_routed_experts > 0 ? 5e-2
                                                             : kLogitRelTol;
    EXPECT_LT(std::sqrt(num / den), latent_tol) << "latent rows, seed " << seed;
  }
  std::printf(
      "%s%s%s: logits rel L2 %.3g, max abs %.3g; greedy tokens %lld / %lld differ "
      "(%lld not explained by a near-tie)\n",
      model.c_str(), host_weights ? " (host weights)" : "", kv_fp8 ? " (fp8 kv)" : "", cmp.rel_l2,
      cmp.max_abs, static_cast<long long>(cmp.token_mismatches), static_cast<long long>(cmp.rows),
      static_cast<long long>(cmp.unexplained));
  EXPECT_LT(cmp.rel_l2, logit_tol > 0 ? logit_tol : kLogitRelTol) << model;
  EXPECT_EQ(cmp.unexplained, 0) << model;
  // On the CPU engine ~2 % of tiny's rows have a top-2 gap under 0.02 and ~6 % under 0.05
  // (measured, seeds 1-3): bf16 activations flip a few of those. More than 10 % of rows would
  // mean a systematic error, not rounding.
  EXPECT_LE(cmp.token_mismatches * 10, cmp.rows) << model;
}

TEST(GpuEngine, MatchesCpuEngineTiny) {
  SKIP_WITHOUT_GPU();
  RunGpuVsCpu("tiny", false);
}
TEST(GpuEngine, MatchesCpuEngineTiny576VerifyKernelShape) {
  SKIP_WITHOUT_GPU();
  RunGpuVsCpu("tiny576", false);
}
// --kv_dtype=fp8 on both engines: the FP8 KV write and the FP8 attention kernels (tiny576:
// the 16-row FP8 verify kernel; tiny: the fallback attention) against the CPU engine's FP8
// cache, with the same tolerances on logits and greedy tokens.
TEST(GpuEngine, MatchesCpuEngineFp8KvCache) {
  SKIP_WITHOUT_GPU();
  RunGpuVsCpu("tiny576", false, /*kv_fp8=*/true);
  RunGpuVsCpu("tiny", false, /*kv_fp8=*/true);
}
// The same with every verify attention of the GPU engine on the seesaw FP8 variant (kS64 with
// an FP8 cache: f16 tiles converted in the kernel), which kAuto picks only for many rows over
// many keys (>= 64 rows a request and rows x keys >= 2^22, beyond these small steps): the
// prefill chunks (5-64 rows of 8 heads) and the draft trees (1-65 nodes) all run it. sm_90a
// only (skipped on other GPUs, where the planner refuses the forced configuration).
TEST(GpuEngine, MatchesCpuEngineFp8KvCacheSeesawVariant) {
  SKIP_WITHOUT_GPU();
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  if (major != 9) GTEST_SKIP() << "the seesaw FP8 variant runs on sm_90a only";
  RunGpuVsCpu("tiny576", false, /*kv_fp8=*/true, VerifyKernel::kS64);
}
// Forks of one 1,500-token context in one step (a decode row or a small draft tree each):
// the verify attention packs them and reads the shared prefix once per pack (8 heads: up to
// 8 rows of requests per 64-row tile); logits and greedy tokens match the CPU engine.
// Batch-adaptive steps (shared-prefix packing is theirs).
TEST(GpuEngine, SharedPrefixForksMatchCpuEngine) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = Tiny576();
  auto gpu = MakeGpu(cfg, 7, 4096, false, 1, false, VerifyKernel::kAuto,
                     /*batch_invariant=*/false);
  auto cpu = MakeCpu(cfg, 7, 4096);
  ASSERT_NE(gpu, nullptr);
  ASSERT_NE(cpu, nullptr);
  std::mt19937 rng(77);
  const int vocab = static_cast<int>(cfg.vocab_size);
  std::vector<int32_t> context;
  int32_t next = 0;
  while (context.size() < 1500) {  // the shared context, prefilled in chunks of 60
    StepRequest p;
    p.context_slots = context;
    p.tokens = RandomTokens(rng, 60, vocab);
    for (int t = 0; t < 60; ++t) {
      p.parents.push_back(t - 1);
      p.tail_slots.push_back(next++);
    }
    p.accept = false;
    ASSERT_TRUE(gpu->Step({p}).ok());
    ASSERT_TRUE(cpu->Step({p}).ok());
    context.insert(context.end(), p.tail_slots.begin(), p.tail_slots.end());
  }
  std::vector<StepRequest> forks(8);
  for (StepRequest& q : forks) {
    q.context_slots = context;
    const int n = 1 + static_cast<int>(rng() % 4);
    q.tokens = RandomTokens(rng, n, vocab);
    for (int t = 0; t < n; ++t) {
      q.parents.push_back(t == 0 ? -1 : static_cast<int32_t>(rng() % t));
      q.tail_slots.push_back(next++);
    }
    q.accept = false;
  }
  std::vector<float> lg, lc;
  auto rg = gpu->StepWithLogits(forks, &lg);
  auto rc = cpu->StepWithLogits(forks, &lc);
  ASSERT_TRUE(rg.ok()) << rg.status();
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_GT(gpu->last_step().shared_prefix_packs, 0) << "the forks were not packed";
  Compare cmp;
  CompareLogits(lg, lc, AllPredictions(*rg), AllPredictions(*rc), cfg.vocab_size, &cmp);
  std::printf("forks: %d packs; logits rel L2 %.3g, %lld / %lld greedy tokens differ\n",
              gpu->last_step().shared_prefix_packs, cmp.rel_l2,
              static_cast<long long>(cmp.token_mismatches), static_cast<long long>(cmp.rows));
  EXPECT_LT(cmp.rel_l2, kLogitRelTol);
  EXPECT_EQ(cmp.unexplained, 0);
}

TEST(GpuEngine, MatchesCpuEngineTinyMoeYarn) {
  SKIP_WITHOUT_GPU();
  RunGpuVsCpu("tiny-moe", false);
}
TEST(GpuEngine, MatchesCpuEngineTinyMoeYarnHostWeights) {
  SKIP_WITHOUT_GPU();
  RunGpuVsCpu("tiny-moe", true);
}
TEST(GpuEngine, MatchesCpuEngineWithHostWeights) {
  SKIP_WITHOUT_GPU();
  RunGpuVsCpu("tiny", true);
}

// Weights generated on the device as FP8 (codes + block scales, kept FP8 on sm_90) against the
// CPU engine on the host generator's dequantized values: the same model. The GPU quantizes the
// inputs of every FP8 GEMM to e4m3 per 128 columns (W8A8, as DeepSeek-V3's inference does; the
// CPU engine keeps them in fp32): gpu_reference_checkpoint_test measured rel-L2 up to 0.24
// against transformers when the attention projections and MLPs all run W8A8 (its
// moe_fp8_attn128, bound 0.3), hence the same bound for the logits and the latent rows here;
// greedy tokens must still agree but at near-ties.
TEST(GpuEngine, MatchesCpuEngineFp8GeneratedWeights) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = TinyMoeFp8();
  {
    auto gpu = MakeGpu(cfg, 1, 4096);
    ASSERT_NE(gpu, nullptr);
    if (kernels::cuda::GroupedGemmAvailable(0)) {
      EXPECT_EQ(gpu->load_report().expert_mode, "fp8 block-scaled grouped GEMMs");
      EXPECT_TRUE(gpu->load_report().fp8_attention);
      EXPECT_EQ(gpu->load_report().fp8_mlps, "dense, shared experts");
    }
  }
  RunGpuVsCpu("tiny-moe-fp8", false, false, VerifyKernel::kAuto, 0.3, 0.3);
}

// One rank run alone (cuda.slice_rank): it steps, its collectives are recorded (the
// vocabulary-parallel embedding's reduction, two layer reductions a layer, each rank-order: an
// all-gather of [rows, hidden] fp32; then the argmax pairs' gather), a step with logits is
// refused, and the memory report is filled.
TEST(GpuEngine, SliceRankRecordsCollectives) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = TinyMoeFp8();
  EngineOptions o;
  o.config = std::make_shared<const ModelConfig>(cfg);
  o.seed = 5;
  o.kv_slots = 1024;
  o.limits.max_batch = 8;
  o.tp = 2;
  o.cuda.slice_rank = 1;
  auto e = CudaEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->tp_size(), 2);
  EXPECT_FALSE((*e)->batch_invariant());  // a slice is never reported exact
  EXPECT_EQ((*e)->load_report().local_experts, cfg.moe.n_routed_experts / 2);
  std::mt19937 rng(9);
  const TwoSteps s = MakeTwoSteps(rng, static_cast<int>(cfg.vocab_size), 4);
  for (const auto* batch : {&s.prefill, &s.tree}) {
    auto r = (*e)->Step(*batch);
    ASSERT_TRUE(r.ok()) << r.status();
    int64_t rows = 0;
    for (const auto& q : *batch) rows += static_cast<int64_t>(q.tokens.size());
    const std::vector<CollectiveCall> calls = (*e)->last_step().collectives;
    ASSERT_EQ(static_cast<int64_t>(calls.size()), 2 * cfg.num_hidden_layers + 2);
    for (size_t i = 0; i + 1 < calls.size(); ++i) {
      EXPECT_EQ(calls[i].kind, CollectiveKind::kAllGather) << i;
      EXPECT_EQ(calls[i].bytes, rows * cfg.hidden_size * 4) << i;
    }
    EXPECT_EQ(calls.back().bytes, rows * static_cast<int64_t>(sizeof(kernels::cuda::ArgmaxPair)));
  }
  std::vector<float> logits;
  EXPECT_EQ((*e)->StepWithLogits(s.tree, &logits).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const EngineMemory m = (*e)->memory();
  EXPECT_GT(m.device_bytes, 0);
  EXPECT_GT(m.weight_bytes, 0);
  EXPECT_GT(m.used_before_kv_bytes, 0);
  EXPECT_EQ(m.kv_tokens, 1024);
  EXPECT_EQ(m.kv_cache_bytes, 1024 * m.kv_bytes_per_token);
  // Profiled: the split adds up and the touched experts are counted.
  (*e)->set_profile(true);
  ASSERT_TRUE((*e)->Step(s.tree).ok());
  const CudaStepProfile p = (*e)->last_step().profile;
  EXPECT_GT(p.experts_touched, 0);
  EXPECT_LE(p.experts_touched, 2 * (*e)->load_report().local_experts);  // two MoE layers
  EXPECT_GT(p.router_ms, 0);
  EXPECT_GT(p.experts_ms, 0);
  EXPECT_NEAR(p.attention_ms + p.gemm_ms + p.router_ms + p.dispatch_ms + p.experts_ms +
                  p.sampling_ms + p.comm_ms + p.other_ms,
              p.total_ms, 1e-3 * p.total_ms + 1e-3);

  o.cuda.slice_rank = 2;  // not a rank of tp 2
  EXPECT_EQ(CudaEngine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// A requested KV pool that the memory plan shows cannot fit is refused before the load.
TEST(GpuEngine, KvPoolThatCannotFitIsRefusedBeforeLoad) {
  SKIP_WITHOUT_GPU();
  EngineOptions o;
  o.model = "tiny";
  o.kv_slots = INT32_MAX;  // 2^31 tokens x 2 layers x 160 bytes: far beyond any GPU
  auto e = CudaEngine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(e.status().message().find("memory plan"), std::string::npos) << e.status();
}

// ---- Sessions over the engine: prefill, verify rounds, close --------------------------------

struct Sess {
  std::vector<int32_t> committed;  // context slots
  int32_t pending = -1;
  std::vector<int32_t> emitted;  // next_token, then accepted tokens + bonus per round
  std::vector<double> gaps;      // top-2 gap of the logits that chose each emitted token
};

// Prefills every prompt (chunks of at most `chunk` rows, all sessions in one batch per chunk).
void Prefill(CudaEngine& e, SlotPool& pool, const std::vector<std::vector<int32_t>>& prompts,
             int chunk, std::vector<Sess>* out) {
  out->assign(prompts.size(), Sess{});
  size_t done = 0;
  for (size_t off = 0; done < prompts.size(); off += chunk) {
    std::vector<StepRequest> batch;
    std::vector<size_t> who;
    for (size_t s = 0; s < prompts.size(); ++s) {
      if (off >= prompts[s].size()) continue;
      const size_t n = std::min<size_t>(chunk, prompts[s].size() - off);
      StepRequest q;
      q.context_slots = (*out)[s].committed;
      q.tokens.assign(prompts[s].begin() + off, prompts[s].begin() + off + n);
      for (size_t t = 0; t < n; ++t) q.parents.push_back(static_cast<int32_t>(t) - 1);
      q.tail_slots = pool.Take(n);
      ASSERT_EQ(q.tail_slots.size(), n);
      q.accept = false;
      batch.push_back(q);
      who.push_back(s);
    }
    std::vector<float> logits;
    auto r = e.StepWithLogits(batch, &logits);
    ASSERT_TRUE(r.ok()) << r.status();
    size_t row = 0;
    for (size_t i = 0; i < who.size(); ++i) {
      Sess& se = (*out)[who[i]];
      se.committed.insert(se.committed.end(), (*r)[i].kept_slots.begin(), (*r)[i].kept_slots.end());
      row += batch[i].tokens.size();
      if (off + batch[i].tokens.size() >= prompts[who[i]].size()) {
        se.pending = (*r)[i].bonus;
        se.emitted = {se.pending};
        se.gaps = {TopGap(&logits[(row - 1) * e.config().vocab_size], e.config().vocab_size)};
        ++done;
      }
    }
  }
}

void CloseAll(SlotPool& pool, std::vector<Sess>* ss) {
  for (auto& s : *ss) pool.Free(s.committed);
  ss->clear();
}

// Plain greedy: empty trees (one row per session per step), logits kept for the tie check.
void PlainGreedy(CudaEngine& e, SlotPool& pool, std::vector<Sess>* ss, size_t tokens) {
  const int64_t V = e.config().vocab_size;
  while ((*ss)[0].emitted.size() < tokens) {
    std::vector<StepRequest> batch;
    for (auto& s : *ss) {
      StepRequest q;
      q.context_slots = s.committed;
      q.tokens = {s.pending};
      q.parents = {-1};
      q.tail_slots = pool.Take(1);
      ASSERT_EQ(q.tail_slots.size(), 1u);
      batch.push_back(q);
    }
    std::vector<float> logits;
    auto r = e.StepWithLogits(batch, &logits);
    ASSERT_TRUE(r.ok()) << r.status();
    for (size_t i = 0; i < ss->size(); ++i) {
      Sess& s = (*ss)[i];
      ASSERT_TRUE((*r)[i].accepted_rows.empty());
      ASSERT_EQ((*r)[i].kept_slots, batch[i].tail_slots);
      s.committed.push_back(batch[i].tail_slots[0]);
      s.pending = (*r)[i].bonus;
      s.emitted.push_back(s.pending);
      s.gaps.push_back(TopGap(&logits[i * V], V));
    }
  }
}

void RunLosslessGpu(const std::string& model, int tp = 1) {
  const ModelConfig cfg = ConfigByName(model);
  constexpr size_t kTokens = 40;
  constexpr int kSessions = 3;
  auto e = MakeGpu(cfg, 7, 4096, /*host_weights=*/false, tp);
  ASSERT_NE(e, nullptr);
  SlotPool pool(e->kv_slots(), 77);
  std::mt19937 rng(777);
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < kSessions; ++s) {
    prompts.push_back(
        RandomTokens(rng, 3 + static_cast<int>(rng() % 90), static_cast<int>(cfg.vocab_size)));
  }
  std::vector<Sess> plain;
  Prefill(*e, pool, prompts, 65, &plain);
  PlainGreedy(*e, pool, &plain, kTokens + 24);

  std::vector<Sess> ss;
  Prefill(*e, pool, prompts, 17, &ss);  // other chunking: other batch shapes
  int64_t rounds = 0, accepted = 0, compared = 0, mismatches = 0;
  std::vector<bool> diverged(kSessions, false);
  auto draft = [&](int s, StepRequest* q) {
    q->context_slots = ss[s].committed;
    q->tokens = {ss[s].pending};
    q->parents = {-1};
    const int nodes = static_cast<int>(rng() % 20);
    // plain[s].emitted[emitted.size()] is the true token after pending.
    test_util::AddDraftRows(
        rng, plain[s].emitted, ss[s].emitted.size(), !diverged[s], nodes, cfg.vocab_size,
        [&] { return rng() % 3 != 0; }, q);
    q->tail_slots = pool.Take(q->tokens.size());
    ASSERT_EQ(q->tail_slots.size(), q->tokens.size());
  };
  auto apply = [&](int s, const StepRequest& q, const StepResult& res) {
    // kept + freed partition the tail slots; kept = root + accepted path.
    std::vector<int32_t> all = res.kept_slots;
    all.insert(all.end(), res.freed_slots.begin(), res.freed_slots.end());
    std::sort(all.begin(), all.end());
    std::vector<int32_t> tail = q.tail_slots;
    std::sort(tail.begin(), tail.end());
    ASSERT_EQ(all, tail);
    ASSERT_EQ(res.kept_slots.size(), 1 + res.accepted_rows.size());
    int prev = 0;
    for (int32_t row : res.accepted_rows) {
      ASSERT_EQ(q.parents[row], prev) << "accepted rows must form a path";
      prev = row;
      ss[s].emitted.push_back(q.tokens[row]);
    }
    ss[s].emitted.push_back(res.bonus);
    ss[s].pending = res.bonus;
    accepted += static_cast<int64_t>(res.accepted_rows.size());
    pool.Free(res.freed_slots);
    ss[s].committed.insert(ss[s].committed.end(), res.kept_slots.begin(), res.kept_slots.end());
  };
  auto done = [&] {
    for (const Sess& se : ss)
      if (se.emitted.size() < kTokens) return false;
    return true;
  };
  ASSERT_NO_FATAL_FAILURE(
      test_util::RunSpeculativeRounds(*e, kSessions, draft, apply, done, &rounds));
  for (int s = 0; s < kSessions; ++s) {
    const auto& got = ss[s].emitted;
    const auto& want = plain[s].emitted;
    for (size_t k = 0; k < std::min<size_t>(kTokens, got.size()); ++k) {
      ++compared;
      if (got[k] != want[k]) {
        ++mismatches;
        // Allowed only where the plain run's top-2 logits were nearly tied (the two runs see
        // different batch shapes, so cuBLAS may sum in another order).
        EXPECT_LT(plain[s].gaps[k], 0.05)
            << model << " session " << s << " token " << k << ": mismatch without a near-tie";
        break;  // the sequences diverge from here on
      }
    }
  }
  std::printf(
      "%s tp %d lossless on GPU: %lld rounds, %lld draft tokens accepted, %lld / %lld tokens "
      "mismatched (rate %.4f)\n",
      model.c_str(), tp, static_cast<long long>(rounds), static_cast<long long>(accepted),
      static_cast<long long>(mismatches), static_cast<long long>(compared),
      compared ? double(mismatches) / compared : 0.0);
  EXPECT_GT(accepted, rounds / 2) << "drafts containing the truth were not accepted";
  CloseAll(pool, &ss);
  CloseAll(pool, &plain);
  EXPECT_EQ(pool.free_count(), pool.capacity()) << "slots leaked";
}

// Tensor parallelism on one GPU (loopback communicator: the ranks share device 0, sums in rank
// order): TP 2 / 4 / 8 against TP 1 on the verify kernel's shape. Head, MLP and vocab shards
// change the GEMM shapes and the reduction, so logits differ by rounding only; greedy tokens
// agree except at near-ties that the measured difference explains.
TEST(GpuEngine, LoopbackTensorParallelMatchesTp1) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = Tiny576();
  auto one = MakeGpu(cfg, 5, 4096);
  ASSERT_NE(one, nullptr);
  for (int tp : {2, 4, 8}) {
    auto many = MakeGpu(cfg, 5, 4096, /*host_weights=*/false, tp);
    ASSERT_NE(many, nullptr) << "tp " << tp;
    std::mt19937 rng(500 + tp);
    const TwoSteps s = MakeTwoSteps(rng, static_cast<int>(cfg.vocab_size), 4);
    Compare cmp;
    for (const auto* batch : {&s.prefill, &s.tree}) {
      std::vector<float> l1, ln;
      auto r1 = one->StepWithLogits(*batch, &l1);
      auto rn = many->StepWithLogits(*batch, &ln);
      ASSERT_TRUE(r1.ok()) << r1.status();
      ASSERT_TRUE(rn.ok()) << "tp " << tp << ": " << rn.status();
      CompareLogits(ln, l1, AllPredictions(*rn), AllPredictions(*r1), cfg.vocab_size, &cmp);
    }
    std::printf(
        "loopback tp %d vs tp 1: logits rel L2 %.3g, max abs %.3g; greedy tokens %lld / "
        "%lld differ (%lld not explained by a near-tie)\n",
        tp, cmp.rel_l2, cmp.max_abs, static_cast<long long>(cmp.token_mismatches),
        static_cast<long long>(cmp.rows), static_cast<long long>(cmp.unexplained));
    EXPECT_LT(cmp.rel_l2, kLogitRelTol) << "tp " << tp;
    EXPECT_EQ(cmp.unexplained, 0) << "tp " << tp;
    EXPECT_LE(cmp.token_mismatches * 10, cmp.rows) << "tp " << tp;
  }
}

TEST(GpuEngine, LosslessSpeculativeLoopbackTp2And4) {
  SKIP_WITHOUT_GPU();
  RunLosslessGpu("tiny576", 2);
  RunLosslessGpu("tiny576", 4);
}

TEST(GpuEngine, LosslessSpeculativeTinyMoeTp1And2) {
  SKIP_WITHOUT_GPU();
  RunLosslessGpu("tiny-moe");
  RunLosslessGpu("tiny-moe", 2);
}
TEST(GpuEngine, LosslessSpeculativeTiny) {
  SKIP_WITHOUT_GPU();
  RunLosslessGpu("tiny");
}
TEST(GpuEngine, LosslessSpeculativeTiny576) {
  SKIP_WITHOUT_GPU();
  RunLosslessGpu("tiny576");
}

TEST(GpuEngine, PoolExhaustionAndCloseFreeEverySlot) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = *PresetConfig("tiny");
  auto e = MakeGpu(cfg, 5, 300);
  ASSERT_NE(e, nullptr);
  ASSERT_EQ(e->kv_slots(), 300);
  SlotPool pool(e->kv_slots(), 55);
  std::mt19937 rng(555);
  // Open sessions until the pool refuses a prompt (all-or-nothing allocation).
  std::vector<Sess> open;
  int refused = 0;
  for (int s = 0; s < 20 && refused == 0; ++s) {
    const int n = 30 + static_cast<int>(rng() % 30);
    if (pool.free_count() < n) {
      ++refused;
      break;
    }
    std::vector<Sess> one;
    Prefill(*e, pool, {RandomTokens(rng, n, static_cast<int>(cfg.vocab_size))}, 65, &one);
    open.push_back(one[0]);
  }
  EXPECT_EQ(refused, 1) << "the pool was never exhausted";
  // A slot outside the pool is refused before any KV write: the context rows are unchanged.
  const int32_t probe = open[0].committed[0];
  auto before = e->LatentRow(0, 0, probe);
  ASSERT_TRUE(before.ok());
  StepRequest good;
  good.context_slots = open[0].committed;
  good.tokens = {open[0].pending};
  good.parents = {-1};
  good.tail_slots = {probe};  // a context slot reused as a tail slot: invalid
  auto r = e->Step({good});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  StepRequest outside = good;
  outside.tail_slots = {static_cast<int32_t>(e->kv_slots())};
  r = e->Step({outside});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("tail_slots"), std::string::npos) << r.status();
  auto after = e->LatentRow(0, 0, probe);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*before, *after) << "an invalid step wrote the KV pool";
  EXPECT_FALSE(e->failed());
  // A few verify rounds on every open session with the slots that are left, then close.
  for (int round = 0; round < 3; ++round) {
    std::vector<StepRequest> batch;
    for (size_t i = 0; i < open.size() && batch.size() < 8; ++i) {  // max_batch 8
      const Sess& s = open[i];
      StepRequest q;
      q.context_slots = s.committed;
      q.tokens = {s.pending, static_cast<int32_t>(rng() % cfg.vocab_size)};
      q.parents = {-1, 0};
      q.tail_slots = pool.Take(2);
      if (q.tail_slots.empty()) break;
      batch.push_back(q);
    }
    auto res = e->Step(batch);
    ASSERT_TRUE(res.ok()) << res.status();
    for (size_t i = 0; i < batch.size(); ++i) {
      pool.Free((*res)[i].freed_slots);
      open[i].committed.insert(open[i].committed.end(), (*res)[i].kept_slots.begin(),
                               (*res)[i].kept_slots.end());
      open[i].pending = (*res)[i].bonus;
    }
  }
  CloseAll(pool, &open);
  EXPECT_EQ(pool.free_count(), pool.capacity()) << "slots leaked after close";
}

TEST(GpuEngine, FailedRankMakesEngineUnavailable) {
  SKIP_WITHOUT_GPU();
  EngineOptions o;
  o.model = "tiny";
  o.kv_slots = 256;
  o.limits.max_batch = 4;
  o.fault_hook = [](int /*rank*/, int64_t step) {
    return step == 1 ? absl::InternalError("injected fault") : absl::OkStatus();
  };
  auto e = CudaEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  StepRequest q;
  q.tokens = {1, 2, 3};
  q.parents = {-1, 0, 1};
  q.tail_slots = {0, 1, 2};
  q.accept = false;
  ASSERT_TRUE((*e)->Step({q}).ok());
  EXPECT_FALSE((*e)->failed());
  StepRequest v;
  v.context_slots = {0, 1, 2};
  v.tokens = {4};
  v.parents = {-1};
  v.tail_slots = {3};
  auto r = (*e)->Step({v});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_TRUE((*e)->failed());
  r = (*e)->Step({v});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
}

TEST(GpuEngine, BadOptionsAreRejected) {
  EngineOptions o;
  o.tp = 0;
  EXPECT_EQ(CudaEngine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.tp = 1;
  o.limits.max_tail_rows = 1000;
  EXPECT_EQ(CudaEngine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  if (!CudaDevicesAvailable()) return;
  o.limits.max_tail_rows = 65;
  o.model = "no-such-preset-or-dir";
  EXPECT_EQ(CudaEngine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.model = "tiny";
  o.tp = 3;  // 8 heads are not divisible by 3 (and there may not be 3 GPUs)
  EXPECT_EQ(CudaEngine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace verifyd::tp
