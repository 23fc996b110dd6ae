// The CUDA engine's batch-invariant steps (EngineOptions::cuda.batch_invariant, the default): a
// request's logits must be bit-identical whether it runs alone, next to other random requests
// (random contexts over a random-filled KV pool, random trees) or with its own tree grown, at
// TP 1 and at loopback TP 2, on the kimi-k2-attn preset (the verify kernel's dimensions; 2
// layers, plus the tiny-moe preset for the MoE path) and on kimi_fp8_moe, a transformers-made
// checkpoint of Kimi-K2's geometry (576-wide latents, 16 heads, 16 experts top-4 with Kimi-K2's
// routing, every linear FP8). A control runs the batch-adaptive steps on the same probe and
// expects at least one changed bit: the comparison can see a difference. And every node of a
// draft tree gets exactly the logits plain one-token-per-step decoding of its path gives.
// Label gpu; skipped with a message when no CUDA device is visible.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"
#include "tests/reference_checkpoint_util.h"
#include "tp/cuda/cuda_engine.h"

namespace verifyd::tp {
namespace {

constexpr int64_t kContext = 4096;
constexpr int kMaxOthers = 7;
constexpr int kMaxNodes = 64;

std::unique_ptr<CudaEngine> MakeEngine(const std::string& model, int tp, bool invariant,
                                       bool shared_context = false, bool kv_fp8 = false) {
  EngineOptions o;
  if (kv_fp8) o.kv_dtype = KvDtype::kFp8;
  o.model = model;
  o.preset_layers = 2;
  o.tp = tp;
  if (tp > 1) o.cuda.devices.assign(tp, 0);  // loopback: every rank on device 0
  o.limits.max_batch = kMaxOthers + 1;
  o.limits.max_tail_rows = kMaxNodes + 1;
  o.kv_slots = kContext + (kMaxOthers + 1) * (kMaxNodes + 1) + 64;
  o.cuda.batch_invariant = invariant;
  o.cuda.shared_context_attention = shared_context;
  auto e = CudaEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return nullptr;
  EXPECT_TRUE((*e)->FillLatentCacheRandom(5).ok());
  return std::move(*e);
}

// A random draft tree of nodes + 1 rows (accept = false): tokens below V, each node's parent a
// random earlier node, tail slots slot0, slot0 + 1, ...; the first `ctx` slots as its context.
StepRequest RandomTree(std::mt19937& rng, int64_t V, int64_t nodes, int64_t ctx, int64_t slot0) {
  StepRequest q;
  for (int64_t t = 0; t <= nodes; ++t) {
    q.tokens.push_back(static_cast<int32_t>(rng() % V));
    q.parents.push_back(t == 0 ? -1 : static_cast<int32_t>(rng() % t));
    q.tail_slots.push_back(static_cast<int32_t>(slot0 + t));
  }
  for (int64_t i = 0; i < ctx; ++i) q.context_slots.push_back(static_cast<int32_t>(i));
  q.accept = false;
  return q;
}

// Rows of the probe (the first request of each step) whose logits differ in any bit from the
// probe alone, over: 1, 3 and 7 other requests, and the probe's tree grown to 16 and 64 nodes.
int64_t ChangedProbeRows(CudaEngine& e) {
  const int64_t V = e.config().vocab_size;
  // The context the preset allows next to the largest tree (tiny-moe's is short).
  const int64_t ctx =
      std::min<int64_t>(kContext, e.config().max_position_embeddings - kMaxNodes - 2);
  std::mt19937 rng(3);
  const StepRequest probe = RandomTree(rng, V, 8, ctx, kContext);
  const int64_t n = static_cast<int64_t>(probe.tokens.size());
  std::vector<float> alone;
  auto ra = e.StepWithLogits({probe}, &alone);
  EXPECT_TRUE(ra.ok()) << ra.status();
  if (!ra.ok()) return -1;
  int64_t changed = 0;
  auto compare = [&](const std::vector<float>& got) {
    for (int64_t r = 0; r < n; ++r) {
      changed += std::memcmp(alone.data() + r * V, got.data() + r * V, V * sizeof(float)) != 0;
    }
  };
  for (int others : {1, 3, kMaxOthers}) {
    std::vector<StepRequest> batch = {probe};
    for (int b = 0; b < others; ++b) {
      const int64_t nodes = rng() % (kMaxNodes + 1), octx = 1 + rng() % ctx;
      batch.push_back(RandomTree(rng, V, nodes, octx, kContext + (b + 1) * (kMaxNodes + 1)));
    }
    std::vector<float> lg;
    auto r = e.StepWithLogits(batch, &lg);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) compare(lg);
  }
  for (int64_t g : {16, kMaxNodes}) {
    StepRequest big = probe;
    for (int64_t t = n; t <= g; ++t) {
      big.tokens.push_back(static_cast<int32_t>(rng() % V));
      big.parents.push_back(static_cast<int32_t>(rng() % t));
      big.tail_slots.push_back(static_cast<int32_t>(kContext + t));
    }
    std::vector<float> lg;
    auto r = e.StepWithLogits({big}, &lg);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) compare(lg);
  }
  return changed;
}

