// The CPU engine: TP=N logits against TP=1, batch invariance, lossless speculative decoding
// (random draft trees vs plain greedy, TP 1/2/4), slot bookkeeping, input validation before
// any KV write, and rank failure / hang.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "tests/speculative_rounds_util.h"
#include "tp/cpu/cpu_engine.h"
#include "tp/presets.h"

namespace verifyd::tp {
namespace {

constexpr uint64_t kSeed = 1234;

std::unique_ptr<CpuEngine> MakeEngine(int tp, int64_t kv_slots = 4096, RankFaultHook hook = nullptr,
                                      int timeout_ms = 60000, const std::string& model = "tiny") {
  EngineOptions o;
  o.model = model;
  o.seed = kSeed;
  o.tp = tp;
  o.kv_slots = kv_slots;
  o.fault_hook = std::move(hook);
  o.comm_timeout_ms = timeout_ms;
  absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

// A fixed-capacity free list of KV slots, handed out in a shuffled order (scattered slots).
class SlotPool {
 public:
  SlotPool(int64_t capacity, uint32_t seed) {
    for (int64_t i = 0; i < capacity; ++i) free_.push_back(static_cast<int32_t>(i));
    std::mt19937 rng(seed);
    std::shuffle(free_.begin(), free_.end(), rng);
    capacity_ = capacity;
  }
  int32_t Take() {
    EXPECT_FALSE(free_.empty());
    int32_t s = free_.back();
    free_.pop_back();
    EXPECT_TRUE(used_.insert(s).second) << "slot " << s << " handed out twice";
    return s;
  }
  void Free(int32_t s) {
    EXPECT_EQ(used_.erase(s), 1u) << "slot " << s << " freed but not in use";
    free_.push_back(s);
  }
  int64_t free_count() const { return static_cast<int64_t>(free_.size()); }
  int64_t capacity() const { return capacity_; }

 private:
  std::vector<int32_t> free_;
  std::set<int32_t> used_;
  int64_t capacity_ = 0;
};

struct Session {
  std::vector<int32_t> committed;  // context slots
  int32_t pending = -1;            // emitted token whose KV is not computed yet
  std::vector<int32_t> collected;  // next_token, then accepted + bonus per round
};

std::vector<int32_t> RandomPrompt(std::mt19937& rng, int len) {
  std::vector<int32_t> p(len);
  for (int32_t& t : p) t = static_cast<int32_t>(rng() % 512);
  return p;
}

// Prefill (a chain, accept = false) of several sessions in one step.
void Prefill(CpuEngine& e, SlotPool& pool, const std::vector<std::vector<int32_t>>& prompts,
             std::vector<Session>* sessions) {
  std::vector<StepRequest> batch;
  for (const auto& p : prompts) {
    StepRequest q;
    q.tokens = p;
    for (size_t t = 0; t < p.size(); ++t) {
      q.parents.push_back(static_cast<int32_t>(t) - 1);
      q.tail_slots.push_back(pool.Take());
    }
    q.accept = false;
    batch.push_back(q);
  }
  absl::StatusOr<std::vector<StepResult>> res = e.Step(batch);
  ASSERT_TRUE(res.ok()) << res.status();
  sessions->clear();
  for (size_t b = 0; b < batch.size(); ++b) {
    Session s;
    s.committed = batch[b].tail_slots;
    EXPECT_EQ((*res)[b].kept_slots, batch[b].tail_slots);
    EXPECT_EQ((*res)[b].predictions.size(), prompts[b].size());
    s.pending = (*res)[b].bonus;
    EXPECT_EQ(s.pending, (*res)[b].predictions.back());
    s.collected.push_back(s.pending);
    sessions->push_back(s);
  }
}

// Plain greedy decoding: one row (the pending token) per step, one session at a time.
std::vector<int32_t> PlainGreedy(CpuEngine& e, SlotPool& pool, const std::vector<int32_t>& prompt,
                                 int n_tokens) {
  std::vector<Session> ss;
  Prefill(e, pool, {prompt}, &ss);
  Session& s = ss[0];
  while (static_cast<int>(s.collected.size()) < n_tokens) {
    StepRequest q;
    q.context_slots = s.committed;
    q.tokens = {s.pending};
    q.parents = {-1};
    q.tail_slots = {pool.Take()};
    absl::StatusOr<std::vector<StepResult>> r = e.Step({q});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) break;
    EXPECT_TRUE((*r)[0].accepted_rows.empty());
    EXPECT_EQ((*r)[0].kept_slots, q.tail_slots);
    EXPECT_TRUE((*r)[0].freed_slots.empty());
    s.committed.push_back(q.tail_slots[0]);
    s.pending = (*r)[0].bonus;
    s.collected.push_back(s.pending);
  }
  for (int32_t slot : s.committed) pool.Free(slot);
  return s.collected;
}

// ---- TP = N vs TP = 1 ------------------------------------------------------------------------

// Runs a prefill step and a tree step with the same slots on an engine; returns both steps'
// logits and predictions.
struct TwoSteps {
  std::vector<float> logits1, logits2;
  std::vector<int32_t> preds1, preds2;
};

TwoSteps RunTwoSteps(CpuEngine& e, uint32_t seed) {
  std::mt19937 rng(seed);
  SlotPool pool(e.kv_slots(), seed);
  std::vector<StepRequest> prefill, tree;
  for (int b = 0; b < 3; ++b) {
    StepRequest q;
    const int n = 5 + static_cast<int>(rng() % 20);
    q.tokens = RandomPrompt(rng, n);
    for (int t = 0; t < n; ++t) {
      q.parents.push_back(t - 1);
      q.tail_slots.push_back(pool.Take());
    }
    q.accept = false;
    prefill.push_back(q);
    StepRequest v;
    v.context_slots = q.tail_slots;
    const int m = 1 + static_cast<int>(rng() % 16);
    v.tokens = RandomPrompt(rng, m);
    for (int t = 0; t < m; ++t) {
      v.parents.push_back(t == 0 ? -1 : static_cast<int32_t>(rng() % t));
      v.tail_slots.push_back(pool.Take());
    }
    tree.push_back(v);
  }
  TwoSteps out;
  auto r1 = e.StepWithLogits(prefill, &out.logits1);
  EXPECT_TRUE(r1.ok()) << r1.status();
  auto r2 = e.StepWithLogits(tree, &out.logits2);
  EXPECT_TRUE(r2.ok()) << r2.status();
  if (r1.ok())
    for (const auto& r : *r1)
      out.preds1.insert(out.preds1.end(), r.predictions.begin(), r.predictions.end());
  if (r2.ok())
    for (const auto& r : *r2)
      out.preds2.insert(out.preds2.end(), r.predictions.begin(), r.predictions.end());
  return out;
}

// TP = N against TP = 1 on `model`: logits within rel_tol of the logit scale, same predictions.
void RunTpLogitsMatch(const std::string& model, double rel_tol, std::vector<int> tps) {
  auto e1 = MakeEngine(1, 512, nullptr, 60000, model);
  const TwoSteps base = RunTwoSteps(*e1, 77);
  ASSERT_FALSE(base.logits1.empty());
  const int64_t V = e1->config().vocab_size;
  // The predictions are the argmax of the logits (lowest index on ties).
  double min_gap = 1e30;  // top-1 minus top-2 logit: how far from an argmax tie
  for (size_t r = 0; r < base.preds2.size(); ++r) {
    const float* row = base.logits2.data() + r * V;
    EXPECT_EQ(base.preds2[r], std::max_element(row, row + V) - row);
    std::vector<float> sorted(row, row + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    min_gap = std::min(min_gap, double{sorted[0] - sorted[1]});
  }
  std::printf("tp=1: smallest top-2 logit gap over %zu rows = %.3g\n", base.preds2.size(), min_gap);
  for (int tp : tps) {
    auto e = MakeEngine(tp, 512, nullptr, 60000, model);
    const TwoSteps got = RunTwoSteps(*e, 77);
    for (int step = 0; step < 2; ++step) {
      const auto& a = step == 0 ? base.logits1 : base.logits2;
      const auto& b = step == 0 ? got.logits1 : got.logits2;
      ASSERT_EQ(a.size(), b.size());
      double max_abs = 0, max_diff = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_TRUE(std::isfinite(b[i]));
        max_abs = std::max(max_abs, double{std::fabs(a[i])});
        max_diff = std::max(max_diff, double{std::fabs(a[i] - b[i])});
      }
      // Tolerance: rel_tol of the logit scale (only the float summation order differs: the
      // row-parallel o_proj / down sums and the in-rank-order all-reduce).
      EXPECT_LE(max_diff, rel_tol * std::max(1.0, max_abs))
          << model << " tp " << tp << " step " << step;
      ::testing::Test::RecordProperty(
          model + "_tp" + std::to_string(tp) + "_step" + std::to_string(step) + "_max_diff",
          std::to_string(max_diff));
      std::printf("tp=%d step %d: max |logit diff| vs tp=1 = %.3g (max |logit| %.3g)\n", tp, step,
                  max_diff, max_abs);
    }
    EXPECT_EQ(got.preds1, base.preds1) << "tp " << tp;
    EXPECT_EQ(got.preds2, base.preds2) << "tp " << tp;
  }
}

TEST(CpuEngine, TensorParallelLogitsMatchTp1) { RunTpLogitsMatch("tiny", 1e-4, {2, 4, 8}); }
// MoE + YaRN: experts split over ranks by intermediate rows, one all-reduce per MoE layer.
TEST(CpuEngine, MoeTensorParallelLogitsMatchTp1) { RunTpLogitsMatch("tiny-moe", 1e-5, {2, 4}); }

// A tree's logits and KV rows are the same alone and inside a batch.
void RunBatchInvariant(const std::string& model) {
  auto e = MakeEngine(2, 1024, nullptr, 60000, model);
  std::mt19937 rng(3);
  SlotPool pool(e->kv_slots(), 3);
  std::vector<Session> ss;
  std::vector<std::vector<int32_t>> prompts = {RandomPrompt(rng, 9), RandomPrompt(rng, 30),
                                               RandomPrompt(rng, 4)};
  Prefill(*e, pool, prompts, &ss);
  auto tree_for = [&](const Session& s, uint32_t seed) {
    std::mt19937 r2(seed);
    StepRequest q;
    q.context_slots = s.committed;
    q.tokens = {s.pending};
    q.parents = {-1};
    for (int t = 1; t < 10; ++t) {
      q.tokens.push_back(static_cast<int32_t>(r2() % 512));
      q.parents.push_back(static_cast<int32_t>(r2() % t));
    }
    for (int t = 0; t < 10; ++t) q.tail_slots.push_back(pool.Take());
    return q;
  };
  std::vector<float> alone, mixed;
  StepRequest a1 = tree_for(ss[0], 100);
  ASSERT_TRUE(e->StepWithLogits({a1}, &alone).ok());
  StepRequest a2 = tree_for(ss[0], 100);  // same tree, fresh tail slots
  std::vector<StepRequest> batch = {tree_for(ss[1], 5), a2, tree_for(ss[2], 6)};
  StepTiming timing;
  auto r = e->StepWithLogits(batch, &mixed, &timing);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(timing.per_rank_s.size(), 2u);
  EXPECT_GT(timing.total_s, 0.0);
  for (double s : timing.per_rank_s) EXPECT_LE(s, timing.total_s);
  const int64_t V = e->config().vocab_size;
  const size_t off = batch[0].tokens.size() * V;
  ASSERT_GE(mixed.size(), off + alone.size());
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_EQ(alone[i], mixed[off + i]) << "logit " << i << " depends on the batch";
  }
  // The KV rows written for the same tree are identical too (position = committed + depth).
  for (size_t t = 0; t < a1.tail_slots.size(); ++t) {
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(e->LatentRow(rank, 1, a1.tail_slots[t]), e->LatentRow(rank, 1, a2.tail_slots[t]));
    }
  }
}

