// batch_variance: how much one request's logits on the CUDA engine depend on what else shares
// its step (the property a batch-invariant engine must make exact). A probe request (a
// committed context and a draft tree) is run alone, then
//   - inside batches of 1 .. 31 other random requests (random contexts, random trees),
//   - with its own tree grown (the probe's first rows are the same; more nodes after them),
// and its rows' logits are compared with the alone run: rows with any bit different, the
// largest |diff| / max |logit|, and greedy tokens that changed. Contexts come from a KV pool
// filled with random values (no prefill). Prints a table and writes JSON (--json); a
// measurement, not a test: it never fails on a difference.
//   batch_variance --layers=8 --contexts=4096,65536 --json=/tmp/batch_variance.json
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "nlohmann/json.hpp"
#include "tp/cuda/cuda_engine.h"

ABSL_FLAG(std::string, model, "kimi-k2-attn", "preset name or checkpoint directory");
ABSL_FLAG(int64_t, layers, 8, "decoder layers of a preset");
ABSL_FLAG(std::string, contexts, "4096,65536", "probe context lengths");
ABSL_FLAG(int64_t, probe_nodes, 8, "draft nodes of the probe's tree");
ABSL_FLAG(std::string, batches, "1,7,31", "other requests sharing the probe's step");
ABSL_FLAG(std::string, grown, "16,64", "the probe's tree grown to this many nodes");
ABSL_FLAG(bool, verify_kernel, true, "the optimised verify attention (false: the fallback)");
ABSL_FLAG(bool, batch_invariant, true,
          "batch-invariant engine steps (EngineOptions::cuda, the default; false: the "
          "batch-adaptive kernels)");
ABSL_FLAG(std::string, json, "", "write the results as JSON here");
ABSL_FLAG(std::string, commit, "unknown", "source revision recorded in the JSON meta");