TEST(GpuBatchInvariance, ProbeRowsAreBitIdenticalInEveryStep) {
  SKIP_WITHOUT_GPU();
  for (const std::string model : {"kimi-k2-attn", "tiny-moe"}) {
    for (const int tp : {1, 2}) {
      std::unique_ptr<CudaEngine> e = MakeEngine(model, tp, /*invariant=*/true);
      ASSERT_NE(e, nullptr);
      EXPECT_EQ(ChangedProbeRows(*e), 0) << model << " tp " << tp;
    }
  }
}

// Lossless, bit for bit: every node of a random draft tree gets the logits that plain decoding
// gives its token at that position. Each root-to-leaf path of the tree is decoded one token
// per step (its own KV slots, next to 0-3 other random requests), and every step's logits must
// equal the tree node's in every bit (the tree's rows see their ancestors at other key indices
// than a chain does; the positional attention walks them by position).
int64_t TreeNodesUnlikePlainDecoding(CudaEngine& e, int64_t* compared) {
  const int64_t V = e.config().vocab_size;
  const int64_t ctx =
      std::min<int64_t>(kContext, e.config().max_position_embeddings - kMaxNodes - 2);
  std::mt19937 rng(11);
  constexpr int kNodes = 24;
  const StepRequest tree = RandomTree(rng, V, kNodes, ctx, kContext);
  std::vector<int> children(kNodes + 1, 0);
  for (int t = 1; t <= kNodes; ++t) ++children[tree.parents[t]];
  std::vector<float> tree_lg;
  auto rt = e.StepWithLogits({tree}, &tree_lg);
  EXPECT_TRUE(rt.ok()) << rt.status();
  if (!rt.ok()) return -1;
  const int64_t chain_slot0 = kContext + (kMaxNodes + 1);
  int64_t differ = 0;
  for (int leaf = 0; leaf <= kNodes; ++leaf) {
    if (children[leaf] != 0) continue;
    std::vector<int> path;
    for (int t = leaf; t >= 0; t = tree.parents[t]) path.push_back(t);
    std::reverse(path.begin(), path.end());
    std::vector<int32_t> context = tree.context_slots;
    for (size_t d = 0; d < path.size(); ++d) {
      StepRequest q;
      q.context_slots = context;
      q.tokens = {tree.tokens[path[d]]};
      q.parents = {-1};
      q.tail_slots = {static_cast<int32_t>(chain_slot0 + d)};
      q.accept = false;
      std::vector<StepRequest> batch = {q};
      const int others = static_cast<int>(rng() % 4);
      for (int b = 0; b < others; ++b) {
        const int64_t nodes = rng() % (kMaxNodes + 1);
        StepRequest o = RandomTree(rng, V, nodes, 0, kContext + (b + 2) * (kMaxNodes + 1));
        const int64_t octx = 1 + rng() % ctx;
        for (int64_t i = 0; i < octx; ++i) o.context_slots.push_back(static_cast<int32_t>(i));
        batch.push_back(o);
      }
      std::vector<float> lg;
      auto r = e.StepWithLogits(batch, &lg);
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) return -1;
      ++*compared;
      differ += std::memcmp(lg.data(), tree_lg.data() + path[d] * V, V * sizeof(float)) != 0;
      context.push_back(q.tail_slots[0]);
    }
  }
  return differ;
}