TEST(CpuEngine, BatchInvariantRows) { RunBatchInvariant("tiny"); }
// MoE rows: each expert gathers its rows, so batch composition changes the expert GEMMs' row
// sets but never a row's arithmetic.
TEST(CpuEngine, MoeBatchInvariantRows) { RunBatchInvariant("tiny-moe"); }

// ---- Lossless speculative decoding ---------------------------------------------------------

void RunLossless(int tp, const std::string& model = "tiny") {
  constexpr int kTokens = 40;
  constexpr int kSessions = 3;
  auto e = MakeEngine(tp, 2048, nullptr, 60000, model);
  ASSERT_NE(e, nullptr);
  std::mt19937 rng(1000 + tp);
  SlotPool pool(e->kv_slots(), 1000 + tp);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> refs;
  for (int s = 0; s < kSessions; ++s) {
    prompts.push_back(RandomPrompt(rng, 3 + static_cast<int>(rng() % 20)));
    refs.push_back(PlainGreedy(*e, pool, prompts.back(), kTokens + 24));
    std::set<int32_t> distinct(refs.back().begin(), refs.back().end());
    EXPECT_GE(distinct.size(), 3u) << "greedy output is (nearly) constant";
  }
  ASSERT_EQ(pool.free_count(), pool.capacity());
  std::vector<Session> ss;
  Prefill(*e, pool, prompts, &ss);
  int64_t total_accepted = 0, rounds = 0;
  auto draft = [&](int s, StepRequest* q) {
    q->context_slots = ss[s].committed;
    q->tokens = {ss[s].pending};
    q->parents = {-1};
    const int nodes = static_cast<int>(rng() % 13);  // 0 = plain decode step
    // refs[s][collected.size()] is the true next token after pending.
    test_util::AddDraftRows(
        rng, refs[s], ss[s].collected.size(), /*root_on_truth=*/true, nodes, 512,
        [&] { return rng() % 2 == 0; }, q);
    for (size_t t = 0; t < q->tokens.size(); ++t) q->tail_slots.push_back(pool.Take());
  };
  auto apply = [&](int s, const StepRequest& q, const StepResult& res) {
    // kept = root + accepted rows' slots (path order); freed = the rest, ascending rows.
    std::vector<int32_t> kept = {q.tail_slots[0]};
    std::vector<bool> is_kept(q.tokens.size(), false);
    is_kept[0] = true;
    int prev = 0;
    for (int32_t row : res.accepted_rows) {
      ASSERT_GE(row, 1);
      ASSERT_LT(row, static_cast<int32_t>(q.tokens.size()));
      EXPECT_EQ(q.parents[row], prev) << "accepted rows must form a path";
      prev = row;
      kept.push_back(q.tail_slots[row]);
      is_kept[row] = true;
      ss[s].collected.push_back(q.tokens[row]);
    }
    std::vector<int32_t> freed;
    for (size_t t = 0; t < q.tokens.size(); ++t)
      if (!is_kept[t]) freed.push_back(q.tail_slots[t]);
    EXPECT_EQ(res.kept_slots, kept);
    EXPECT_EQ(res.freed_slots, freed);
    for (int32_t slot : res.freed_slots) pool.Free(slot);
    ss[s].committed.insert(ss[s].committed.end(), res.kept_slots.begin(), res.kept_slots.end());
    ss[s].pending = res.bonus;
    ss[s].collected.push_back(res.bonus);
    total_accepted += static_cast<int64_t>(res.accepted_rows.size());
  };
  auto done = [&] {
    for (const Session& se : ss)
      if (static_cast<int>(se.collected.size()) < kTokens) return false;
    return true;
  };
  ASSERT_NO_FATAL_FAILURE(
      test_util::RunSpeculativeRounds(*e, kSessions, draft, apply, done, &rounds));
  for (int s = 0; s < kSessions; ++s) {
    const auto& got = ss[s].collected;
    ASSERT_GE(got.size(), static_cast<size_t>(kTokens));
    ASSERT_LE(got.size(), refs[s].size());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), refs[s].begin()))
        << "tp " << tp << " session " << s << ": speculative output differs from plain greedy";
    for (int32_t slot : ss[s].committed) pool.Free(slot);
  }
  // Drafts containing the truth were accepted (the test exercises acceptance).
  EXPECT_GT(total_accepted, rounds / 2) << "tp " << tp;
  std::printf("tp=%d: %lld rounds, %lld draft tokens accepted (%.2f per session-round)\n", tp,
              static_cast<long long>(rounds), static_cast<long long>(total_accepted),
              static_cast<double>(total_accepted) / (rounds * kSessions));
  // Every slot is back in the pool.
  EXPECT_EQ(pool.free_count(), pool.capacity());
}

