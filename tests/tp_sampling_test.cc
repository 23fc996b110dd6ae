// Sampled verification on the CPU engine (tp/engine.h, kernels/sampling.h): the drawn tokens
// follow the target's temperature-scaled, top-k / top-p filtered distribution (chi-square over
// thousands of seeds), logprobs equal a direct computation from the engine's logits, hidden
// states equal the residual stream the model's own shorter presets end with, and the
// reference sampler's edge cases (ties, greedy, the noise).
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "kernels/reference/ops.h"
#include "kernels/reference/sampling_ref.h"
#include "kernels/sampling.h"
#include "tests/step_request_util.h"
#include "tp/cpu/cpu_engine.h"
#include "tp/presets.h"
#include "tp/weights.h"

namespace verifyd::tp {
namespace {

constexpr uint64_t kSeed = 1234;

std::unique_ptr<CpuEngine> MakeEngine(int tp = 1, int64_t layers = 0) {
  EngineOptions o;
  o.model = "tiny";
  o.seed = kSeed;
  o.tp = tp;
  o.kv_slots = 4096;
  o.preset_layers = layers;
  absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// The target distribution, computed here independently of the sampler (sort-based): softmax
// of logits / T over the top_k best (ties kept), then the smallest most-probable prefix whose
// mass reaches top_p (ties kept).
std::vector<double> ExpectedDistribution(const std::vector<float>& logits, float temperature,
                                         int top_k, float top_p) {
  const int V = static_cast<int>(logits.size());
  std::vector<float> z(V);
  for (int i = 0; i < V; ++i) z[i] = logits[i] / temperature;
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
  int kept = V;
  if (top_k > 0 && top_k < V) {
    kept = top_k;
    while (kept < V && z[order[kept]] == z[order[top_k - 1]]) ++kept;
  }
  std::vector<double> w(kept);
  double total = 0;
  for (int k = 0; k < kept; ++k) total += w[k] = std::exp(double{z[order[k]]} - z[order[0]]);
  // Groups of equal z, best first: a group is kept while the mass above it is < top_p.
  std::vector<double> p(V, 0.0);
  double above = 0;
  for (int k = 0; k < kept;) {
    int e = k;
    double group = 0;
    while (e < kept && z[order[e]] == z[order[k]]) group += w[e++];
    if (above / total >= top_p) break;
    for (int j = k; j < e; ++j) p[order[j]] = w[j];
    above += group;
    k = e;
  }
  const double kept_mass = above;
  for (double& v : p) v /= kept_mass;
  return p;
}

// Upper tail of chi-square with `df` degrees of freedom at 1e-4 (Wilson-Hilferty).
double ChiSquareCritical1e4(int df) {
  const double z = 3.7190;  // standard normal, one-sided 1e-4
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

struct Case {
  float temperature;
  int top_k;
  float top_p;
};

// Thousands of seeds at one position: every request of a step is the same one-token prompt
// with its own seed, so its last-row prediction is the draw at position 1 from the same
// logits (the CPU engine is batch-invariant). The empirical distribution must pass a
// chi-square goodness-of-fit test at false-alarm rate 1e-4 (fixed seeds: deterministic), and
// no filtered-out token may ever be drawn.
TEST(Sampling, DrawsFollowTheFilteredTargetDistribution) {
  auto e = MakeEngine();
  ASSERT_NE(e, nullptr);
  const int V = static_cast<int>(e->config().vocab_size);
  const std::vector<int32_t> prompt = {17};
  std::vector<float> logits;
  ASSERT_TRUE(e->StepWithLogits({test_util::PrefillChain(prompt, 0)}, &logits).ok());
  ASSERT_EQ(static_cast<int>(logits.size()), V);

  const Case cases[] = {{1.0f, 0, 1.0f}, {0.7f, 8, 1.0f}, {1.5f, 0, 0.8f}, {1.0f, 40, 0.9f}};
  constexpr int kDraws = 12800;
  constexpr int kBatch = 64;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message()
                 << "T=" << c.temperature << " top_k=" << c.top_k << " top_p=" << c.top_p);
    const std::vector<double> expected =
        ExpectedDistribution(logits, c.temperature, c.top_k, c.top_p);
    std::vector<int64_t> counts(V, 0);
    for (int done = 0; done < kDraws; done += kBatch) {
      std::vector<StepRequest> batch;
      for (int b = 0; b < kBatch; ++b) {
        StepRequest q = test_util::PrefillChain(prompt, b);
        q.sampling.temperature = c.temperature;
        q.sampling.top_k = c.top_k;
        q.sampling.top_p = c.top_p;
        q.sampling.seed = 1000003ull * static_cast<uint64_t>(done + b) + 7;
        batch.push_back(q);
      }
      auto res = e->Step(batch);
      ASSERT_TRUE(res.ok()) << res.status();
      for (const StepResult& r : *res) counts[r.predictions.back()]++;
    }
    // Bins: every token expected >= 5 times alone, the rest of the kept tokens pooled.
    double chi2 = 0, pooled_exp = 0, pooled_obs = 0;
    int bins = 0, kept = 0;
    for (int t = 0; t < V; ++t) {
      if (expected[t] == 0) {
        EXPECT_EQ(counts[t], 0) << "token " << t << " is filtered out but was drawn";
        continue;
      }
      ++kept;
      const double ex = expected[t] * kDraws;
      if (ex >= 5) {
        chi2 += (counts[t] - ex) * (counts[t] - ex) / ex;
        ++bins;
      } else {
        pooled_exp += ex;
        pooled_obs += static_cast<double>(counts[t]);
      }
    }
    if (pooled_exp > 0) {
      chi2 += (pooled_obs - pooled_exp) * (pooled_obs - pooled_exp) / pooled_exp;
      ++bins;
    }
    ASSERT_GE(bins, 3) << "the case must spread over several tokens";
    if (c.top_k > 0) EXPECT_LE(kept, c.top_k + 2);
    if (c.top_k == 0 && c.top_p == 1.0f) EXPECT_EQ(kept, V);
    EXPECT_LT(chi2, ChiSquareCritical1e4(bins - 1)) << bins << " bins, " << kept << " kept";
  }
}

// The same seed and position always draw the same token; other seeds draw others.
TEST(Sampling, DrawDependsOnlyOnSeedAndPosition) {
  auto e = MakeEngine();
  ASSERT_NE(e, nullptr);
  std::set<int32_t> seen;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    std::vector<int32_t> got;
    for (int rep = 0; rep < 2; ++rep) {
      StepRequest q = test_util::PrefillChain({3, 4, 5}, rep * 8);
      q.sampling.temperature = 1.0f;
      q.sampling.seed = seed;
      // Another request in the batch does not change the draw (batch-invariant).
      std::vector<StepRequest> batch = {q};
      if (rep == 1) batch.insert(batch.begin(), test_util::PrefillChain({9, 9}, 40));
      auto r = e->Step(batch);
      ASSERT_TRUE(r.ok()) << r.status();
      got.push_back(r->back().predictions.back());
    }
    EXPECT_EQ(got[0], got[1]);
    seen.insert(got[0]);
  }
  EXPECT_GT(seen.size(), 3u);
}

double LogSumExp(const std::vector<double>& z) {
  const double m = *std::max_element(z.begin(), z.end());
  double s = 0;
  for (double v : z) s += std::exp(v - m);
  return m + std::log(s);
}

// Logprobs of every row of a verify tree, greedy and sampled, against log-softmax of the
// engine's own logits (divided by the temperature), and the top tokens in order.
TEST(Sampling, LogprobsEqualDirectComputation) {
  for (const float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE(testing::Message() << "T=" << temperature);
    auto e = MakeEngine(2);
    ASSERT_NE(e, nullptr);
    const int V = static_cast<int>(e->config().vocab_size);
    ASSERT_TRUE(e->Step({test_util::PrefillChain({1, 2, 3, 4}, 0)}).ok());
    StepRequest q;
    q.context_slots = {0, 1, 2, 3};
    q.tokens = {7, 8, 9, 10};
    q.parents = {-1, 0, 0, 1};
    q.tail_slots = {4, 5, 6, 7};
    q.sampling.temperature = temperature;
    q.sampling.top_k = 30;
    q.sampling.seed = 5;
    q.top_logprobs = 5;
    std::vector<float> logits;
    auto r = e->StepWithLogits({q}, &logits);
    ASSERT_TRUE(r.ok()) << r.status();
    const StepResult& res = (*r)[0];
    ASSERT_EQ(res.logprobs.size(), q.tokens.size());
    for (size_t t = 0; t < q.tokens.size(); ++t) {
      std::vector<double> z(V);
      for (int i = 0; i < V; ++i) {
        z[i] = temperature > 0 ? double{logits[t * V + i] / temperature} : logits[t * V + i];
      }
      const double lse = LogSumExp(z);
      const RowLogprobs& lp = res.logprobs[t];
      EXPECT_EQ(lp.token, res.predictions[t]);
      EXPECT_NEAR(lp.logprob, z[lp.token] - lse, 1e-5);
      std::vector<int> order(V);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
      ASSERT_EQ(lp.top_tokens.size(), 5u);
      for (int k = 0; k < 5; ++k) {
        EXPECT_EQ(lp.top_tokens[k], order[k]);
        EXPECT_NEAR(lp.top_logprobs[k], z[order[k]] - lse, 1e-5);
      }
      if (temperature == 0) EXPECT_EQ(lp.token, order[0]);  // greedy: the argmax
    }
  }
}

// Hidden states: layer L of the full model is the residual stream the model truncated to
// L + 1 layers ends with (the seeded weights of a layer do not depend on the layer count), so
// final RMSNorm + LM head of the returned layer-L rows must give that truncated model's logits.
// Also: greedy predictions do not change when hidden states / logprobs are asked for, and the
// rows come in request order, layers in the order asked, at TP 1 and TP 2 alike.
TEST(Sampling, HiddenStatesAreTheResidualStreamAfterEachLayer) {
  auto full = MakeEngine(1);
  auto full_tp2 = MakeEngine(2);
  ASSERT_NE(full, nullptr);
  ASSERT_NE(full_tp2, nullptr);
  const ModelConfig& c = full->config();
  const int64_t H = c.hidden_size, V = c.vocab_size, L = c.num_hidden_layers;
  ASSERT_EQ(L, 2);
  absl::StatusOr<ModelWeights> w = GenerateRandomWeights(c, kSeed);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::vector<int32_t> prompt = {5, 9, 11, 300, 42};
  StepRequest q = test_util::PrefillChain(prompt, 0);
  q.hidden_layers = {1, 0};
  std::vector<float> logits_plain;
  auto plain = full->StepWithLogits({test_util::PrefillChain(prompt, 100)}, &logits_plain);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto r1 = full->Step({q});
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto r2 = full_tp2->Step({q});
  ASSERT_TRUE(r2.ok()) << r2.status();
  const std::vector<float>& hidden = (*r1)[0].hidden;
  ASSERT_EQ(static_cast<int64_t>(hidden.size()), static_cast<int64_t>(prompt.size()) * 2 * H);
  EXPECT_EQ((*r1)[0].predictions, (*plain)[0].predictions);
  const std::vector<float>& h2 = (*r2)[0].hidden;
  ASSERT_EQ(h2.size(), hidden.size());
  double tp_err = 0;
  for (size_t i = 0; i < hidden.size(); ++i)
    tp_err = std::max(tp_err, double{std::abs(h2[i] - hidden[i])});
  EXPECT_LT(tp_err, 1e-4);

  const HostTensor* norm_t = w->Find("model.norm.weight");
  const HostTensor* head_t = w->Find("lm_head.weight");
  if (head_t == nullptr) head_t = w->Find("model.embed_tokens.weight");  // tied
  ASSERT_NE(norm_t, nullptr);
  ASSERT_NE(head_t, nullptr);
  const std::vector<float>& final_norm = norm_t->data;
  const std::vector<float>& lm_head = head_t->data;
  for (int li = 0; li < 2; ++li) {
    const int layer = q.hidden_layers[li];
    auto truncated = MakeEngine(1, layer + 1);
    ASSERT_NE(truncated, nullptr);
    std::vector<float> expect;
    ASSERT_TRUE(truncated->StepWithLogits({test_util::PrefillChain(prompt, 0)}, &expect).ok());
    const int64_t n = static_cast<int64_t>(prompt.size());
    std::vector<float> rows(n * H), normed(n * H), got(n * V);
    for (int64_t t = 0; t < n; ++t) {
      std::copy_n(hidden.begin() + (t * 2 + li) * H, H, rows.begin() + t * H);
    }
    kernels::ref::RmsNorm(rows.data(), n, H, H, final_norm.data(),
                          static_cast<float>(c.rms_norm_eps), normed.data());
    kernels::ref::Linear(normed.data(), n, H, H, lm_head.data(), V, got.data(), V);
    double err = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, double{std::abs(got[i] - expect[i])});
      scale = std::max(scale, double{std::abs(expect[i])});
    }
    EXPECT_LT(err, 1e-4 * std::max(1.0, scale)) << "layer " << layer;
  }
}

