// The CPU engine against Hugging Face transformers on the tiny reference checkpoints of
// tests/data (written by tests/data/make_reference_checkpoints.py; see its docstring):
//   dense         MLA, dense MLPs, plain RoPE, bf16, transformers-4 config spelling;
//   moe_yarn      MoE (sigmoid / noaux_tc routing with a non-zero correction bias, groups,
//                 shared expert) + YaRN, bf16 in two shards, transformers-5 config spelling;
//   moe_yarn_fp8  the same architecture as DeepSeek-V3 publishes FP8 (128x128 blocks).
//   moe_fp8_block128  FP8 with whole 128x128 blocks in the experts (hidden 128, two layers).
//   moe_fp8_mlp128  the same with whole blocks in the dense MLP too (intermediate 256).
//   moe_fp8_attn128  the same with 128-aligned attention projections too (kv_a ends in a
//                 partial block).
//   mla576        DeepSeek-V3's attention dimensions (kv_lora_rank 512, qk_rope_head_dim 64:
//                 576-wide latent rows, four FP8 scale groups), YaRN, dense MLPs, 8 heads.
//   kimi_fp8_moe  Kimi-K2's geometry: 576-wide latents, 16 heads, 16 routed experts top-4 with
//                 Kimi-K2's one-group routing (not pinned), every decoder linear FP8.
// For every checkpoint and TP 1, 2, 4:
//   - the parsed config gives transformers' RoPE inv_freq and attention softmax scale;
//   - prefill + greedy decoding with empty trees (driven by the reference tokens): every
//     prediction equals transformers' greedy token and every logit row is within 1e-4 relative
//     (max |diff| / max |logit| and rel-L2) of transformers' float32 logits;
//   - decoding through draft trees holding the true continuation plus wrong siblings accepts
//     exactly the reference tokens (lossless).
// A prediction that differs from transformers' is allowed only at a near-tie: a position whose
// transformers top-2 gap is below twice the measured logit error there (capped by the 1e-4
// tolerance). Near-ties are counted and printed, never skipped silently.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/kv_fp8.h"
#include "tests/reference_checkpoint_util.h"
#include "tp/cpu/cpu_engine.h"
#include "tp/model_config.h"

