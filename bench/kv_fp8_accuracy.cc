// What the FP8 latent KV cache (kernels/kv_fp8.h, --kv_dtype=fp8) costs in accuracy, on the
// CPU (float32 everywhere else), at Kimi-K2's attention dimensions (kv_lora 512, rope 64):
//
//   attention  the verify attention of decode rows over random latent caches, float32 keys
//              against the same keys rounded through the format, for two scale layouts: one
//              scale per 128 columns of c_kv (the format) and one scale per token. Two kinds
//              of cache: i.i.d. channels, and channels with log-normal gains (outlier
//              channels, as real KV caches have). Reported: rel-L2 of each (row, head)'s output
//              and |LSE| error, mean and max.
//   engine     the CPU engine on a model with Kimi-K2's attention (64 heads, q_lora 1536,
//              kv_lora 512, rope 64, YaRN as kimi-k2-attn) and a smaller hidden size / MLP so
//              that the CPU runs it, random weights: a random prompt, then greedy decoding
//              driven by the float32-KV engine's tokens, both engines in lockstep. Reported:
//              positions whose greedy token differs, those not at a near-tie (top-2 gap of the
//              float32 engine above twice the position's max |logit diff|), and logit errors.
//
// A benchmark prints a table and writes JSON (--json); it asserts nothing.
//   kv_fp8_accuracy [--contexts=1024,8192] [--prompt=512] [--decode=96] [--layers=4]
//                   [--seeds=1,2,3] [--json=FILE]
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "kernels/kv_fp8.h"
#include "kernels/verify_attention.h"
#include "nlohmann/json.hpp"
#include "tp/cpu/cpu_engine.h"
#include "tp/engine_options.h"
#include "tp/presets.h"

ABSL_FLAG(std::string, contexts, "1024,8192", "attention: context lengths");
ABSL_FLAG(int, prompt, 512, "engine: prompt tokens");
ABSL_FLAG(int, decode, 96, "engine: decoded positions compared");
ABSL_FLAG(int, layers, 4, "engine: decoder layers");
ABSL_FLAG(std::string, seeds, "1,2,3", "engine: weight / prompt seeds");
ABSL_FLAG(std::string, json, "", "write the results as JSON here");