// Greedy requests are unchanged by the sampling fields (temperature 0 ignores top-k / top-p /
// seed) and by a sampled neighbour in the batch.
TEST(Sampling, GreedyRowsAreTheArgmax) {
  auto e = MakeEngine();
  ASSERT_NE(e, nullptr);
  StepRequest greedy = test_util::PrefillChain({1, 2, 3}, 0);
  auto base = e->Step({greedy});
  ASSERT_TRUE(base.ok());
  StepRequest g2 = test_util::PrefillChain({1, 2, 3}, 10);
  g2.sampling.top_k = 1;
  g2.sampling.top_p = 0.1f;
  g2.sampling.seed = 99;
  g2.sampling.temperature = kernels::kMinSamplingTemperature / 2;
  StepRequest hot = test_util::PrefillChain({1, 2, 3}, 20);
  hot.sampling.temperature = 5.0f;
  auto r = e->Step({g2, hot});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].predictions, (*base)[0].predictions);
}

TEST(Sampling, InvalidParamsNameTheField) {
  auto e = MakeEngine();
  ASSERT_NE(e, nullptr);
  auto expect_bad = [&](StepRequest q, const std::string& field) {
    auto r = e->Step({q});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status();
  };
  StepRequest q = test_util::PrefillChain({1, 2}, 0);
  q.sampling.temperature = -1;
  expect_bad(q, "batch[0].sampling.temperature");
  q.sampling.temperature = std::nanf("");
  expect_bad(q, "batch[0].sampling.temperature");
  q = test_util::PrefillChain({1, 2}, 0);
  q.sampling.top_p = 0;
  expect_bad(q, "batch[0].sampling.top_p");
  q = test_util::PrefillChain({1, 2}, 0);
  q.sampling.top_k = -2;
  expect_bad(q, "batch[0].sampling.top_k");
  q = test_util::PrefillChain({1, 2}, 0);
  q.top_logprobs = 21;
  expect_bad(q, "batch[0].top_logprobs");
  q = test_util::PrefillChain({1, 2}, 0);
  q.hidden_layers = {0, 2};
  expect_bad(q, "batch[0].hidden_layers[1]");
  q.hidden_layers = {1, 1};
  expect_bad(q, "batch[0].hidden_layers[1]");
}

