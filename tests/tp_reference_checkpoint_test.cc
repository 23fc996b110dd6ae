// The CPU engine against Hugging Face transformers on the tiny reference checkpoints of
// tests/data (written by tests/data/make_reference_checkpoints.py; see its docstring):
//   dense         MLA, dense MLPs, plain RoPE, bf16, transformers-4 config spelling;
//   moe_yarn      MoE (sigmoid / noaux_tc routing with a non-zero correction bias, groups,
//                 shared expert) + YaRN, bf16 in two shards, transformers-5 config spelling;
//   moe_yarn_fp8  the same architecture as DeepSeek-V3 publishes FP8 (128x128 blocks).
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
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tp/cpu/cpu_engine.h"
#include "tp/model_config.h"
#include "tp/safetensors.h"

#ifndef VERIFYD_TEST_DATA_DIR
#error "VERIFYD_TEST_DATA_DIR must name the tests/data directory"
#endif

namespace verifyd::tp {
namespace {

using json = nlohmann::json;

constexpr double kLogitTol = 1e-4;  // relative logit error (max abs and L2)
constexpr int64_t kKvSlots = 1024;
constexpr int kTreeDepth = 4;  // true draft tokens per tree
constexpr double kPi = 3.14159265358979323846;

std::string DataDir() { return VERIFYD_TEST_DATA_DIR; }
std::string CheckpointDir(const std::string& name) { return DataDir() + "/checkpoints/" + name; }

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct PromptRef {
  std::vector<int32_t> prompt;
  std::vector<int32_t> continuation;  // N greedy tokens
  std::vector<int32_t> argmax;        // greedy token after each position of prompt + cont[:-1]
  std::vector<double> gap;            // top-2 logit gap at each of those positions
  HostTensor logits;                  // [len(prompt) + N - 1, vocab]
};

struct Reference {
  std::string name;
  json info;
  std::vector<PromptRef> prompts;
};

// Loads tests/data/references/<name>.json and <name>_logits.safetensors.
void LoadReference(const std::string& name, Reference* ref) {
  const std::string base = DataDir() + "/references/" + name;
  const std::string text = ReadText(base + ".json");
  ASSERT_FALSE(text.empty()) << "cannot read " << base << ".json";
  ref->name = name;
  ref->info = json::parse(text);
  absl::StatusOr<TensorMap> logits = ReadSafetensorsFile(base + "_logits.safetensors");
  ASSERT_TRUE(logits.ok()) << logits.status();
  const int64_t vocab = ref->info["config"]["vocab_size"].get<int64_t>();
  int k = 0;
  for (const json& p : ref->info["prompts"]) {
    PromptRef pr;
    pr.prompt = p["prompt"].get<std::vector<int32_t>>();
    pr.continuation = p["continuation"].get<std::vector<int32_t>>();
    pr.argmax = p["argmax"].get<std::vector<int32_t>>();
    pr.gap = p["top2_gap"].get<std::vector<double>>();
    auto it = logits->find(absl::StrCat("prompt", k++));
    ASSERT_NE(it, logits->end());
    pr.logits = it->second;
    const size_t rows = pr.prompt.size() + pr.continuation.size() - 1;
    ASSERT_EQ(pr.logits.shape, (std::vector<int64_t>{static_cast<int64_t>(rows), vocab}));
    ASSERT_EQ(pr.argmax.size(), rows);
    ASSERT_EQ(pr.gap.size(), rows);
    ref->prompts.push_back(std::move(pr));
  }
  ASSERT_FALSE(ref->prompts.empty());
}

std::unique_ptr<CpuEngine> MakeEngine(const std::string& name, int tp) {
  EngineOptions o;
  o.model = CheckpointDir(name);
  o.tp = tp;
  o.kv_slots = kKvSlots;
  absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(o);
  EXPECT_TRUE(e.ok()) << name << " tp " << tp << ": " << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// Scattered KV slots: the i-th slot handed out is (i * 37) mod kKvSlots.
class Slots {
 public:
  int32_t Next() { return static_cast<int32_t>((next_++ * 37) % kKvSlots); }

 private:
  int64_t next_ = 0;
};

// Accumulates the comparison of engine rows with reference positions.
class Compare {
 public:
  explicit Compare(int64_t vocab) : vocab_(vocab) {}

  // Engine logits `got` and prediction `got_token` for position `pos` of prompt `k`.
  void Row(const PromptRef& ref, int k, int64_t pos, const float* got, int32_t got_token,
           const char* what) {
    ASSERT_LT(pos, static_cast<int64_t>(ref.argmax.size()));
    const float* want = ref.logits.data.data() + pos * vocab_;
    double max_abs = 0, max_diff = 0, l2_ref = 0, l2_diff = 0;
    bool finite = true;
    for (int64_t v = 0; v < vocab_; ++v) {
      finite = finite && std::isfinite(got[v]);
      const double d = static_cast<double>(got[v]) - want[v];
      max_abs = std::max(max_abs, std::fabs(double{want[v]}));
      max_diff = std::max(max_diff, std::fabs(d));
      l2_ref += double{want[v]} * want[v];
      l2_diff += d * d;
    }
    const double rel = finite ? max_diff / max_abs : INFINITY;
    const double rel_l2 = finite ? std::sqrt(l2_diff / l2_ref) : INFINITY;
    ++positions_;
    if (!(rel <= kLogitTol && rel_l2 <= kLogitTol)) {
      ++bad_logit_rows_;
      if (bad_logit_rows_ <= 3) {
        std::printf(
            "  logits differ: prompt %d position %lld (%s): max|diff|/max|logit| %.3g, "
            "rel-L2 %.3g\n",
            k, static_cast<long long>(pos), what, rel, rel_l2);
      }
    }
    if (rel > max_rel_ || !std::isfinite(rel)) max_rel_ = rel;
    if (rel_l2 > max_rel_l2_ || !std::isfinite(rel_l2)) max_rel_l2_ = rel_l2;
    // A flip of the argmax needs gap <= |diff top1| + |diff top2| <= 2 max|diff|; the measured
    // error only counts up to the tolerance.
    const double bound = 2 * std::min(finite ? max_diff : INFINITY, kLogitTol * max_abs);
    const bool near_tie = ref.gap[pos] < bound;
    const int32_t want_token = ref.argmax[pos];
    if (near_tie) {
      ++near_ties_;
      std::printf(
          "  near-tie: prompt %d position %lld (%s): top-2 gap %.3g < bound %.3g; "
          "transformers %d, engine %d\n",
          k, static_cast<long long>(pos), what, ref.gap[pos], bound, want_token, got_token);
    }
    if (got_token != want_token) {
      if (near_tie) {
        ++near_tie_flips_;
      } else {
        ++token_mismatches_;
        if (token_mismatches_ <= 5) {
          std::printf(
              "  token differs: prompt %d position %lld (%s): transformers %d (top-2 gap "
              "%.3g), engine %d\n",
              k, static_cast<long long>(pos), what, want_token, ref.gap[pos], got_token);
        }
      }
    }
  }

  void Expect(const std::string& label) const {
    std::printf(
        "%s: %lld positions compared, %lld near-ties (%lld flipped), %lld token "
        "mismatches, max rel logit error %.3g, max rel-L2 %.3g\n",
        label.c_str(), static_cast<long long>(positions_), static_cast<long long>(near_ties_),
        static_cast<long long>(near_tie_flips_), static_cast<long long>(token_mismatches_),
        max_rel_, max_rel_l2_);
    EXPECT_GT(positions_, 0) << label;
    EXPECT_EQ(token_mismatches_, 0) << label << ": greedy tokens differ from transformers";
    EXPECT_EQ(bad_logit_rows_, 0) << label << ": logit rows beyond " << kLogitTol
                                  << " relative (max rel " << max_rel_ << ", rel-L2 " << max_rel_l2_
                                  << ")";
  }

  int64_t near_ties() const { return near_ties_; }

 private:
  int64_t vocab_;
  int64_t positions_ = 0, near_ties_ = 0, near_tie_flips_ = 0, token_mismatches_ = 0;
  int64_t bad_logit_rows_ = 0;
  double max_rel_ = 0, max_rel_l2_ = 0;
};

// Prefills `prompt` as one chain (accept = false); compares every prompt row. Returns the
// committed slots.
std::vector<int32_t> Prefill(CpuEngine& e, const PromptRef& ref, int k, Slots& slots,
                             Compare& cmp) {
  StepRequest q;
  q.tokens = ref.prompt;
  for (size_t t = 0; t < ref.prompt.size(); ++t) {
    q.parents.push_back(static_cast<int32_t>(t) - 1);
    q.tail_slots.push_back(slots.Next());
  }
  q.accept = false;
  std::vector<float> logits;
  absl::StatusOr<std::vector<StepResult>> r = e.StepWithLogits({q}, &logits);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return {};
  const int64_t V = e.config().vocab_size;
  EXPECT_EQ(logits.size(), ref.prompt.size() * V);
  if (logits.size() != ref.prompt.size() * V) return {};
  for (size_t t = 0; t < ref.prompt.size(); ++t) {
    cmp.Row(ref, k, static_cast<int64_t>(t), logits.data() + t * V, (*r)[0].predictions[t],
            "prefill");
  }
  EXPECT_EQ((*r)[0].bonus, (*r)[0].predictions.back());
  return q.tail_slots;
}

using Param = std::tuple<std::string, int>;  // checkpoint, tp

class ReferenceCheckpointTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    name_ = std::get<0>(GetParam());
    tp_ = std::get<1>(GetParam());
    label_ = absl::StrCat(name_, " tp=", tp_);
    ASSERT_NO_FATAL_FAILURE(LoadReference(name_, &ref_));
  }