namespace verifyd::tp {
namespace {

using reftest::CheckpointDir;
using reftest::json;
using reftest::LoadReference;
using reftest::ReadText;
using reftest::Reference;

constexpr double kLogitTol = 1e-4;  // relative logit error (max abs and L2)
constexpr int64_t kKvSlots = 1024;
constexpr int kTreeDepth = 4;  // true draft tokens per tree
constexpr double kPi = 3.14159265358979323846;

std::unique_ptr<CpuEngine> MakeEngine(const std::string& name, int tp,
                                      KvDtype kv_dtype = KvDtype::kAuto) {
  EngineOptions o;
  o.model = CheckpointDir(name);
  o.tp = tp;
  o.kv_slots = kKvSlots;
  // Prompts of up to 105 tokens are prefilled (and, with their continuation, re-read for
  // hidden states) as one chain.
  o.limits.max_tail_rows = kernels::kMaxTailRows;
  o.kv_dtype = kv_dtype;
  absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(o);
  EXPECT_TRUE(e.ok()) << name << " tp " << tp << ": " << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

class ReferenceCheckpointTest : public reftest::CheckpointTpTest<CpuEngine> {
 protected:
  std::unique_ptr<CpuEngine> Make(KvDtype kv_dtype) override {
    return MakeEngine(name_, tp_, kv_dtype);
  }
};

// YaRN as transformers computes it (modeling_rope_utils._compute_yarn_parameters and
// DeepseekV3Attention.scaling), in double, from the parsed config.
struct RopeParams {
  std::vector<double> inv_freq;
  double attention_factor = 1.0;  // multiplies cos / sin
  double softmax_scale = 0;
};

RopeParams ExpectedRope(const ModelConfig& c) {
  RopeParams p;
  const int64_t dim = c.qk_rope_head_dim;
  const double base = c.rope_theta;
  const RopeScaling& y = c.rope_scaling;
  p.softmax_scale = 1.0 / std::sqrt(static_cast<double>(c.qk_head_dim()));
  for (int64_t i = 0; i < dim / 2; ++i) {
    p.inv_freq.push_back(1.0 / std::pow(base, static_cast<double>(2 * i) / dim));
  }
  if (y.type != "yarn") return p;
  auto get_mscale = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  auto correction_dim = [&](double rotations) {
    return dim * std::log(y.original_max_position_embeddings / (rotations * 2 * kPi)) /
           (2 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(y.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(y.beta_slow)), static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double extrapolation = p.inv_freq[i];
    const double interpolation = extrapolation / y.factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    const double extrapolation_factor = 1 - ramp;
    p.inv_freq[i] =
        interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  p.attention_factor = (y.mscale != 0 && y.mscale_all_dim != 0)
                           ? get_mscale(y.factor, y.mscale) / get_mscale(y.factor, y.mscale_all_dim)
                           : get_mscale(y.factor, 1.0);
  if (y.mscale_all_dim != 0) {
    const double m = get_mscale(y.factor, y.mscale_all_dim);
    p.softmax_scale *= m * m;
  }
  return p;
}

class ReferenceConfigTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    name_ = GetParam();
    ASSERT_NO_FATAL_FAILURE(LoadReference(name_, &ref_));
  }

  std::string name_;
  Reference ref_;
};

// The parsed config.json gives transformers' dimensions, MoE / FP8 keys and RoPE parameters.
TEST_P(ReferenceConfigTest, ConfigMatchesTransformers) {
  absl::StatusOr<ModelConfig> c =
      ParseModelConfigJson(ReadText(CheckpointDir(name_) + "/config.json"));
  ASSERT_TRUE(c.ok()) << name_ << ": " << c.status();
  const json& j = ref_.info["config"];
  EXPECT_EQ(c->vocab_size, j["vocab_size"].get<int64_t>());
  EXPECT_EQ(c->hidden_size, j["hidden_size"].get<int64_t>());
  EXPECT_EQ(c->num_hidden_layers, j["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(c->num_attention_heads, j["num_attention_heads"].get<int64_t>());
  EXPECT_EQ(c->q_lora_rank, j["q_lora_rank"].get<int64_t>());
  EXPECT_EQ(c->kv_lora_rank, j["kv_lora_rank"].get<int64_t>());
  EXPECT_EQ(c->intermediate_size, j["intermediate_size"].get<int64_t>());
  EXPECT_EQ(c->max_position_embeddings, j["max_position_embeddings"].get<int64_t>());
  const int64_t layers = j["num_hidden_layers"].get<int64_t>();
  const int64_t first_dense = j["first_k_dense_replace"].get<int64_t>();
  for (int64_t l = 0; l < layers; ++l) {
    EXPECT_EQ(c->IsMoeLayer(l), l >= first_dense) << name_ << " layer " << l;
  }
  if (first_dense < layers) {
    EXPECT_EQ(c->moe.n_routed_experts, j["n_routed_experts"].get<int64_t>());
    EXPECT_EQ(c->moe.num_experts_per_tok, j["num_experts_per_tok"].get<int64_t>());
    EXPECT_EQ(c->moe.n_shared_experts, j["n_shared_experts"].get<int64_t>());
    EXPECT_EQ(c->moe.moe_intermediate_size, j["moe_intermediate_size"].get<int64_t>());
    EXPECT_EQ(c->moe.n_group, j["n_group"].get<int64_t>());
    EXPECT_EQ(c->moe.topk_group, j["topk_group"].get<int64_t>());
    EXPECT_EQ(c->moe.norm_topk_prob, j["norm_topk_prob"].get<bool>());
    EXPECT_DOUBLE_EQ(c->moe.routed_scaling_factor, j["routed_scaling_factor"].get<double>());
  }
  EXPECT_EQ(c->quant.method, j.contains("quantization_config") ? "fp8" : "");

  const RopeParams want = ExpectedRope(*c);
  const auto inv_freq = ref_.info["rope_inv_freq"].get<std::vector<double>>();
  ASSERT_EQ(want.inv_freq.size(), inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    // transformers computes inv_freq in float32.
    EXPECT_NEAR(want.inv_freq[i], inv_freq[i], 1e-6 * inv_freq[i]) << name_ << " inv_freq " << i;
  }
  EXPECT_NEAR(want.attention_factor, ref_.info["rope_attention_factor"].get<double>(), 1e-12);
  EXPECT_NEAR(want.softmax_scale, ref_.info["attention_softmax_scale"].get<double>(), 1e-12)
      << name_ << ": attention softmax scale";
  std::printf("%s: rope %s, softmax scale %.9g (transformers %.9g), inv_freq[1] %.9g\n",
              name_.c_str(), c->rope_scaling.type.empty() ? "plain" : c->rope_scaling.type.c_str(),
              want.softmax_scale, ref_.info["attention_softmax_scale"].get<double>(),
              want.inv_freq.size() > 1 ? want.inv_freq[1] : 0.0);
}

// Prefill and greedy decoding with empty trees (the pending token is transformers' token, so
// positions stay comparable after a near-tie): tokens and logits of every position.
TEST_P(ReferenceCheckpointTest, GreedyAndLogitsMatchTransformers) {
  reftest::GreedyDecodeAndCompare(*engine_, ref_, label_, kLogitTol, kKvSlots);
}

// Draft trees: per round the pending token, the next kTreeDepth true tokens as a chain, at every
// depth a wrong sibling (before or after the true node), and under each wrong sibling the next
// true token (right token, wrong branch). Exactly the true chain must be accepted.
TEST_P(ReferenceCheckpointTest, DraftTreesAcceptTheReferenceTokens) {
  reftest::DraftTreesAcceptTheReferenceTokens(*engine_, ref_, label_, kLogitTol, kKvSlots,
                                              kTreeDepth);
}

// The residual stream after every decoder layer (what a drafter gets as hidden states) and the
// top-5 logprobs of every position against transformers (its layer outputs and log-softmax),
// every position of every reference prompt: float32 on both sides, so within 1e-4.
TEST_P(ReferenceCheckpointTest, HiddenStatesAndLogprobsMatchTransformers) {
  reftest::HiddenStatesAndLogprobsMatchTransformers(*engine_, ref_, label_, kLogitTol, kKvSlots);
}

const std::vector<std::string> kCheckpoints = {
    "dense",          "moe_yarn",        "moe_yarn_fp8", "moe_fp8_block128",
    "moe_fp8_mlp128", "moe_fp8_attn128", "mla576",       "kimi_fp8_moe"};

INSTANTIATE_TEST_SUITE_P(Checkpoints, ReferenceConfigTest, ::testing::ValuesIn(kCheckpoints),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

INSTANTIATE_TEST_SUITE_P(Checkpoints, ReferenceCheckpointTest,
                         ::testing::Combine(::testing::ValuesIn(kCheckpoints),
                                            ::testing::Values(1, 2, 4)),
                         reftest::CheckpointTpName);

// The FP8 latent KV cache (kernels/kv_fp8.h, --kv_dtype=fp8): the same greedy comparison with
// every latent row rounded through the format (c_kv e4m3 with a scale per 128 columns, k_pe
// bf16), and draft trees accepting exactly the reference tokens. These tiny models are far more
// sensitive than real ones (kv_lora 32: one scale group; peaky random weights): measured max
// rel logit error 8.1e-2 (dense), 1.24e-1 (moe_fp8_block128), 8.1e-2 (moe_fp8_mlp128), greedy
// tokens equal except at near-ties; hence 0.15. The MoE checkpoints with unpinned routing
// (moe_yarn, moe_yarn_fp8) are left out: the KV error flips near-tied routing decisions there
// (up to 0.94 relative, 6 greedy tokens), as bf16 does on the GPU.
constexpr double kKvFp8LogitTol = 0.15;

class KvFp8CheckpointTest : public ReferenceCheckpointTest {
 protected:
  KvFp8CheckpointTest() { kv_dtype_ = KvDtype::kFp8; }
};

TEST_P(KvFp8CheckpointTest, MatchesTransformersWithinItsError) {
  reftest::GreedyDecodeAndCompare(*engine_, ref_, label_ + " kv fp8", kKvFp8LogitTol, kKvSlots);
}

TEST_P(KvFp8CheckpointTest, DraftTreesAcceptTheReferenceTokens) {
  reftest::DraftTreesAcceptTheReferenceTokens(*engine_, ref_, label_ + " kv fp8", kKvFp8LogitTol,
                                              kKvSlots, kTreeDepth);
}

// The latent rows the engine stores are the format's: every c_kv value is an e4m3 code times
// its group's scale (the group's largest magnitude maps to 448), k_pe values are bf16.
TEST_P(KvFp8CheckpointTest, StoredRowsAreTheFormats) {
  const reftest::PromptRef& pr = ref_.prompts[0];
  reftest::Slots slots(kKvSlots);
  StepRequest q = reftest::ReferenceChain(pr, slots);
  q.accept = false;
  ASSERT_TRUE(engine_->Step({q}).ok());
  const ModelConfig& c = engine_->config();
  const int64_t kvl = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    for (const int32_t slot : q.tail_slots) {
      const std::vector<float> row = engine_->LatentRow(0, layer, slot);
      ASSERT_EQ(static_cast<int64_t>(row.size()), kvl + rope);
      std::vector<float> again = row;  // the format's values are its fixed points
      kernels::KvFp8RoundTrip(again.data(), kvl, rope, kernels::kKvFp8Group);
      for (int64_t j = 0; j < kvl + rope; ++j) {
        ASSERT_EQ(again[j], row[j]) << "layer " << layer << " slot " << slot << " column " << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, KvFp8CheckpointTest,
                         ::testing::Combine(::testing::Values("dense", "moe_fp8_block128",
                                                              "moe_fp8_mlp128", "mla576"),
                                            ::testing::Values(1, 2)),
                         reftest::CheckpointTpName);

}  // namespace
}  // namespace verifyd::tp