TEST(GpuBatchInvariance, TreeNodesEqualPlainDecoding) {
  SKIP_WITHOUT_GPU();
  // kimi-k2-attn at loopback TP 8 too: 8 heads per rank, where shared-context plans put 8
  // nodes in one 64-row work item.
  for (const std::string model : {"kimi-k2-attn", "tiny-moe"}) {
    for (const int tp : {1, 2, 8}) {
      if (tp == 8 && model != "kimi-k2-attn") continue;
      for (const bool shared : {false, true}) {
        std::unique_ptr<CudaEngine> e = MakeEngine(model, tp, /*invariant=*/true, shared);
        ASSERT_NE(e, nullptr);
        int64_t compared = 0;
        const int64_t differ = TreeNodesUnlikePlainDecoding(*e, &compared);
        std::printf("%s tp=%d%s: %lld decode steps, %lld differ from the tree's node\n",
                    model.c_str(), tp, shared ? " shared context" : "",
                    static_cast<long long>(compared), static_cast<long long>(differ));
        EXPECT_GT(compared, 25) << model;
        EXPECT_EQ(differ, 0) << model << " tp " << tp << " shared " << shared;
      }
    }
  }
}

// The FP8 latent cache (--kv_dtype=fp8: the 16-row FP8 kernel's positional plans, the FP8 KV
// write): the probe stays bit-identical and tree nodes equal plain decoding, TP 1 and 2.
TEST(GpuBatchInvariance, Fp8KvCacheKeepsBothProperties) {
  SKIP_WITHOUT_GPU();
  for (const int tp : {1, 2}) {
    std::unique_ptr<CudaEngine> e =
        MakeEngine("kimi-k2-attn", tp, /*invariant=*/true, /*shared_context=*/true, true);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->kv_cache_dtype(), "fp8_e4m3");
    EXPECT_EQ(ChangedProbeRows(*e), 0) << "tp " << tp;
    int64_t compared = 0;
    const int64_t differ = TreeNodesUnlikePlainDecoding(*e, &compared);
    std::printf("kimi-k2-attn fp8 kv tp=%d: %lld decode steps, %lld differ from the tree's node\n",
                tp, static_cast<long long>(compared), static_cast<long long>(differ));
    EXPECT_GT(compared, 25);
    EXPECT_EQ(differ, 0) << "tp " << tp;
  }
}

// Kimi-K2's geometry from a transformers-made FP8 checkpoint (routing from the activations,
// FP8 experts, shared expert, dense MLP and attention projections): both properties at TP 1,
// loopback TP 2 (expert parallel: 8 experts a rank) and TP 4 (4 heads a rank).
TEST(GpuBatchInvariance, KimiGeometryFp8MoeCheckpoint) {
  SKIP_WITHOUT_GPU();
  for (const int tp : {1, 2, 4}) {
    std::unique_ptr<CudaEngine> e = MakeEngine(reftest::CheckpointDir("kimi_fp8_moe"), tp,
                                               /*invariant=*/true, /*shared_context=*/true);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(ChangedProbeRows(*e), 0) << "tp " << tp;
    int64_t compared = 0;
    const int64_t differ = TreeNodesUnlikePlainDecoding(*e, &compared);
    std::printf("kimi_fp8_moe tp=%d: %lld decode steps, %lld differ from the tree's node\n", tp,
                static_cast<long long>(compared), static_cast<long long>(differ));
    EXPECT_GT(compared, 25);
    EXPECT_EQ(differ, 0) << "tp " << tp;
  }
}

TEST(GpuBatchInvariance, BatchAdaptiveStepsChangeBitsSoTheProbeCanSeeThem) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaEngine> e = MakeEngine("kimi-k2-attn", 1, /*invariant=*/false);
  ASSERT_NE(e, nullptr);
  EXPECT_GT(ChangedProbeRows(*e), 0);
  // The tree-vs-decoding comparison can see a difference too (printed: how many).
  int64_t compared = 0;
  const int64_t differ = TreeNodesUnlikePlainDecoding(*e, &compared);
  std::printf("batch-adaptive steps: %lld of %lld decode steps differ from the tree's node\n",
              static_cast<long long>(differ), static_cast<long long>(compared));
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace verifyd::tp
