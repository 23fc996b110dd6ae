// Shared by the tests that compare an engine with Hugging Face transformers on the reference
// checkpoints of tests/data (tests/data/make_reference_checkpoints.py): reading a reference
// (its JSON and logits), scattered KV slots, the per-position comparison of logits and greedy
// tokens with near-tie accounting, the prefill of a prompt as one chain, and the two
// engine-generic test bodies (greedy decoding, draft trees) over an engine type with
// StepWithLogits (CpuEngine, CudaEngine).
// Header-only; needs VERIFYD_TEST_DATA_DIR (the tests/data directory) defined by the build.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tp/engine.h"
#include "tp/engine_options.h"
#include "tp/safetensors.h"

#ifndef VERIFYD_TEST_DATA_DIR
#error "VERIFYD_TEST_DATA_DIR must name the tests/data directory"
#endif

namespace verifyd::tp::reftest {

using json = nlohmann::json;

// tests/data of the source tree; $VERIFYD_TEST_DATA_DIR overrides it (a test binary run on
// another machine than the one it was built on).
inline std::string DataDir() {
  const char* env = std::getenv("VERIFYD_TEST_DATA_DIR");
  return env != nullptr && env[0] != '\0' ? std::string(env) : std::string(VERIFYD_TEST_DATA_DIR);
}
inline std::string CheckpointDir(const std::string& name) {
  return DataDir() + "/checkpoints/" + name;
}

inline std::string ReadText(const std::string& path) {
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
  HostTensor hidden;  // [len(prompt) + N - 1, layers, hidden]: the residual stream after
                      // every decoder layer (transformers' layer outputs)
};

struct Reference {
  std::string name;
  json info;
  std::vector<PromptRef> prompts;
};

// Loads tests/data/references/<name>.json, <name>_logits.safetensors and
// <name>_hidden.safetensors.
inline void LoadReference(const std::string& name, Reference* ref) {
  const std::string base = DataDir() + "/references/" + name;
  const std::string text = ReadText(base + ".json");
  ASSERT_FALSE(text.empty()) << "cannot read " << base << ".json";
  ref->name = name;
  ref->info = json::parse(text);
  absl::StatusOr<TensorMap> logits = ReadSafetensorsFile(base + "_logits.safetensors");
  ASSERT_TRUE(logits.ok()) << logits.status();
  absl::StatusOr<TensorMap> hidden = ReadSafetensorsFile(base + "_hidden.safetensors");
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  const int64_t layers = ref->info["config"]["num_hidden_layers"].get<int64_t>();
  const int64_t width = ref->info["config"]["hidden_size"].get<int64_t>();
  const int64_t vocab = ref->info["config"]["vocab_size"].get<int64_t>();
  int k = 0;
  for (const json& p : ref->info["prompts"]) {
    PromptRef pr;
    pr.prompt = p["prompt"].get<std::vector<int32_t>>();
    pr.continuation = p["continuation"].get<std::vector<int32_t>>();
    pr.argmax = p["argmax"].get<std::vector<int32_t>>();
    pr.gap = p["top2_gap"].get<std::vector<double>>();
    auto it = logits->find(absl::StrCat("prompt", k));
    ASSERT_NE(it, logits->end());
    pr.logits = it->second;
    auto ht = hidden->find(absl::StrCat("prompt", k++));
    ASSERT_NE(ht, hidden->end());
    pr.hidden = ht->second;
    const size_t rows = pr.prompt.size() + pr.continuation.size() - 1;
    ASSERT_EQ(pr.logits.shape, (std::vector<int64_t>{static_cast<int64_t>(rows), vocab}));
    ASSERT_EQ(pr.hidden.shape, (std::vector<int64_t>{static_cast<int64_t>(rows), layers, width}));
    ASSERT_EQ(pr.argmax.size(), rows);
    ASSERT_EQ(pr.gap.size(), rows);
    ref->prompts.push_back(std::move(pr));
  }
  ASSERT_FALSE(ref->prompts.empty());
}

// The parameter of the engine-against-transformers suites: a checkpoint of tests/data and a
// TP degree; gtest names it "<checkpoint>_tp<tp>".
using CheckpointTp = std::tuple<std::string, int>;
inline std::string CheckpointTpName(const ::testing::TestParamInfo<CheckpointTp>& info) {
  return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param));
}