  std::string name_, label_;
  int tp_ = 1;
  Reference ref_;
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
  std::unique_ptr<CpuEngine> e = MakeEngine(name_, tp_);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab_size;
  ASSERT_EQ(V, ref_.info["config"]["vocab_size"].get<int64_t>());
  Compare cmp(V);
  for (size_t k = 0; k < ref_.prompts.size(); ++k) {
    const PromptRef& pr = ref_.prompts[k];
    Slots slots;
    std::vector<int32_t> committed = Prefill(*e, pr, static_cast<int>(k), slots, cmp);
    ASSERT_EQ(committed.size(), pr.prompt.size());
    const int64_t L = static_cast<int64_t>(pr.prompt.size());
    for (size_t i = 0; i + 1 < pr.continuation.size(); ++i) {
      StepRequest q;
      q.context_slots = committed;
      q.tokens = {pr.continuation[i]};
      q.parents = {-1};
      q.tail_slots = {slots.Next()};
      std::vector<float> logits;
      absl::StatusOr<std::vector<StepResult>> r = e->StepWithLogits({q}, &logits);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(logits.size(), static_cast<size_t>(V));
      EXPECT_TRUE((*r)[0].accepted_rows.empty());
      EXPECT_EQ((*r)[0].kept_slots, q.tail_slots);
      cmp.Row(pr, static_cast<int>(k), L + static_cast<int64_t>(i), logits.data(), (*r)[0].bonus,
              "decode");
      committed.push_back(q.tail_slots[0]);
    }
  }
  cmp.Expect(label_ + " greedy");
}

// Draft trees: per round the pending token, the next kTreeDepth true tokens as a chain, at every
// depth a wrong sibling (before or after the true node), and under each wrong sibling the next
// true token (right token, wrong branch). Exactly the true chain must be accepted.
TEST_P(ReferenceCheckpointTest, DraftTreesAcceptTheReferenceTokens) {
  std::unique_ptr<CpuEngine> e = MakeEngine(name_, tp_);
  ASSERT_NE(e, nullptr);
  const int64_t V = e->config().vocab_size;
  Compare cmp(V);
  int64_t rounds = 0, accepted = 0, expected_accepted = 0, short_rounds = 0;
  for (size_t k = 0; k < ref_.prompts.size(); ++k) {
    const PromptRef& pr = ref_.prompts[k];
    const auto& cont = pr.continuation;
    const int64_t L = static_cast<int64_t>(pr.prompt.size());
    const int64_t N = static_cast<int64_t>(cont.size());
    Slots slots;
    std::vector<int32_t> committed = Prefill(*e, pr, static_cast<int>(k), slots, cmp);
    ASSERT_EQ(committed.size(), pr.prompt.size());
    int64_t at = 0;  // the pending token is cont[at], at position L + at
    while (at + 1 < N) {
      const int64_t depth = std::min<int64_t>(kTreeDepth, N - 2 - at);
      StepRequest q;
      q.context_slots = committed;
      q.tokens = {cont[at]};
      q.parents = {-1};
      std::vector<int32_t> true_rows = {0};
      for (int64_t d = 1; d <= depth; ++d) {
        const int32_t parent = true_rows.back();
        const int32_t truth = cont[at + d];
        const int32_t wrong = static_cast<int32_t>((truth + 1 + d) % V);
        auto add = [&](int32_t tok, int32_t par) {
          q.tokens.push_back(tok);
          q.parents.push_back(par);
          return static_cast<int32_t>(q.tokens.size()) - 1;
        };
        int32_t wrong_row = -1, true_row = -1;
        if (d % 2 == 1) {
          wrong_row = add(wrong, parent);
          true_row = add(truth, parent);
        } else {
          true_row = add(truth, parent);
          wrong_row = add(wrong, parent);
        }
        if (d < depth) add(cont[at + d + 1], wrong_row);
        true_rows.push_back(true_row);
      }
      for (size_t t = 0; t < q.tokens.size(); ++t) q.tail_slots.push_back(slots.Next());
      std::vector<float> logits;
      absl::StatusOr<std::vector<StepResult>> r = e->StepWithLogits({q}, &logits);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(logits.size(), q.tokens.size() * V);
      const StepResult& res = (*r)[0];
      ++rounds;
      expected_accepted += depth;
      // The true rows' logits and predictions against transformers' positions.
      for (int64_t d = 0; d <= depth; ++d) {
        const int32_t row = true_rows[d];
        cmp.Row(pr, static_cast<int>(k), L + at + d, logits.data() + row * V, res.predictions[row],
                "tree");
      }
      // Accepted rows: a prefix of the true chain, every accepted token the reference's.
      const size_t n_acc = res.accepted_rows.size();
      ASSERT_LE(n_acc, static_cast<size_t>(depth)) << label_ << " round " << rounds;
      for (size_t a = 0; a < n_acc; ++a) {
        EXPECT_EQ(res.accepted_rows[a], true_rows[a + 1])
            << label_ << " prompt " << k << " round " << rounds << ": accepted row " << a;
        EXPECT_EQ(q.tokens[res.accepted_rows[a]], cont[at + 1 + a]);
      }
      std::vector<int32_t> kept = {q.tail_slots[0]};
      for (int32_t row : res.accepted_rows) kept.push_back(q.tail_slots[row]);
      EXPECT_EQ(res.kept_slots, kept);
      accepted += static_cast<int64_t>(n_acc);
      if (n_acc < static_cast<size_t>(depth)) {
        // Only a near-tie (checked and counted by cmp.Row) can stop the true chain early.
        ++short_rounds;
        std::printf("  %s prompt %zu: tree round %lld accepted %zu of %lld true tokens\n",
                    label_.c_str(), k, static_cast<long long>(rounds), n_acc,
                    static_cast<long long>(depth));
      } else if (at + depth + 1 < N) {
        EXPECT_EQ(res.bonus, cont[at + depth + 1]) << label_ << " prompt " << k;
      }
      committed.insert(committed.end(), res.kept_slots.begin(), res.kept_slots.end());
      at += static_cast<int64_t>(n_acc) + 1;  // continue from transformers' token
    }
  }
  cmp.Expect(label_ + " trees");
  std::printf("%s trees: %lld rounds, %lld of %lld true draft tokens accepted, %lld short rounds\n",
              label_.c_str(), static_cast<long long>(rounds), static_cast<long long>(accepted),
              static_cast<long long>(expected_accepted), static_cast<long long>(short_rounds));
  EXPECT_LE(short_rounds, cmp.near_ties()) << label_;
}

const std::vector<std::string> kCheckpoints = {"dense", "moe_yarn", "moe_yarn_fp8"};

INSTANTIATE_TEST_SUITE_P(Checkpoints, ReferenceConfigTest, ::testing::ValuesIn(kCheckpoints),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

INSTANTIATE_TEST_SUITE_P(Checkpoints, ReferenceCheckpointTest,
                         ::testing::Combine(::testing::ValuesIn(kCheckpoints),
                                            ::testing::Values(1, 2, 4)),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::get<0>(info.param) + "_tp" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace verifyd::tp