TEST(CpuEngine, LosslessSpeculativeTp1) { RunLossless(1); }
TEST(CpuEngine, LosslessSpeculativeTp2) { RunLossless(2); }
TEST(CpuEngine, LosslessSpeculativeTp4) { RunLossless(4); }
TEST(CpuEngine, MoeLosslessSpeculativeTp1) { RunLossless(1, "tiny-moe"); }
TEST(CpuEngine, MoeLosslessSpeculativeTp2) { RunLossless(2, "tiny-moe"); }

void RunGreedySame(const std::string& model) {
  std::mt19937 rng(8);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 12);
  std::vector<int32_t> base;
  for (int tp : {1, 2, 4}) {
    auto e = MakeEngine(tp, 256, nullptr, 60000, model);
    SlotPool pool(e->kv_slots(), 8);
    std::vector<int32_t> g = PlainGreedy(*e, pool, prompt, 32);
    if (tp == 1) {
      base = g;
    } else {
      EXPECT_EQ(g, base) << model << " tp " << tp;
    }
  }
}

TEST(CpuEngine, GreedyIsTheSameAtEveryTp) { RunGreedySame("tiny"); }
TEST(CpuEngine, MoeGreedyIsTheSameAtEveryTp) { RunGreedySame("tiny-moe"); }