// ---- the reference sampler alone -----------------------------------------------------------

TEST(SamplingReference, TopKKeepsTiesAndTopPTheSmallestPrefix) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f, 0.0f, 2.0f};
  kernels::SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  std::vector<uint8_t> keep;
  kernels::ref::SamplingKeptSet(logits.data(), 6, p, &keep);
  EXPECT_EQ(keep, (std::vector<uint8_t>{0, 1, 0, 1, 0, 0}));
  p.top_k = 3;  // the 3rd largest is 2.0: both 2.0s are kept
  kernels::ref::SamplingKeptSet(logits.data(), 6, p, &keep);
  EXPECT_EQ(keep, (std::vector<uint8_t>{0, 1, 1, 1, 0, 1}));
  p.top_k = 0;
  p.top_p = 0.5f;  // the two 3.0s hold 2e^3 / (2e^3 + 2e^2 + e + 1) = 0.66 >= 0.5
  kernels::ref::SamplingKeptSet(logits.data(), 6, p, &keep);
  EXPECT_EQ(keep, (std::vector<uint8_t>{0, 1, 0, 1, 0, 0}));
  p.top_p = 0.7f;
  kernels::ref::SamplingKeptSet(logits.data(), 6, p, &keep);
  EXPECT_EQ(keep, (std::vector<uint8_t>{0, 1, 1, 1, 0, 1}));
  p.top_p = 1e-6f;  // the best group is always kept
  kernels::ref::SamplingKeptSet(logits.data(), 6, p, &keep);
  EXPECT_EQ(keep, (std::vector<uint8_t>{0, 1, 0, 1, 0, 0}));
  // Greedy: the argmax, lowest id on ties.
  p = kernels::SamplingParams{};
  EXPECT_EQ(kernels::ref::SampleToken(logits.data(), 6, p, 3), 1);
  const std::vector<double> dist = kernels::ref::SamplingDistribution(logits.data(), 6, p);
  EXPECT_EQ(dist[1], 1.0);
}

TEST(SamplingReference, NoiseIsUniformAndKeysAreOrdered) {
  double sum = 0, lo = 1, hi = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = kernels::SamplingUniform(42, i / 100, i % 100);
    sum += u;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
  EXPECT_GT(lo, 0.0);
  EXPECT_LT(hi, 1.0);
  EXPECT_NE(kernels::SamplingNoiseBits(1, 2, 3), kernels::SamplingNoiseBits(1, 3, 2));
  EXPECT_NE(kernels::SamplingNoiseBits(1, 2, 3), kernels::SamplingNoiseBits(2, 2, 3));
  const float values[] = {-INFINITY, -3.5f, -1e-30f, -0.0f, 0.0f, 1e-30f, 2.0f, INFINITY};
  for (size_t i = 0; i + 1 < std::size(values); ++i) {
    EXPECT_LT(kernels::OrderedFloatKey(values[i]), kernels::OrderedFloatKey(values[i + 1]));
    EXPECT_EQ(kernels::FloatFromOrderedKey(kernels::OrderedFloatKey(values[i])), values[i]);
  }
}

}  // namespace
}  // namespace verifyd::tp