// Base of the suites that compare an engine (EngineT: CpuEngine, CudaEngine) with transformers
// over a CheckpointTp parameter: the checkpoint and TP degree, a label
// "<label_prefix><checkpoint> tp=<tp>" for messages, the checkpoint's reference, and engine_,
// the engine under test, opened by the suite's Make with kv_dtype_ (which a derived suite may
// set in its constructor). A reference that does not load or an engine that does not open
// fails SetUp.
template <typename EngineT>
class CheckpointTpTest : public ::testing::TestWithParam<CheckpointTp> {
 protected:
  explicit CheckpointTpTest(std::string label_prefix = "")
      : label_prefix_(std::move(label_prefix)) {}

  void SetUp() override {
    name_ = std::get<0>(GetParam());
    tp_ = std::get<1>(GetParam());
    label_ = absl::StrCat(label_prefix_, name_, " tp=", tp_);
    ASSERT_NO_FATAL_FAILURE(LoadReference(name_, &ref_));
    engine_ = Make(kv_dtype_);
    ASSERT_NE(engine_, nullptr);
  }

  // The engine of checkpoint name_ at TP tp_ with the given KV cache format (nullptr, with a
  // failure, when it does not open).
  virtual std::unique_ptr<EngineT> Make(KvDtype kv_dtype) = 0;

  std::string label_prefix_, name_, label_;
  int tp_ = 1;
  Reference ref_;
  KvDtype kv_dtype_ = KvDtype::kAuto;
  std::unique_ptr<EngineT> engine_;
};

// Scattered KV slots: the i-th slot handed out is (i * 37) mod capacity.
class Slots {
 public:
  explicit Slots(int64_t capacity) : capacity_(capacity) {}
  int32_t Next() { return static_cast<int32_t>((next_++ * 37) % capacity_); }

 private:
  int64_t capacity_;
  int64_t next_ = 0;
};