// ---- Validation ------------------------------------------------------------------------------

TEST(CpuEngine, InvalidInputNamesTheFieldAndWritesNothing) {
  EngineOptions o;
  o.model = "tiny";
  o.seed = kSeed;
  o.tp = 2;
  o.kv_slots = 128;
  o.limits.max_batch = 4;
  o.limits.max_tail_rows = 8;
  o.limits.max_context = 40;
  auto created = CpuEngine::Create(o);
  ASSERT_TRUE(created.ok()) << created.status();
  CpuEngine& e = **created;
  EXPECT_EQ(e.limits().max_context, 40);
  EXPECT_EQ(e.limits().max_batch, 4);
  // A committed context in slots 0..7.
  StepRequest pre;
  for (int t = 0; t < 8; ++t) {
    pre.tokens.push_back(t * 3);
    pre.parents.push_back(t - 1);
    pre.tail_slots.push_back(t);
  }
  pre.accept = false;
  ASSERT_TRUE(e.Step({pre}).ok());
  const std::vector<float> ctx_row = e.LatentRow(1, 0, 4);
  StepRequest good;
  good.context_slots = pre.tail_slots;
  good.tokens = {5, 6};
  good.parents = {-1, 0};
  good.tail_slots = {20, 21};

  struct Case {
    std::string field;
    std::function<void(StepRequest&)> mutate;
  };
  std::vector<Case> cases = {
      {"batch[1].tokens is empty",
       [](StepRequest& q) {
         q.tokens.clear();
         q.parents.clear();
         q.tail_slots.clear();
       }},
      {"batch[1].tokens[1]", [](StepRequest& q) { q.tokens[1] = 512; }},
      {"batch[1].tokens[0]", [](StepRequest& q) { q.tokens[0] = -1; }},
      {"batch[1].parents[0]", [](StepRequest& q) { q.parents[0] = 0; }},
      {"batch[1].parents[1]", [](StepRequest& q) { q.parents[1] = 1; }},
      {"batch[1].parents has", [](StepRequest& q) { q.parents.push_back(0); }},
      {"batch[1].tail_slots has", [](StepRequest& q) { q.tail_slots.pop_back(); }},
      {"batch[1].tail_slots[1]", [](StepRequest& q) { q.tail_slots[1] = 128; }},
      {"batch[1].tail_slots[0]", [](StepRequest& q) { q.tail_slots[0] = 3; }},   // a context slot
      {"batch[1].tail_slots[1]", [](StepRequest& q) { q.tail_slots[1] = 20; }},  // used twice
      {"batch[1].context_slots[2]", [](StepRequest& q) { q.context_slots[2] = -5; }},
      {"batch[1].tokens: 9 rows",
       [](StepRequest& q) {
         for (int t = 2; t < 9; ++t) {
           q.tokens.push_back(1);
           q.parents.push_back(t - 1);
           q.tail_slots.push_back(40 + t);
         }
       }},
      {"max_context",
       [](StepRequest& q) {
         for (int i = 0; i < 31; ++i) q.context_slots.push_back(60 + i);
       }},
  };
  for (const Case& c : cases) {
    StepRequest bad = good;
    bad.tail_slots = {30, 31};
    c.mutate(bad);
    absl::StatusOr<std::vector<StepResult>> r = e.Step({good, bad});
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(r.status().message().find(c.field), std::string::npos)
        << "want '" << c.field << "' in: " << r.status().message();
    // Nothing written: the good request's tail slots still hold the NaN poison, the
    // context is unchanged.
    for (int rank = 0; rank < 2; ++rank) {
      for (int32_t s : {20, 21, 30, 31}) {
        for (float x : e.LatentRow(rank, 0, s)) ASSERT_TRUE(std::isnan(x)) << c.field;
      }
    }
    EXPECT_EQ(e.LatentRow(1, 0, 4), ctx_row);
  }
  std::vector<StepRequest> too_many(5, good);
  EXPECT_EQ(e.Step(too_many).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(e.failed());
  // The engine still serves.
  auto ok = e.Step({good});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)[0].kept_slots.size() + (*ok)[0].freed_slots.size(), 2u);
  // Empty batch: nothing to do.
  auto empty = e.Step({});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(CpuEngine, BadOptions) {
  EngineOptions o;
  o.tp = 3;  // 8 heads
  EXPECT_EQ(CpuEngine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.tp = 1;
  o.limits.max_tail_rows = 1000;
  EXPECT_EQ(CpuEngine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.limits.max_tail_rows = 65;
  o.kv_slots = 0;
  EXPECT_EQ(CpuEngine::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.kv_slots = 16;
  absl::StatusOr<std::unique_ptr<Engine>> e = CreateCpuEngine(o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->backend(), "cpu");
  EXPECT_EQ((*e)->tp_size(), 1);
  EXPECT_EQ((*e)->kv_slots(), 16);
  EXPECT_EQ((*e)->limits().max_context, (*e)->config().max_position_embeddings);
}

// ---- Failures --------------------------------------------------------------------------------

StepRequest OneRow(int32_t slot) {
  StepRequest q;
  q.tokens = {7};
  q.parents = {-1};
  q.tail_slots = {slot};
  return q;
}

TEST(CpuEngine, FailedRankMakesEngineUnavailable) {
  FaultInjector inj;
  auto e = MakeEngine(2, 64, inj.Hook(), 5000);
  ASSERT_TRUE(e->Step({OneRow(0)}).ok());
  inj.FailRankOnNextStep(1);
  absl::StatusOr<std::vector<StepResult>> r = e->Step({OneRow(1)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("rank 1"), std::string::npos) << r.status();
  EXPECT_TRUE(e->failed());
  EXPECT_EQ(e->Step({OneRow(2)}).status().code(), absl::StatusCode::kUnavailable);
}

TEST(CpuEngine, HungRankTimesOut) {
  FaultInjector inj;
  auto e = MakeEngine(4, 64, inj.Hook(), 200);
  ASSERT_TRUE(e->Step({OneRow(0)}).ok());
  inj.HangRankOnNextStep(2);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<StepResult>> r = e->Step({OneRow(1)});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_LT(secs, 5.0);
  EXPECT_TRUE(e->failed());
  inj.Release();
  EXPECT_EQ(e->Step({OneRow(2)}).status().code(), absl::StatusCode::kUnavailable);
}

TEST(CpuEngine, StepTimeoutCatchesHangAtTp1) {
  FaultInjector inj;
  EngineOptions o;
  o.kv_slots = 16;
  o.cpu.step_timeout_ms = 200;
  o.comm_timeout_ms = 200;
  o.fault_hook = inj.Hook();
  auto e = CpuEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  inj.HangRankOnNextStep(0);
  absl::StatusOr<std::vector<StepResult>> r = (*e)->Step({OneRow(1)});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("rank 0 did not finish"), std::string::npos) << r.status();
  EXPECT_TRUE((*e)->failed());
  inj.Release();
}

// A plain q_proj (q_lora_rank = 0) and tied embeddings: TP=2 equals TP=1 and a checkpoint
// round trip keeps the logits.
TEST(CpuEngine, PlainQProjAndTiedEmbeddings) {
  ModelConfig c = *PresetConfig("tiny");
  c.q_lora_rank = 0;
  c.tie_word_embeddings = true;
  c.vocab_size = 301;  // uneven vocab shards
  auto w = std::make_shared<const ModelWeights>(*GenerateRandomWeights(c, 5));
  ASSERT_EQ(w->Find("lm_head.weight"), nullptr);
  ASSERT_NE(w->Find("model.layers.0.self_attn.q_proj.weight"), nullptr);
  std::vector<std::vector<float>> logits;
  for (int tp : {1, 2, 4}) {
    EngineOptions o;
    o.weights = w;
    o.tp = tp;
    o.kv_slots = 64;
    auto e = CpuEngine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status();
    StepRequest q;
    q.tokens = {3, 1, 4, 1, 5, 9, 2, 6};
    q.parents = {-1, 0, 1, 1, 3, 0, 5, 6};
    q.tail_slots = {10, 11, 12, 13, 14, 15, 16, 17};
    std::vector<float> l;
    auto r = (*e)->StepWithLogits({q}, &l);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(l.size(), 8u * 301u);
    logits.push_back(l);
  }
  for (size_t k = 1; k < logits.size(); ++k) {
    double max_abs = 0, max_diff = 0;
    for (size_t i = 0; i < logits[0].size(); ++i) {
      max_abs = std::max(max_abs, double{std::fabs(logits[0][i])});
      max_diff = std::max(max_diff, double{std::fabs(logits[0][i] - logits[k][i])});
    }
    EXPECT_LE(max_diff, 1e-4 * std::max(1.0, max_abs));
  }
}

}  // namespace
}  // namespace verifyd::tp