namespace {

using verifyd::tp::CudaEngine;
using verifyd::tp::EngineOptions;
using verifyd::tp::StepRequest;

std::vector<int64_t> ParseList(const std::string& s) {
  return verifyd::bench::ParseIntList(s, verifyd::bench::ListEntries::kPositive);
}

struct Diff {
  int64_t rows = 0, rows_differ = 0, flips = 0;
  double max_rel = 0;
};

// The probe's first `rows` rows of `got` (starting at row `at`) against `want`.
Diff Compare(const std::vector<float>& want, const std::vector<int32_t>& want_pred,
             const std::vector<float>& got, const std::vector<int32_t>& got_pred, int64_t at,
             int64_t rows, int64_t V) {
  Diff d;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = want.data() + r * V;
    const float* b = got.data() + (at + r) * V;
    double mx = 0, ma = 0;
    for (int64_t v = 0; v < V; ++v) {
      mx = std::max(mx, std::fabs(double(a[v]) - b[v]));
      ma = std::max(ma, std::fabs(double(a[v])));
    }
    ++d.rows;
    d.rows_differ += std::memcmp(a, b, V * sizeof(float)) != 0;
    d.max_rel = std::max(d.max_rel, ma > 0 ? mx / ma : mx);
    d.flips += want_pred[r] != got_pred[at + r];
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<int64_t> contexts = ParseList(absl::GetFlag(FLAGS_contexts));
  const std::vector<int64_t> batches = ParseList(absl::GetFlag(FLAGS_batches));
  const std::vector<int64_t> grown = ParseList(absl::GetFlag(FLAGS_grown));
  const int64_t probe_nodes = absl::GetFlag(FLAGS_probe_nodes);
  if (contexts.empty() || batches.empty()) return 2;
  const int64_t max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int64_t max_others = *std::max_element(batches.begin(), batches.end());
  int64_t max_nodes = probe_nodes;
  for (int64_t g : grown) max_nodes = std::max(max_nodes, g);
  EngineOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.preset_layers = absl::GetFlag(FLAGS_layers);
  o.limits.max_batch = static_cast<int>(max_others + 1);
  o.limits.max_tail_rows = static_cast<int>(max_nodes + 1);
  o.kv_slots = max_ctx + (max_others + 1) * (max_nodes + 1) + 64;
  o.cuda.use_verify_kernel = absl::GetFlag(FLAGS_verify_kernel);
  o.cuda.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  auto created = CudaEngine::Create(o);
  if (!created.ok()) {
    std::fprintf(stderr, "batch_variance: %s\n", created.status().ToString().c_str());
    return 1;
  }
  CudaEngine& e = **created;
  if (!e.FillLatentCacheRandom(7).ok()) return 1;
  const int64_t V = e.config().vocab_size;
  std::mt19937 rng(11);
  auto tree = [&](int64_t nodes, int64_t ctx, int64_t slot0, StepRequest* q) {
    for (int64_t t = 0; t <= nodes; ++t) {
      q->tokens.push_back(static_cast<int32_t>(rng() % V));
      q->parents.push_back(t == 0 ? -1 : static_cast<int32_t>(rng() % t));
      q->tail_slots.push_back(static_cast<int32_t>(slot0 + t));
    }
    q->context_slots.resize(ctx);
    for (int64_t i = 0; i < ctx; ++i) q->context_slots[i] = static_cast<int32_t>(i);
    q->accept = false;  // logits only; no acceptance needed
  };
  nlohmann::json rows = nlohmann::json::array();
  std::printf(
      "| context | case | probe rows | rows with bits changed | max |diff| / max |logit| | "
      "greedy changes |\n|---|---|---|---|---|---|\n");
  for (int64_t ctx : contexts) {
    StepRequest probe;
    tree(probe_nodes, ctx, max_ctx, &probe);
    std::vector<float> alone;
    auto ra = e.StepWithLogits({probe}, &alone);
    if (!ra.ok()) return 1;
    const std::vector<int32_t> alone_pred = (*ra)[0].predictions;
    const int64_t n = static_cast<int64_t>(probe.tokens.size());
    auto report = [&](const std::string& what, const Diff& d) {
      std::printf("| %lld | %s | %lld | %lld | %.3g | %lld |\n", static_cast<long long>(ctx),
                  what.c_str(), static_cast<long long>(d.rows),
                  static_cast<long long>(d.rows_differ), d.max_rel,
                  static_cast<long long>(d.flips));
      rows.push_back({{"context", ctx},
                      {"case", what},
                      {"rows", d.rows},
                      {"rows_differ", d.rows_differ},
                      {"max_rel", d.max_rel},
                      {"greedy_changes", d.flips}});
    };
    // Alone again: the engine's run-to-run determinism.
    {
      std::vector<float> again;
      auto r = e.StepWithLogits({probe}, &again);
      if (!r.ok()) return 1;
      report("alone, again", Compare(alone, alone_pred, again, (*r)[0].predictions, 0, n, V));
    }
    for (int64_t others : batches) {
      std::vector<StepRequest> batch = {probe};
      for (int64_t b = 0; b < others; ++b) {
        StepRequest q;
        const int64_t c = 1 + static_cast<int64_t>(rng() % ctx);
        tree(static_cast<int64_t>(rng() % (max_nodes + 1)), c, max_ctx + (b + 1) * (max_nodes + 1),
             &q);
        batch.push_back(q);
      }
      std::vector<float> lg;
      auto r = e.StepWithLogits(batch, &lg);
      if (!r.ok()) return 1;
      report("with " + std::to_string(others) + " other requests",
             Compare(alone, alone_pred, lg, (*r)[0].predictions, 0, n, V));
    }
    for (int64_t g : grown) {
      if (g <= probe_nodes) continue;
      StepRequest big = probe;
      for (int64_t t = probe_nodes + 1; t <= g; ++t) {
        big.tokens.push_back(static_cast<int32_t>(rng() % V));
        big.parents.push_back(static_cast<int32_t>(rng() % t));
        big.tail_slots.push_back(static_cast<int32_t>(max_ctx + t));
      }
      std::vector<float> lg;
      auto r = e.StepWithLogits({big}, &lg);
      if (!r.ok()) return 1;
      report("tree grown to " + std::to_string(g) + " nodes",
             Compare(alone, alone_pred, lg, (*r)[0].predictions, 0, n, V));
    }
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    nlohmann::json j;
    j["bench"] = "batch_variance";
    j["meta"] = {{"commit", absl::GetFlag(FLAGS_commit)},
                 {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())},
                 {"model", e.config().name},
                 {"layers", e.config().num_hidden_layers},
                 {"probe_nodes", probe_nodes},
                 {"verify_kernel", absl::GetFlag(FLAGS_verify_kernel)},
                 {"batch_invariant", absl::GetFlag(FLAGS_batch_invariant)}};
    j["results"] = rows;
    std::ofstream(absl::GetFlag(FLAGS_json)) << j.dump(1) << "\n";
  }
  return 0;
}
