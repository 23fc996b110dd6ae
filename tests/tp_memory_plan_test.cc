// The per-GPU memory plan (tp/memory_plan.h): every weight part of a small FP8 MoE config by
// hand, Kimi-K2 / DeepSeek-V3 at TP 8 with expert parallelism against independent arithmetic,
// KV bytes a token in bf16 and FP8, the ResourceExhausted error, bad options naming the field.
#include "gtest/gtest.h"
#include "tests/model_dims_util.h"
#include "tp/memory_plan.h"
#include "tp/presets.h"

namespace verifyd::tp {
namespace {

// hidden 256, 2 layers (0 dense, 1 MoE), 4 heads, q_lora 128, kv_lora 128, rope 64, nope 64,
// v 64, intermediate 512, vocab 1000, 4 routed experts top-2, 1 shared expert of 128, FP8.
ModelConfig SmallFp8Moe() {
  ModelConfig c;
  c.name = "small-fp8-moe";
  c.moe.n_routed_experts = 4;
  c.moe.num_experts_per_tok = 2;
  c.moe.n_shared_experts = 1;
  c.moe.moe_intermediate_size = 128;
  c.moe.first_k_dense_replace = 1;
  c.moe.n_group = 1;
  c.moe.topk_group = 1;
  c.quant.method = "fp8";
  return test_util::WithDims(c, {1000, 256, 2, 4, 128, 128, 64, 64, 64, 512});
}

MemoryPlan Plan(const ModelConfig& c, const MemoryPlanOptions& o) {
  absl::StatusOr<MemoryPlan> p = PlanRankMemory(c, o);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : MemoryPlan();
}

// Rank 1 of TP 2, expert parallel: 2 heads, vocab rows [500, 1000), 256 dense columns (FP8),
// experts 2-3 whole (FP8), 64 shared-expert columns (not 128-aligned: bf16).
TEST(MemoryPlan, SmallConfigEveryWeightPartByHand) {
  MemoryPlanOptions o;
  o.tp = 2;
  o.rank = 1;
  const MemoryPlan p = Plan(SmallFp8Moe(), o);
  EXPECT_EQ(p.local_heads, 2);
  EXPECT_EQ(p.local_experts, 2);
  EXPECT_EQ(p.vocab_rows, 500);
  EXPECT_TRUE(p.fp8_attention);
  EXPECT_TRUE(p.fp8_dense);
  EXPECT_TRUE(p.fp8_experts);
  EXPECT_FALSE(p.fp8_shared);
  EXPECT_EQ(p.WeightBytes("embedding"), 500 * 256 * 2);
  // Per layer: q_a | kv_a fused [128 + 256 (576 -> whole blocks), 256] e4m3 + 3 x 2 scales;
  // q_b [2 x 128, 128] + 2 x 1 scales; o_proj [256, 2 x 64] + 2 x 1; kv_b bf16 [2 x 128, 128].
  const int64_t attn =
      (384 * 256 + 6 * 4) + (256 * 128 + 2 * 4) + (256 * 128 + 2 * 4) + 2 * 128 * 128 * 2;
  EXPECT_EQ(attn, 229416);
  EXPECT_EQ(p.WeightBytes("attention"), 2 * attn);
  // Dense layer 0: [gate | up] [512, 256] + 4 x 2 scales, down [256, 256] + 2 x 2.
  EXPECT_EQ(p.WeightBytes("dense_mlp"), (512 * 256 + 8 * 4) + (256 * 256 + 4 * 4));
  // Two experts of [256, 256] + 2 x 2 scales and [256, 128] + 2 x 1.
  EXPECT_EQ(p.WeightBytes("routed_experts"), 2 * ((256 * 256 + 4 * 4) + (256 * 128 + 2 * 4)));
  EXPECT_EQ(p.WeightBytes("shared_experts"), 3 * 64 * 256 * 2);
  EXPECT_EQ(p.WeightBytes("router"), 4 * 256 * 4 + 4 * 4);
  EXPECT_EQ(p.WeightBytes("norms"), 2 * (256 + 128 + 128 + 256) * 2 + 256 * 2);
  EXPECT_EQ(p.WeightBytes("lm_head"), 500 * 256 * 2);
  EXPECT_EQ(p.weight_bytes, 256000 + 458832 + 196656 + 196656 + 98304 + 4112 + 3584 + 256000);
  EXPECT_EQ(p.BufferBytes("cublas_workspace"), 32 << 20);
  EXPECT_GT(p.BufferBytes("activations"), 0);
  EXPECT_GT(p.BufferBytes("moe_buffers"), 0);
  EXPECT_GT(p.BufferBytes("verify_attention_workspace"), int64_t{1} << 30);  // 2^19 x 2,052
  EXPECT_EQ(p.BufferBytes("rank_order_reduce"), 2 * 64 * 65 * 256 * 4);
  EXPECT_EQ(p.BufferBytes("logits_gather"), 2 * 64 * 65 * 500 * 4);

  // bf16 weights: the projections at 2 bytes, no scales; the MLPs too.
  o.fp8_weights = false;
  const MemoryPlan b = Plan(SmallFp8Moe(), o);
  EXPECT_FALSE(b.fp8_attention || b.fp8_dense || b.fp8_experts || b.fp8_shared);
  EXPECT_EQ(b.WeightBytes("attention"),
            2 * (128 * 256 + 256 * 128 + 192 * 256 + 256 * 128 + 2 * 128 * 128) * 2);
  EXPECT_EQ(b.WeightBytes("dense_mlp"), 3 * 256 * 256 * 2);
  EXPECT_EQ(b.WeightBytes("routed_experts"), 2 * 3 * 128 * 256 * 2);
  EXPECT_EQ(b.BufferBytes("fp8_buffers"), 0);

  // Without expert parallelism every rank holds a 64-column slice of all 4 experts (bf16:
  // not 128-aligned).
  o.fp8_weights = true;
  o.expert_parallel = false;
  const MemoryPlan t = Plan(SmallFp8Moe(), o);
  EXPECT_EQ(t.local_experts, 4);
  EXPECT_FALSE(t.fp8_experts);
  EXPECT_EQ(t.WeightBytes("routed_experts"), 4 * 3 * 64 * 256 * 2);
}

// Independent arithmetic: a Kimi-K2 rank of TP 8 with expert parallelism holds 48 of the 384
// experts of each of the 60 MoE layers in FP8 (3 x 2048 x 7168 bytes each) and 1/8 of the rest.
TEST(MemoryPlan, KimiK2Rank0Of8WeightsAbout130Gb) {
  MemoryPlanOptions o;
  o.tp = 8;
  const MemoryPlan p = Plan(*PresetConfig("kimi-k2"), o);
  EXPECT_EQ(p.local_experts, 48);
  EXPECT_EQ(p.local_heads, 8);
  EXPECT_TRUE(p.fp8_attention && p.fp8_dense && p.fp8_experts && p.fp8_shared);
  const double experts = 60.0 * 48 * 3 * 2048 * 7168;  // 126.8 GB
  const double vocab = 2.0 * 20480 * 7168 * 2;         // embedding + lm_head slices, bf16
  const double router = 60.0 * 384 * 7168 * 4;         // fp32, replicated
  const double shared = 60.0 * 3 * 256 * 7168;         // 1/8 of the shared expert, FP8
  const double dense = 3.0 * 2304 * 7168;              // 1/8 of layer 0's MLP, FP8
  // q_a + kv_a (padded to 640 rows) + q_b + o_proj in FP8, kv_b in bf16, per layer.
  const double attn =
      61.0 * ((1536 + 640) * 7168 + 8 * 192 * 1536 + 7168 * 8 * 128 + 2.0 * 8 * 256 * 512);
  const double expected = experts + vocab + router + shared + dense + attn;
  EXPECT_NEAR(expected / 1e9, 130.1, 0.1);
  // Scales (fp32 per 128 x 128 block: 1/4096 of the FP8 bytes) and norms are the difference.
  EXPECT_GT(p.weight_bytes, expected);
  EXPECT_LT(p.weight_bytes, expected * 1.001);
  EXPECT_NEAR(p.WeightBytes("routed_experts") / 1e9, experts / 1e9, 0.05);
  // 61 layers x 1,152 bytes (bf16) a token on every rank.
  EXPECT_EQ(p.kv_bytes_per_token, 61 * 1152);
}

TEST(MemoryPlan, DeepSeekV3Rank0Of8) {
  MemoryPlanOptions o;
  o.tp = 8;
  const MemoryPlan p = Plan(*PresetConfig("deepseek-v3"), o);
  EXPECT_EQ(p.local_experts, 32);
  EXPECT_EQ(p.local_heads, 16);
  const double experts = 58.0 * 32 * 3 * 2048 * 7168;  // 81.7 GB
  EXPECT_NEAR(p.WeightBytes("routed_experts") / 1e9, experts / 1e9, 0.05);
  EXPECT_GT(p.weight_bytes, experts);
  EXPECT_LT(p.weight_bytes, experts + 6e9);
  EXPECT_TRUE(p.fit.ok()) << p.fit;
  EXPECT_GT(p.kv_capacity_tokens, 100000);
}

// 656 bytes a token per layer in FP8 against 1,152 in bf16: 1.76x the tokens in the same bytes.
TEST(MemoryPlan, Fp8KvHoldsMoreTokens) {
  MemoryPlanOptions o;
  o.tp = 8;
  const ModelConfig c = *PresetConfig("deepseek-v3");
  const MemoryPlan bf16 = Plan(c, o);
  o.kv_fp8 = true;
  const MemoryPlan fp8 = Plan(c, o);
  EXPECT_EQ(bf16.kv_bytes_per_token, 61 * 1152);
  EXPECT_EQ(fp8.kv_bytes_per_token, 61 * 656);
  EXPECT_EQ(fp8.weight_bytes, bf16.weight_bytes);
  const int64_t left =
      o.device_memory_bytes - bf16.weight_bytes - bf16.buffer_bytes - bf16.reserve_bytes;
  EXPECT_EQ(bf16.kv_capacity_tokens, left / (61 * 1152));
  EXPECT_EQ(fp8.kv_capacity_tokens, left / (61 * 656));
  EXPECT_EQ(bf16.kv_tokens, bf16.kv_capacity_tokens);
}

TEST(MemoryPlan, RequestedKvThatDoesNotFitIsResourceExhausted) {
  MemoryPlanOptions o;
  o.tp = 8;
  o.device_memory_bytes = int64_t{141} * 1000 * 1000 * 1000;
  const ModelConfig c = *PresetConfig("deepseek-v3");
  const int64_t fits = Plan(c, o).kv_capacity_tokens;
  o.kv_slots = fits;
  EXPECT_TRUE(Plan(c, o).fit.ok());
  o.kv_slots = fits + 1;
  const MemoryPlan p = Plan(c, o);
  EXPECT_EQ(p.fit.code(), absl::StatusCode::kResourceExhausted);
  const std::string m(p.fit.message());
  for (const char* part : {"weights ", " GB + workspaces ", " GB + requested KV ",
                           " GB exceed the device's 141.0 GB", "deepseek-v3"}) {
    EXPECT_NE(m.find(part), std::string::npos) << part << " in " << m;
  }
  EXPECT_NE(FormatMemoryPlan(p).find("does not fit: "), std::string::npos);
  // Nothing left for even one token on a 90 GB device (kv_slots = 0: as many as fit).
  o.kv_slots = 0;
  o.device_memory_bytes = int64_t{90} * 1000 * 1000 * 1000;
  const MemoryPlan none = Plan(c, o);
  EXPECT_EQ(none.fit.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(none.fit.message().find("leave no room for the KV pool"), std::string::npos)
      << none.fit;
  EXPECT_EQ(none.kv_capacity_tokens, 0);
}

TEST(MemoryPlan, BadOptionsNameTheField) {
  const ModelConfig c = *PresetConfig("kimi-k2");
  auto err = [&c](void (*set)(MemoryPlanOptions&), const char* field) {
    MemoryPlanOptions o;
    o.tp = 8;
    set(o);
    absl::Status s = PlanRankMemory(c, o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  };
  err([](MemoryPlanOptions& o) { o.tp = 3; }, "num_attention_heads");
  err([](MemoryPlanOptions& o) { o.rank = 8; }, "'rank'");
  err([](MemoryPlanOptions& o) { o.max_batch = 0; }, "'max_batch'");
  err([](MemoryPlanOptions& o) { o.max_tail_rows = 129; }, "'max_tail_rows'");
  err([](MemoryPlanOptions& o) { o.kv_slots = -1; }, "'kv_slots'");
  err([](MemoryPlanOptions& o) { o.device_memory_bytes = 0; }, "'device_memory_bytes'");
  err([](MemoryPlanOptions& o) { o.reserve_fraction = 1; }, "'reserve_fraction'");
}

TEST(MemoryPlan, TableListsEveryPart) {
  MemoryPlanOptions o;
  o.tp = 8;
  const MemoryPlan p = Plan(*PresetConfig("kimi-k2"), o);
  const std::string t = FormatMemoryPlan(p);
  for (const MemoryPart& part : p.weights) EXPECT_NE(t.find(part.name), std::string::npos);
  for (const MemoryPart& part : p.buffers) EXPECT_NE(t.find(part.name), std::string::npos);
  EXPECT_NE(t.find("kv bytes a token"), std::string::npos);
  EXPECT_NE(t.find("computed, not measured"), std::string::npos);
}

// The engine's options map onto the plan's, field for field.
TEST(MemoryPlan, OptionsOfEngineOptions) {
  EngineOptions e;
  e.tp = 8;
  e.kv_slots = 1234;
  e.kv_dtype = KvDtype::kFp8;
  e.limits.max_batch = 16;
  e.limits.max_tail_rows = 33;
  e.limits.max_context = 4096;
  e.cuda.expert_parallel = false;
  e.cuda.fp8_experts = false;
  e.cuda.batch_invariant = false;
  e.cuda.positional_max_splits = 8;
  e.cuda.positional_partial_rows = 8192;
  e.cuda.fp8_staging_keys = 99;
  const MemoryPlanOptions o = MemoryPlanOptionsOf(e, 5);
  EXPECT_EQ(o.tp, 8);
  EXPECT_EQ(o.rank, 0);
  EXPECT_EQ(o.kv_slots, 1234);
  EXPECT_TRUE(o.kv_fp8);
  EXPECT_EQ(o.max_batch, 16);
  EXPECT_EQ(o.max_tail_rows, 33);
  EXPECT_EQ(o.max_context, 4096);
  EXPECT_FALSE(o.expert_parallel);
  EXPECT_FALSE(o.fp8_weights);
  EXPECT_FALSE(o.batch_invariant);
  EXPECT_EQ(o.positional_max_splits, 8);
  EXPECT_EQ(o.positional_partial_rows, 8192);
  EXPECT_EQ(o.fp8_staging_keys, 99);
  EXPECT_EQ(o.device_memory_bytes, 5);
  EXPECT_EQ(ModelConfigOf("kimi-k2", 3)->num_hidden_layers, 3);
  EXPECT_EQ(ModelConfigOf("/no/such/model").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace verifyd::tp