// Accumulates the comparison of engine rows with reference positions: logits within `tol`
// relative (max |diff| / max |logit| and rel-L2), tokens equal except at near-ties (a top-2
// gap below twice the measured max |diff|, capped by the tolerance), counted and printed.
class Compare {
 public:
  Compare(int64_t vocab, double tol) : vocab_(vocab), tol_(tol) {}

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
    if (!(rel <= tol_ && rel_l2 <= tol_)) {
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
    const double bound = 2 * std::min(finite ? max_diff : INFINITY, tol_ * max_abs);
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

  int64_t near_tie_flips() const { return near_tie_flips_; }

  void Expect(const std::string& label) const {
    std::printf(
        "%s: %lld positions compared, %lld near-ties (%lld flipped), %lld token "
        "mismatches, max rel logit error %.3g, max rel-L2 %.3g\n",
        label.c_str(), static_cast<long long>(positions_), static_cast<long long>(near_ties_),
        static_cast<long long>(near_tie_flips_), static_cast<long long>(token_mismatches_),
        max_rel_, max_rel_l2_);
    EXPECT_GT(positions_, 0) << label;
    EXPECT_EQ(token_mismatches_, 0) << label << ": greedy tokens differ from transformers";
    EXPECT_EQ(bad_logit_rows_, 0) << label << ": logit rows beyond " << tol_
                                  << " relative (max rel " << max_rel_ << ", rel-L2 " << max_rel_l2_
                                  << ")";
  }

  int64_t near_ties() const { return near_ties_; }

 private:
  int64_t vocab_;
  double tol_;
  int64_t positions_ = 0, near_ties_ = 0, near_tie_flips_ = 0, token_mismatches_ = 0;
  int64_t bad_logit_rows_ = 0;
  double max_rel_ = 0, max_rel_l2_ = 0;
};

// `tokens` as one chain request (a prefill chunk: accept = false), tail slots from `slots`.
inline StepRequest ChainRequest(std::vector<int32_t> tokens, Slots& slots) {
  StepRequest q;
  q.tokens = std::move(tokens);
  for (size_t t = 0; t < q.tokens.size(); ++t) {
    q.parents.push_back(static_cast<int32_t>(t) - 1);
    q.tail_slots.push_back(slots.Next());
  }
  q.accept = false;
  return q;
}

// One greedy decoding step: `token` as an empty tree (its root alone) after the `committed`
// slots, its tail slot from `slots`.
inline StepRequest DecodeStep(const std::vector<int32_t>& committed, int32_t token, Slots& slots) {
  StepRequest q;
  q.context_slots = committed;
  q.tokens = {token};
  q.parents = {-1};
  q.tail_slots = {slots.Next()};
  return q;
}

// Prefills `prompt` as one chain (accept = false) on an engine with StepWithLogits (CPU or
// CUDA); compares every prompt row. Returns the committed slots.
template <typename EngineT>
std::vector<int32_t> Prefill(EngineT& e, const PromptRef& ref, int k, Slots& slots, Compare& cmp) {
  const StepRequest q = ChainRequest(ref.prompt, slots);
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

// Prefill and greedy decoding with empty trees (the pending token is transformers' token, so
// positions stay comparable after a near-tie): tokens and logits of every position, compared
// within `tol` on an engine with StepWithLogits (CPU or CUDA); `label` prefixes the summary.
template <typename EngineT>
void GreedyDecodeAndCompare(EngineT& e, const Reference& ref, const std::string& label, double tol,
                            int64_t kv_slots) {
  const int64_t V = e.config().vocab_size;
  ASSERT_EQ(V, ref.info["config"]["vocab_size"].get<int64_t>());
  Compare cmp(V, tol);
  for (size_t k = 0; k < ref.prompts.size(); ++k) {
    const PromptRef& pr = ref.prompts[k];
    Slots slots(kv_slots);
    std::vector<int32_t> committed = Prefill(e, pr, static_cast<int>(k), slots, cmp);
    ASSERT_EQ(committed.size(), pr.prompt.size());
    const int64_t L = static_cast<int64_t>(pr.prompt.size());
    for (size_t i = 0; i + 1 < pr.continuation.size(); ++i) {
      const StepRequest q = DecodeStep(committed, pr.continuation[i], slots);
      std::vector<float> logits;
      absl::StatusOr<std::vector<StepResult>> r = e.StepWithLogits({q}, &logits);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(logits.size(), static_cast<size_t>(V));
      EXPECT_TRUE((*r)[0].accepted_rows.empty());
      EXPECT_EQ((*r)[0].kept_slots, q.tail_slots);
      cmp.Row(pr, static_cast<int>(k), L + static_cast<int64_t>(i), logits.data(), (*r)[0].bonus,
              "decode");
      committed.push_back(q.tail_slots[0]);
    }
  }
  cmp.Expect(label + " greedy");
}

// Draft trees: per round the pending token, the next `tree_depth` true tokens as a chain, at
// every depth a wrong sibling (before or after the true node), and under each wrong sibling the
// next true token (right token, wrong branch). Exactly the true chain must be accepted; the
// true rows' logits are compared within `tol`. Engine with StepWithLogits (CPU or CUDA).
template <typename EngineT>
void DraftTreesAcceptTheReferenceTokens(EngineT& e, const Reference& ref, const std::string& label,
                                        double tol, int64_t kv_slots, int tree_depth) {
  const int64_t V = e.config().vocab_size;
  Compare cmp(V, tol);
  int64_t rounds = 0, accepted = 0, expected_accepted = 0, short_rounds = 0;
  for (size_t k = 0; k < ref.prompts.size(); ++k) {
    const PromptRef& pr = ref.prompts[k];
    const auto& cont = pr.continuation;
    const int64_t L = static_cast<int64_t>(pr.prompt.size());
    const int64_t N = static_cast<int64_t>(cont.size());
    Slots slots(kv_slots);
    std::vector<int32_t> committed = Prefill(e, pr, static_cast<int>(k), slots, cmp);
    ASSERT_EQ(committed.size(), pr.prompt.size());
    int64_t at = 0;  // the pending token is cont[at], at position L + at
    while (at + 1 < N) {
      const int64_t depth = std::min<int64_t>(tree_depth, N - 2 - at);
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
      absl::StatusOr<std::vector<StepResult>> r = e.StepWithLogits({q}, &logits);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(logits.size(), q.tokens.size() * V);
      const StepResult& res = (*r)[0];
      ++rounds;
      expected_accepted += depth;
      // The true rows' logits and predictions against transformers' positions.
      const int64_t flips_before = cmp.near_tie_flips();
      for (int64_t d = 0; d <= depth; ++d) {
        const int32_t row = true_rows[d];
        cmp.Row(pr, static_cast<int>(k), L + at + d, logits.data() + row * V, res.predictions[row],
                "tree");
      }
      // Accepted rows: a prefix of the true chain, every accepted token the reference's.
      const size_t n_acc = res.accepted_rows.size();
      ASSERT_LE(n_acc, static_cast<size_t>(depth)) << label << " round " << rounds;
      for (size_t a = 0; a < n_acc; ++a) {
        EXPECT_EQ(res.accepted_rows[a], true_rows[a + 1])
            << label << " prompt " << k << " round " << rounds << ": accepted row " << a;
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
                    label.c_str(), k, static_cast<long long>(rounds), n_acc,
                    static_cast<long long>(depth));
      } else if (at + depth + 1 < N && cmp.near_tie_flips() == flips_before) {
        // The bonus is the last true row's prediction: equal unless that row flipped at a
        // (counted) near-tie.
        EXPECT_EQ(res.bonus, cont[at + depth + 1]) << label << " prompt " << k;
      }
      committed.insert(committed.end(), res.kept_slots.begin(), res.kept_slots.end());
      at += static_cast<int64_t>(n_acc) + 1;  // continue from transformers' token
    }
  }
  cmp.Expect(label + " trees");
  std::printf("%s trees: %lld rounds, %lld of %lld true draft tokens accepted, %lld short rounds\n",
              label.c_str(), static_cast<long long>(rounds), static_cast<long long>(accepted),
              static_cast<long long>(expected_accepted), static_cast<long long>(short_rounds));
  EXPECT_LE(short_rounds, cmp.near_ties()) << label;
}

// prompt + continuation[:-1] of a reference prompt as one chain request (a prefill chunk),
// tail slots from `slots`: its rows are the reference's positions.
inline StepRequest ReferenceChain(const PromptRef& pr, Slots& slots) {
  std::vector<int32_t> tokens = pr.prompt;
  tokens.insert(tokens.end(), pr.continuation.begin(), pr.continuation.end() - 1);
  return ChainRequest(std::move(tokens), slots);
}

// Runs prompt + continuation[:-1] of every reference prompt as one request (a chain) with every
// layer's hidden state and the top-5 logprobs of every row requested, and compares:
//   hidden states: each (row, layer) residual-stream vector with transformers' layer output,
//     rel-L2 within `tol`;
//   logprobs: each row's logprob of its prediction and of its top-5 tokens with transformers'
//     log-softmax at those tokens, within 2 x tol x the row's max |logit| (a logprob is a logit
//     minus the log-sum-exp, each off by at most the logit tolerance).
// Prints the largest errors.
template <typename EngineT>
void HiddenStatesAndLogprobsMatchTransformers(EngineT& e, const Reference& ref,
                                              const std::string& label, double tol,
                                              int64_t kv_slots) {
  const int64_t L = e.config().num_hidden_layers, H = e.config().hidden_size;
  const int64_t V = e.config().vocab_size;
  double worst_hidden = 0, worst_lp = 0;
  int64_t vectors = 0, logprobs = 0;
  for (size_t k = 0; k < ref.prompts.size(); ++k) {
    const PromptRef& pr = ref.prompts[k];
    Slots slots(kv_slots);
    // Hidden states of every row: as a prefill chunk (a tree returns its committed rows'
    // only); logprobs of every row: as a tree (a prefill chunk gives only its last row's).
    StepRequest q = ReferenceChain(pr, slots);
    for (int32_t l = 0; l < L; ++l) q.hidden_layers.push_back(l);
    absl::StatusOr<std::vector<StepResult>> rh = e.Step({q});
    ASSERT_TRUE(rh.ok()) << label << ": " << rh.status();
    q.accept = true;
    q.hidden_layers.clear();
    q.top_logprobs = 5;
    for (int32_t& s : q.tail_slots) s = static_cast<int32_t>((s + kv_slots / 2) % kv_slots);
    absl::StatusOr<std::vector<StepResult>> r = e.Step({q});
    ASSERT_TRUE(r.ok()) << label << ": " << r.status();
    const StepResult& res = (*r)[0];
    const std::vector<float>& hidden = (*rh)[0].hidden;
    const int64_t n = static_cast<int64_t>(q.tokens.size());
    ASSERT_EQ(static_cast<int64_t>(hidden.size()), n * L * H) << label;
    ASSERT_EQ(static_cast<int64_t>(res.logprobs.size()), n) << label;
    const float* want = pr.hidden.data.data();
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t l = 0; l < L; ++l) {
        double num = 0, den = 0;
        for (int64_t h = 0; h < H; ++h) {
          const double d = double(hidden[(t * L + l) * H + h]) - want[(t * L + l) * H + h];
          num += d * d;
          den += double(want[(t * L + l) * H + h]) * want[(t * L + l) * H + h];
        }
        const double rel = std::sqrt(num / den);
        worst_hidden = std::max(worst_hidden, rel);
        ++vectors;
        EXPECT_LE(rel, tol) << label << " prompt " << k << " position " << t << " layer " << l;
      }
      // transformers' log-softmax of the row, in double.
      const float* lg = pr.logits.data.data() + t * V;
      double mx = lg[0], ma = 0;
      for (int64_t v = 0; v < V; ++v) {
        mx = std::max(mx, double(lg[v]));
        ma = std::max(ma, std::fabs(double(lg[v])));
      }
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(lg[v]) - mx);
      const double lse = mx + std::log(sum);
      const RowLogprobs& lp = res.logprobs[t];
      EXPECT_EQ(lp.token, res.predictions[t]) << label;
      ASSERT_EQ(lp.top_tokens.size(), 5u) << label;
      ASSERT_EQ(lp.top_logprobs.size(), 5u) << label;
      auto check = [&](int32_t token, float got) {
        ASSERT_GE(token, 0);
        ASSERT_LT(token, V);
        const double err = std::fabs(double(got) - (double(lg[token]) - lse));
        worst_lp = std::max(worst_lp, err / ma);
        ++logprobs;
        EXPECT_LE(err, 2 * tol * ma)
            << label << " prompt " << k << " position " << t << " token " << token;
      };
      check(lp.token, lp.logprob);
      for (size_t i = 0; i < lp.top_tokens.size(); ++i) {
        check(lp.top_tokens[i], lp.top_logprobs[i]);
        if (i > 0) EXPECT_GE(lp.top_logprobs[i - 1], lp.top_logprobs[i]) << label;
      }
    }
  }
  std::printf(
      "%s: %lld hidden-state vectors, max rel-L2 %.3g; %lld logprobs, max |diff| / max "
      "|logit| %.3g (vs transformers)\n",
      label.c_str(), static_cast<long long>(vectors), worst_hidden,
      static_cast<long long>(logprobs), worst_lp);
}

}  // namespace verifyd::tp::reftest