namespace {

using namespace verifyd;

std::vector<int64_t> Ints(const std::string& s) {
  return bench::ParseIntList(s, bench::ListEntries::kParsed);
}

struct Stats {
  double mean = 0, max = 0;
  int64_t n = 0;
  void Add(double x) {
    mean += x;
    max = std::max(max, x);
    ++n;
  }
  double Mean() const { return n ? mean / n : 0; }
};

// One scale per `group` columns of c_kv (group = kv_lora: one per token), k_pe in bf16.
void RoundCache(std::vector<float>& kv, int64_t rows, int64_t kvl, int64_t rope, int64_t group) {
  for (int64_t r = 0; r < rows; ++r) {
    kernels::KvFp8RoundTrip(kv.data() + r * (kvl + rope), kvl, rope, group);
  }
}

nlohmann::json AttentionStudy(int64_t ctx, bool outliers, std::mt19937& rng) {
  constexpr int64_t kvl = 512, rope = 64, lat = kvl + rope, heads = 16, rows = 8;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> gain(lat, 1.f);
  if (outliers) {
    std::lognormal_distribution<float> ln(0.f, 1.f);
    for (int64_t c = 0; c < kvl; ++c) gain[c] = ln(rng);
  }
  const int64_t slots = rows * ctx;
  std::vector<float> kv(slots * lat), q(rows * heads * lat);
  for (int64_t s = 0; s < slots; ++s) {
    for (int64_t c = 0; c < lat; ++c) kv[s * lat + c] = nd(rng) * gain[c];
  }
  for (auto& x : q) x = nd(rng);
  std::vector<int32_t> qi(rows + 1), ki(rows + 1), idx(slots);
  for (int64_t b = 0; b <= rows; ++b) {
    qi[b] = static_cast<int32_t>(b);
    ki[b] = static_cast<int32_t>(b * ctx);
  }
  for (int64_t s = 0; s < slots; ++s) idx[s] = static_cast<int32_t>(s);
  std::vector<uint64_t> mask(rows * 2, 0);
  for (int64_t r = 0; r < rows; ++r) mask[r * 2] = 1;  // each row sees itself (its last slot)
  auto run = [&](const std::vector<float>& cache, std::vector<float>* out,
                 std::vector<float>* lse) {
    out->assign(rows * heads * kvl, 0.f);
    lse->assign(rows * heads, 0.f);
    kernels::VerifyAttentionParams p;
    p.batch = static_cast<int>(rows);
    p.total_rows = static_cast<int>(rows);
    p.num_heads = static_cast<int>(heads);
    p.qk_dim = static_cast<int>(lat);
    p.v_dim = static_cast<int>(kvl);
    p.softmax_scale = 1.0f / std::sqrt(192.0f);
    p.dtype = kernels::DType::kFloat32;
    p.q = q.data();
    p.kv = cache.data();
    p.kv_slots = slots;
    p.q_indptr = qi.data();
    p.kv_indptr = ki.data();
    p.kv_indices = idx.data();
    p.tree_mask = mask.data();
    p.out = out->data();
    p.lse = lse->data();
    const absl::Status st = kernels::VerifyAttentionReference(p);
    if (!st.ok()) std::fprintf(stderr, "attention: %s\n", std::string(st.message()).c_str());
  };
  std::vector<float> ref_out, ref_lse;
  run(kv, &ref_out, &ref_lse);
  nlohmann::json j;
  j["context"] = ctx;
  j["channels"] = outliers ? "log-normal gains" : "iid";
  for (const int64_t group : {int64_t{128}, kvl}) {
    std::vector<float> cache = kv, out, lse;
    RoundCache(cache, slots, kvl, rope, group);
    run(cache, &out, &lse);
    Stats rel, dl;
    for (int64_t i = 0; i < rows * heads; ++i) {
      double num = 0, den = 0;
      for (int64_t c = 0; c < kvl; ++c) {
        const double d = out[i * kvl + c] - ref_out[i * kvl + c];
        num += d * d;
        den += static_cast<double>(ref_out[i * kvl + c]) * ref_out[i * kvl + c];
      }
      rel.Add(std::sqrt(num / std::max(den, 1e-300)));
      dl.Add(std::fabs(lse[i] - ref_lse[i]));
    }
    const std::string key = group == 128 ? "scale_per_128" : "scale_per_token";
    j[key] = {{"out_rel_l2_mean", rel.Mean()},
              {"out_rel_l2_max", rel.max},
              {"lse_abs_mean", dl.Mean()},
              {"lse_abs_max", dl.max}};
  }
  return j;
}

nlohmann::json EngineStudy(uint64_t seed, int prompt, int decode, int layers) {
  absl::StatusOr<tp::ModelConfig> base = tp::PresetConfig("kimi-k2-attn", layers);
  if (!base.ok()) return {{"error", std::string(base.status().message())}};
  auto cfg = std::make_shared<tp::ModelConfig>(*base);
  cfg->hidden_size = 1024;  // the attention's heads and latent dims stay Kimi-K2's
  cfg->intermediate_size = 2048;
  auto make = [&](tp::KvDtype d) {
    tp::EngineOptions o;
    o.config = cfg;
    o.seed = seed;
    o.kv_slots = prompt + decode + 8;
    o.kv_dtype = d;
    o.limits.max_tail_rows = kernels::kMaxTailRows;
    return tp::CpuEngine::Create(o);
  };
  auto f32 = make(tp::KvDtype::kAuto);
  auto fp8 = make(tp::KvDtype::kFp8);
  if (!f32.ok() || !fp8.ok()) {
    return {{"error", std::string((f32.ok() ? fp8.status() : f32.status()).message())}};
  }
  const int64_t V = cfg->vocab_size;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> tokens(prompt);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % V);
  std::vector<int32_t> committed;
  int64_t differ = 0, differ_not_tie = 0, compared = 0;
  Stats rel;
  int32_t next = -1;
  // Prefill in chunks of max_tail_rows, then one token per step (the float32 engine's).
  size_t at = 0;
  while (compared < decode) {
    tp::StepRequest q;
    q.context_slots = committed;
    const bool prefill = at < tokens.size();
    const size_t n = prefill ? std::min<size_t>(kernels::kMaxTailRows, tokens.size() - at) : 1;
    for (size_t t = 0; t < n; ++t) {
      q.tokens.push_back(prefill ? tokens[at + t] : next);
      q.parents.push_back(static_cast<int32_t>(t) - 1);
      q.tail_slots.push_back(static_cast<int32_t>(committed.size() + t));
    }
    q.accept = false;
    std::vector<float> la, lb;
    auto ra = (*f32)->StepWithLogits({q}, &la);
    auto rb = (*fp8)->StepWithLogits({q}, &lb);
    if (!ra.ok() || !rb.ok()) return {{"error", "step failed"}};
    committed.insert(committed.end(), q.tail_slots.begin(), q.tail_slots.end());
    at += n;
    const int32_t a = (*ra)[0].predictions.back(), b = (*rb)[0].predictions.back();
    next = a;
    if (at < tokens.size()) continue;  // compare decode positions (and the prompt's last)
    const float* x = la.data() + (n - 1) * V;
    const float* y = lb.data() + (n - 1) * V;
    double num = 0, den = 0, maxd = 0, top1 = -INFINITY, top2 = -INFINITY;
    for (int64_t i = 0; i < V; ++i) {
      const double d = static_cast<double>(y[i]) - x[i];
      num += d * d;
      den += static_cast<double>(x[i]) * x[i];
      maxd = std::max(maxd, std::fabs(d));
      if (x[i] > top1) {
        top2 = top1;
        top1 = x[i];
      } else if (x[i] > top2) {
        top2 = x[i];
      }
    }
    rel.Add(std::sqrt(num / std::max(den, 1e-300)));
    ++compared;
    if (a != b) {
      ++differ;
      if (top1 - top2 >= 2 * maxd) ++differ_not_tie;
    }
  }
  return {{"seed", seed},
          {"layers", layers},
          {"prompt", prompt},
          {"positions", compared},
          {"greedy_differ", differ},
          {"greedy_differ_not_near_tie", differ_not_tie},
          {"logit_rel_l2_mean", rel.Mean()},
          {"logit_rel_l2_max", rel.max}};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  nlohmann::json out;
  out["bench"] = "kv_fp8_accuracy";
  out["format"] = "e4m3 c_kv, float32 scale per 128 columns, bf16 k_pe (kernels/kv_fp8.h)";
  std::mt19937 rng(12345);
  std::printf("attention (16 heads, kv_lora 512 + rope 64, 8 decode rows; float32 reference)\n");
  std::printf("| context | channels | scales | out rel-L2 mean | max | LSE abs mean | max |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const int64_t ctx : Ints(absl::GetFlag(FLAGS_contexts))) {
    for (const bool outliers : {false, true}) {
      nlohmann::json j = AttentionStudy(ctx, outliers, rng);
      for (const char* k : {"scale_per_128", "scale_per_token"}) {
        std::printf("| %lld | %s | %s | %.2e | %.2e | %.2e | %.2e |\n", static_cast<long long>(ctx),
                    j["channels"].get<std::string>().c_str(), k,
                    j[k]["out_rel_l2_mean"].get<double>(), j[k]["out_rel_l2_max"].get<double>(),
                    j[k]["lse_abs_mean"].get<double>(), j[k]["lse_abs_max"].get<double>());
      }
      out["attention"].push_back(j);
    }
  }
  std::printf(
      "\nengine (CPU; Kimi-K2 attention, hidden 1024, random weights; greedy driven by "
      "the float32-KV engine)\n");
  std::printf("| seed | positions | greedy differ | not near-ties | logit rel-L2 mean | max |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const int64_t seed : Ints(absl::GetFlag(FLAGS_seeds))) {
    nlohmann::json j = EngineStudy(static_cast<uint64_t>(seed), absl::GetFlag(FLAGS_prompt),
                                   absl::GetFlag(FLAGS_decode), absl::GetFlag(FLAGS_layers));
    if (j.contains("error")) {
      std::fprintf(stderr, "engine seed %lld: %s\n", static_cast<long long>(seed),
                   j["error"].get<std::string>().c_str());
      return 1;
    }
    std::printf("| %lld | %lld | %lld | %lld | %.2e | %.2e |\n", static_cast<long long>(seed),
                static_cast<long long>(j["positions"].get<int64_t>()),
                static_cast<long long>(j["greedy_differ"].get<int64_t>()),
                static_cast<long long>(j["greedy_differ_not_near_tie"].get<int64_t>()),
                j["logit_rel_l2_mean"].get<double>(), j["logit_rel_l2_max"].get<double>());
    out["engine"].push_back(j);
  }
  const std::string path = absl::GetFlag(FLAGS_json);
  if (!path.empty()) std::ofstream(path) << out.dump(2) << "\n";
  return 0;
}
