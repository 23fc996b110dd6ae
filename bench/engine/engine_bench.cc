// engine_bench: the end-to-end verify step of the CUDA engine (tp/cuda/cuda_engine.h) on one GPU
// (TP = 1, or --tp ranks through the loopback communicator) with the kimi-k2-attn preset: step
// latency and tokens/s against context length, draft tree size and batch, with the GPU time split
// into attention, GEMMs, communication and the rest (CUDA events on the rank's stream), plus the
// host part (validation, plan, copies, synchronisation) as wall time minus GPU time.
//
// Set-up: every request of a batch attends to the same committed context (slots
// [0, context)), so long contexts at batch 32 need one context's worth of KV per layer; the
// attention still reads the context once per request (the kernel does not share KV between
// requests). The KV pool is filled with finite pseudo-random values instead of a prefill.
// Trees: `nodes` draft nodes under the pending token, random parents (a bushy tree).
//
// --extras also times each configuration with seeded sampling, logprobs and three hidden layers
// (what drafting frontends ask for), same process.
//
// --slice_rank=R with --tp=N runs rank R of TP N alone (EngineOptions::cuda.slice_rank: the
// presets kimi-k2 / deepseek-v3 at their real size on one GPU): its collectives are recorded,
// not run, and each row adds their modeled time on an 8-GPU NVLink host (tp/comm_model.h), the
// split of the MoE step (router, dispatch, experts), the rank's experts the step touched, and
// the floor: the bytes the step must read (touched expert weights, every other weight of the
// rank, each request's KV) over --floor_tbps. A slice's outputs are not the model's: the
// numbers are its purpose. Configurations whose KV does not fit beside the weights are listed
// as such (the memory plan, tp/memory_plan.h).
// Prints a table (last) and writes JSON (--json). Never asserts on timings.
//   engine_bench --layers=61 --contexts=4096,16384,65536,185000 --trees=1,8,16,64
//                --batches=1,8,32 --json=/tmp/engine_bench.json
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/cuda/dense/weight_gen.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/kv_fp8.h"
#include "nlohmann/json.hpp"
#include "tp/batch_plan.h"
#include "tp/comm_model.h"
#include "tp/cuda/cuda_engine.h"
#include "tp/memory_plan.h"
#include "tp/presets.h"

ABSL_FLAG(std::string, model, "kimi-k2-attn",
          "preset name, or a checkpoint directory (e.g. bench/engine/make_fp8_checkpoint.py's)");
ABSL_FLAG(bool, fp8_weights, true,
          "FP8-stored weights of a checkpoint stay FP8 (EngineOptions::cuda.fp8_experts); "
          "false: dequantized to bf16");
ABSL_FLAG(int, tp, 1,
          "tensor-parallel ranks, all on device 0 through the loopback communicator (they run "
          "one after another: the profile is rank 0's; the standalone kernel column is skipped)");
ABSL_FLAG(bool, shared_prefix, true,
          "shared-prefix verify-attention plans (EngineOptions::cuda.shared_prefix_attention): "
          "the batches here are forks of one context");
ABSL_FLAG(bool, fp8_cublaslt, true,
          "the FP8 linears (not the routed experts) through cuBLASLt (EngineOptions::cuda."
          "fp8_cublaslt); false: the grouped kernel");
ABSL_FLAG(int64_t, layers, 61, "decoder layers of the preset (Kimi-K2 has 61)");
ABSL_FLAG(std::string, kv_dtype, "auto",
          "latent KV cache: auto (bf16) or fp8 (EngineOptions::kv_dtype, kernels/kv_fp8.h)");
ABSL_FLAG(std::string, contexts, "4096,16384,65536,185000", "committed context lengths");
ABSL_FLAG(std::string, trees, "1,8,16,64", "draft nodes per tree (rows = nodes + 1)");
ABSL_FLAG(std::string, batches, "1,8,32", "requests per step");
ABSL_FLAG(int, warmup, 2, "untimed steps per configuration");
ABSL_FLAG(int, iters, 5, "timed steps per configuration (median reported)");
ABSL_FLAG(bool, verify_kernel, true, "use the optimised verify attention kernel");
ABSL_FLAG(std::string, verify_config, "auto",
          "with --batch_invariant=false: the verify attention configuration "
          "(kernels/cuda/verify_attention/config.h): " +
              verifyd::kernels::cuda::VerifyKernelConfigHelp());
ABSL_FLAG(bool, batch_invariant, true,
          "batch-invariant engine steps (EngineOptions::cuda, the default; false: the "
          "batch-adaptive kernels)");
ABSL_FLAG(int, positional_chunk_keys, 1024,
          "batch-invariant steps: positional split rule (EngineOptions::cuda)");
ABSL_FLAG(int, positional_max_splits, 32,
          "batch-invariant steps: positional split rule (EngineOptions::cuda)");
ABSL_FLAG(int64_t, positional_partial_rows, int64_t{1} << 19,
          "batch-invariant steps: partial rows of the verify attention workspace "
          "(EngineOptions::cuda)");
ABSL_FLAG(bool, shared_context, true,
          "with --batch_invariant: context splits shared by a request's nodes "
          "(EngineOptions::cuda.shared_context_attention; false: per-node plans)");
ABSL_FLAG(std::string, json, "", "write the results as JSON here");
ABSL_FLAG(uint64_t, seed, 1, "weight seed");
ABSL_FLAG(std::string, commit, "unknown", "source revision recorded in the JSON meta");
ABSL_FLAG(bool, extras, false,
          "also time every configuration with what drafters ask for: seeded sampling "
          "(temperature 0.7, top-p 0.9, top-k 50), top-5 logprobs and the hidden states of "
          "three layers (first, middle, last), same process, right after the plain steps");
ABSL_FLAG(std::string, extras_parts, "sampling,logprobs,hidden",
          "which extras --extras adds (a subset of sampling,logprobs,hidden)");
ABSL_FLAG(bool, load_only, false,
          "create the engine, report its load (seconds, bytes of the checkpoint's files, GB/s) "
          "and memory as JSON, and exit");
ABSL_FLAG(int, slice_rank, -1,
          "run rank R of --tp alone on one GPU (collectives recorded and modeled); -1: every rank");
ABSL_FLAG(double, floor_tbps, 4.24,
          "memory bandwidth of the floor in TB/s (the H200's measured device copy rate)");
ABSL_FLAG(bool, standalone, true,
          "also time the verify kernel alone on the same batch (L2 flushed before each run)");

namespace {

using verifyd::tp::CudaEngine;
using verifyd::tp::CudaStepProfile;
using verifyd::tp::EngineOptions;
using verifyd::tp::StepRequest;

std::vector<int64_t> ParseList(const std::string& s) {
  return verifyd::bench::ParseIntList(s, verifyd::bench::ListEntries::kParsed);
}

struct Row {
  int64_t context, nodes, batch;
  double step_ms, tokens_per_s;
  CudaStepProfile prof;
  double host_ms;
  double standalone_us = 0;  // the verify kernel alone, one layer, same batch
  int shared_packs = 0;      // shared-prefix packs in rank 0's plan of the last step
  double extras_ms = 0;      // --extras: the same step with sampling, logprobs, hidden states
  // --slice_rank: the recorded collectives of one step and their modeled time.
  int64_t collectives = 0, comm_bytes = 0;
  double modeled_comm_ms = 0;
  double floor_bytes = 0, floor_ms = 0;
  bool verify_kernel =
      false;  // the optimised kernel ran the step (CudaStepReport), not the fallback
};

// Median wall ms of Engine::Step over iters after warmup; -1 on an error (printed).
double TimeSteps(CudaEngine& e, const std::vector<StepRequest>& reqs) {
  std::vector<double> ms;
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup) + absl::GetFlag(FLAGS_iters); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto r = e.Step(reqs);
    const double dt =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!r.ok()) {
      std::fprintf(stderr, "step: %s\n", r.status().ToString().c_str());
      return -1;
    }
    if (i >= absl::GetFlag(FLAGS_warmup)) ms.push_back(dt);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Median time (us) of the verify attention kernel alone (plan once, run many) on the batch's
// exact index arrays, 64 / tp heads, random bf16 q and latent cache (kv_fp8: those rows in
// the FP8 format), with a 256 MB write before every run so the cache comes from HBM as it
// does inside a step. 0 on any error.
double StandaloneAttentionUs(const std::vector<StepRequest>& reqs,
                             const verifyd::tp::ModelConfig& c, int64_t kv_slots, bool kv_fp8) {
  namespace kc = verifyd::kernels::cuda;
  verifyd::tp::EngineLimits lim;
  lim.max_batch = static_cast<int>(reqs.size());
  lim.max_tail_rows = 128;
  lim.max_context = c.max_position_embeddings;
  auto plan = verifyd::tp::BuildBatchPlan(reqs, c, lim, kv_slots);
  if (!plan.ok()) return 0;
  const int64_t R = plan->total_rows, H = c.num_attention_heads, lat = c.latent_dim();
  void *q = nullptr, *kv = nullptr, *kv8 = nullptr, *out = nullptr, *flush = nullptr;
  int32_t *qi = nullptr, *ki = nullptr, *idx = nullptr;
  uint64_t* mask = nullptr;
  const size_t flush_bytes = size_t{256} << 20;
  bool ok =
      cudaMalloc(&q, R * H * lat * 2) == cudaSuccess &&
      cudaMalloc(&kv, kv_slots * lat * 2) == cudaSuccess &&
      cudaMalloc(&out, R * H * c.kv_lora_rank * 2) == cudaSuccess &&
      cudaMalloc(&flush, flush_bytes) == cudaSuccess &&
      cudaMalloc(reinterpret_cast<void**>(&qi), plan->q_indptr.size() * 4) == cudaSuccess &&
      cudaMalloc(reinterpret_cast<void**>(&ki), plan->kv_indptr.size() * 4) == cudaSuccess &&
      cudaMalloc(reinterpret_cast<void**>(&idx), plan->kv_indices.size() * 4) == cudaSuccess &&
      cudaMalloc(reinterpret_cast<void**>(&mask), plan->tree_mask.size() * 8) == cudaSuccess;
  double result = 0;
  if (ok) {
    cudaMemcpy(qi, plan->q_indptr.data(), plan->q_indptr.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(ki, plan->kv_indptr.data(), plan->kv_indptr.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(idx, plan->kv_indices.data(), plan->kv_indices.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(mask, plan->tree_mask.data(), plan->tree_mask.size() * 8, cudaMemcpyHostToDevice);
    kc::GenerateWeightsParams g;
    g.tensor_key = 7;
    g.scale = 1.f;
    g.rows = R * H;
    g.cols = lat;
    g.full_cols = lat;
    g.out = static_cast<verifyd::kernels::bf16_bits*>(q);
    g.ld_out = lat;
    ok = kc::GenerateWeightsCuda(g).ok();
    g.tensor_key = 8;
    g.rows = kv_slots;
    g.out = static_cast<verifyd::kernels::bf16_bits*>(kv);
    ok = ok && kc::GenerateWeightsCuda(g).ok();
    if (ok && kv_fp8) {
      kc::KvFp8EncodeRowsParams e;
      e.rows = kv_slots;
      e.kv_lora = static_cast<int>(c.kv_lora_rank);
      e.rope_dim = static_cast<int>(c.qk_rope_head_dim);
      e.in = static_cast<const verifyd::kernels::bf16_bits*>(kv);
      e.ld_in = lat;
      ok = cudaMalloc(&kv8, kv_slots * verifyd::kernels::KvFp8RowBytes(
                                           c.kv_lora_rank, c.qk_rope_head_dim,
                                           verifyd::kernels::kKvFp8Group)) == cudaSuccess;
      e.out = kv8;
      ok = ok && kc::KvFp8EncodeRowsCuda(e).ok();
    }
    verifyd::kernels::VerifyAttentionParams p;
    p.batch = plan->batch;
    p.total_rows = static_cast<int>(R);
    p.num_heads = static_cast<int>(H);
    p.qk_dim = static_cast<int>(lat);
    p.v_dim = static_cast<int>(c.kv_lora_rank);
    p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.qk_head_dim()));
    p.q = q;
    p.kv = kv_fp8 ? kv8 : kv;
    p.kv_fp8 = kv_fp8;
    p.kv_slots = kv_slots;
    p.q_indptr = qi;
    p.kv_indptr = ki;
    p.kv_indices = idx;
    p.tree_mask = mask;
    p.mask_words = verifyd::tp::kMaskWords;
    p.out = out;
    auto info = kc::VerifyAttentionDeviceInfo::Query();
    // The engine's workspace: with an FP8 cache, its default staging area (kS64Staged).
    auto ws = kc::VerifyAttentionWorkspace::AllocateDefault(
        kv_fp8 ? verifyd::tp::EngineOptions{}.cuda.fp8_staging_keys : 0);
    if (ok && info.ok() && ws.ok()) {
      auto vp =
          kc::PlanVerifyAttention(p, plan->q_indptr.data(), plan->kv_indptr.data(), *info, *ws);
      if (vp.ok() && kc::UploadVerifyAttentionPlan(*vp, *ws, nullptr).ok()) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        std::vector<double> us;
        for (int i = 0; i < 12; ++i) {
          cudaMemsetAsync(flush, i, flush_bytes, nullptr);  // evict the cache from L2
          cudaEventRecord(e0, nullptr);
          if (!kc::VerifyAttentionCuda(p, *vp, *ws).ok()) break;
          cudaEventRecord(e1, nullptr);
          cudaEventSynchronize(e1);
          float ms = 0;
          cudaEventElapsedTime(&ms, e0, e1);
          if (i >= 2) us.push_back(1e3 * ms);
        }
        if (!us.empty()) {
          std::sort(us.begin(), us.end());
          result = us[us.size() / 2];
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
      }
      (void)ws->Free();
    }
  }
  for (void* ptr : {q, kv, kv8, out, flush, static_cast<void*>(qi), static_cast<void*>(ki),
                    static_cast<void*>(idx), static_cast<void*>(mask)}) {
    if (ptr) cudaFree(ptr);
  }
  cudaGetLastError();
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::vector<int64_t> contexts = ParseList(absl::GetFlag(FLAGS_contexts));
  const std::vector<int64_t> trees = ParseList(absl::GetFlag(FLAGS_trees));
  const std::vector<int64_t> batches = ParseList(absl::GetFlag(FLAGS_batches));
  const int64_t max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int64_t max_nodes = *std::max_element(trees.begin(), trees.end());
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());

  EngineOptions o;
  o.model = absl::GetFlag(FLAGS_model);
  o.preset_layers = absl::GetFlag(FLAGS_layers);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.limits.max_batch = static_cast<int>(max_batch);
  o.limits.max_tail_rows = static_cast<int>(max_nodes + 1);
  o.kv_slots = max_ctx + max_batch * (max_nodes + 1) + 64;
  o.cuda.use_verify_kernel = absl::GetFlag(FLAGS_verify_kernel);
  o.cuda.batch_invariant = absl::GetFlag(FLAGS_batch_invariant);
  {
    const absl::StatusOr<verifyd::kernels::cuda::VerifyKernelConfig> vk =
        verifyd::kernels::cuda::ParseVerifyKernelConfig(absl::GetFlag(FLAGS_verify_config),
                                                        "--verify_config");
    if (!vk.ok()) {
      std::fprintf(stderr, "%s\n", std::string(vk.status().message()).c_str());
      return 2;
    }
    o.cuda.verify_config = *vk;
  }
  o.cuda.shared_context_attention = absl::GetFlag(FLAGS_shared_context);
  o.cuda.positional_chunk_keys = absl::GetFlag(FLAGS_positional_chunk_keys);
  o.cuda.positional_max_splits = absl::GetFlag(FLAGS_positional_max_splits);
  o.cuda.positional_partial_rows = absl::GetFlag(FLAGS_positional_partial_rows);
  o.cuda.fp8_experts = absl::GetFlag(FLAGS_fp8_weights);
  o.cuda.fp8_cublaslt = absl::GetFlag(FLAGS_fp8_cublaslt);
  o.cuda.shared_prefix_attention = absl::GetFlag(FLAGS_shared_prefix);
  {
    auto kv = verifyd::tp::ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype));
    if (!kv.ok()) {
      std::fprintf(stderr, "--%s\n", kv.status().ToString().c_str());
      return 2;
    }
    o.kv_dtype = *kv;
  }
  const bool kv_fp8 = o.kv_dtype == verifyd::tp::KvDtype::kFp8;
  const int tp = std::max(1, absl::GetFlag(FLAGS_tp));
  const int slice_rank = absl::GetFlag(FLAGS_slice_rank);
  o.tp = tp;
  o.cuda.slice_rank = slice_rank;
  if (tp > 1 && slice_rank < 0) o.cuda.devices.assign(tp, 0);
  const auto t_create = std::chrono::steady_clock::now();
  auto created = CudaEngine::Create(o);
  if (!created.ok()) {
    std::fprintf(stderr, "engine: %s\n", created.status().ToString().c_str());
    return 1;
  }
  CudaEngine& e = **created;
  const double create_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_create).count();
  if (absl::GetFlag(FLAGS_load_only)) {
    // The checkpoint's bytes on disk (a preset is generated: 0) over the engine's creation.
    int64_t file_bytes = 0;
    const std::filesystem::path dir(absl::GetFlag(FLAGS_model));
    if (std::filesystem::is_directory(dir)) {
      for (const auto& f : std::filesystem::directory_iterator(dir)) {
        if (f.path().extension() == ".safetensors") file_bytes += f.file_size();
      }
    }
    const verifyd::tp::EngineMemory mem = e.memory();
    nlohmann::json j = {{"bench", "engine_load"},
                        {"model", absl::GetFlag(FLAGS_model)},
                        {"commit", absl::GetFlag(FLAGS_commit)},
                        {"tp", tp},
                        {"slice_rank", slice_rank},
                        {"create_s", create_s},
                        {"file_bytes", file_bytes},
                        {"file_gbps", file_bytes / 1e9 / create_s},
                        {"device_bytes", mem.device_bytes},
                        {"weight_bytes_planned", mem.weight_bytes},
                        {"workspace_bytes_planned", mem.workspace_bytes},
                        {"planned_before_kv_bytes", mem.planned_before_kv_bytes},
                        {"used_before_kv_bytes", mem.used_before_kv_bytes},
                        {"kv_cache_bytes", mem.kv_cache_bytes},
                        {"kv_tokens", mem.kv_tokens}};
    std::printf("%s\n", j.dump(2).c_str());
    if (!absl::GetFlag(FLAGS_json).empty()) std::ofstream(absl::GetFlag(FLAGS_json)) << j.dump(2);
    return 0;
  }
  if (absl::Status s = e.FillLatentCacheRandom(123); !s.ok()) {
    std::fprintf(stderr, "fill: %s\n", s.ToString().c_str());
    return 1;
  }
  const auto& c = e.config();
  // The floor's parts from the rank's memory plan: every weight but the routed experts is
  // read each step, a routed expert only when a row reached it.
  double expert_bytes = 0, other_weight_bytes = 0;
  {
    verifyd::tp::MemoryPlanOptions po =
        verifyd::tp::MemoryPlanOptionsOf(o, e.memory().device_bytes);
    po.rank = std::max(0, slice_rank);
    auto plan = verifyd::tp::PlanRankMemory(c, po);
    if (!plan.ok()) {
      std::fprintf(stderr, "memory plan: %s\n", plan.status().ToString().c_str());
      return 1;
    }
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
    const double routed = static_cast<double>(plan->WeightBytes("routed_experts"));
    if (moe_layers > 0 && plan->local_experts > 0) {
      expert_bytes = routed / static_cast<double>(moe_layers * plan->local_experts);
    }
    other_weight_bytes = static_cast<double>(plan->weight_bytes) - routed;
  }
  const verifyd::tp::CommModel comm_model = verifyd::tp::NvlinkH200x8();
  const double floor_bps = absl::GetFlag(FLAGS_floor_tbps) * 1e12;
  const int64_t kv_token_bytes = e.memory().kv_bytes_per_token;
  std::printf(
      "model %s: %lld layers, hidden %lld, heads %lld, kv_lora %lld + rope %lld, "
      "vocab %lld; kv pool %lld slots; engine created in %.1f s\n",
      c.name.c_str(), static_cast<long long>(c.num_hidden_layers),
      static_cast<long long>(c.hidden_size), static_cast<long long>(c.num_attention_heads),
      static_cast<long long>(c.kv_lora_rank), static_cast<long long>(c.qk_rope_head_dim),
      static_cast<long long>(c.vocab_size), static_cast<long long>(e.kv_slots()), create_s);

  std::mt19937 rng(42);
  std::vector<Row> rows;
  for (int64_t ctx : contexts) {
    std::vector<int32_t> context(ctx);
    for (int64_t i = 0; i < ctx; ++i) context[i] = static_cast<int32_t>(i);
    for (int64_t nodes : trees) {
      for (int64_t batch : batches) {
        std::vector<StepRequest> reqs(batch);
        for (int64_t b = 0; b < batch; ++b) {
          StepRequest& q = reqs[b];
          q.context_slots = context;
          for (int64_t t = 0; t <= nodes; ++t) {
            q.tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
            q.parents.push_back(t == 0 ? -1 : static_cast<int32_t>(rng() % t));
            q.tail_slots.push_back(static_cast<int32_t>(ctx + b * (nodes + 1) + t));
          }
        }
        e.set_profile(false);
        const double med = TimeSteps(e, reqs);
        if (med < 0) return 1;
        // One more step with the event split (events add a little host time).
        e.set_profile(true);
        const auto t0 = std::chrono::steady_clock::now();
        if (auto r = e.Step(reqs); !r.ok()) return 1;
        const double prof_wall =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        const verifyd::tp::CudaStepReport step = e.last_step();
        Row row{ctx, nodes, batch, med, batch * (nodes + 1) / (med / 1e3), step.profile, 0};
        row.host_ms = std::max(0.0, prof_wall - row.prof.total_ms);
        row.shared_packs = step.shared_prefix_packs;
        row.verify_kernel = step.verify_kernel != "fallback";
        if (slice_rank >= 0) {
          const std::vector<verifyd::tp::CollectiveCall>& calls = step.collectives;
          row.collectives = static_cast<int64_t>(calls.size());
          for (const auto& call : calls) row.comm_bytes += call.bytes;
          row.modeled_comm_ms = 1e3 * verifyd::tp::ModeledSeconds(comm_model, calls);
        }
        // What the step must read: touched experts, the other weights, each request's KV.
        row.floor_bytes = expert_bytes * static_cast<double>(row.prof.experts_touched) +
                          other_weight_bytes +
                          static_cast<double>(batch) * static_cast<double>(ctx + nodes + 1) *
                              static_cast<double>(kv_token_bytes);
        row.floor_ms = 1e3 * row.floor_bytes / floor_bps;
        if (absl::GetFlag(FLAGS_standalone) && row.verify_kernel && tp == 1) {
          row.standalone_us = StandaloneAttentionUs(reqs, c, e.kv_slots(), kv_fp8);
        }
        if (absl::GetFlag(FLAGS_extras)) {
          e.set_profile(false);
          std::vector<StepRequest> extra = reqs;
          const std::string parts = absl::GetFlag(FLAGS_extras_parts);
          for (size_t b = 0; b < extra.size(); ++b) {
            if (absl::StrContains(parts, "sampling")) {
              extra[b].sampling.temperature = 0.7f;
              extra[b].sampling.top_p = 0.9f;
              extra[b].sampling.top_k = 50;
              extra[b].sampling.seed = 1000 + b;
            }
            if (absl::StrContains(parts, "logprobs")) extra[b].top_logprobs = 5;
            if (absl::StrContains(parts, "hidden")) {
              extra[b].hidden_layers = {0, static_cast<int32_t>(c.num_hidden_layers / 2),
                                        static_cast<int32_t>(c.num_hidden_layers - 1)};
            }
          }
          row.extras_ms = TimeSteps(e, extra);
          if (row.extras_ms < 0) return 1;
        }
        rows.push_back(row);
        std::fprintf(stderr, "ctx %6lld nodes %2lld batch %2lld: %8.2f ms\n",
                     static_cast<long long>(ctx), static_cast<long long>(nodes),
                     static_cast<long long>(batch), med);
      }
    }
  }

  nlohmann::json j;
  {
    cudaDeviceProp prop{};
    int driver = 0, runtime = 0, sm_khz = 0, mem_khz = 0, dev_id = 0;
    if (cudaGetDevice(&dev_id) != cudaSuccess ||
        cudaGetDeviceProperties(&prop, dev_id) != cudaSuccess ||
        cudaDriverGetVersion(&driver) != cudaSuccess ||
        cudaRuntimeGetVersion(&runtime) != cudaSuccess ||
        cudaDeviceGetAttribute(&sm_khz, cudaDevAttrClockRate, dev_id) != cudaSuccess ||
        cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev_id) != cudaSuccess) {
      std::fprintf(stderr, "engine_bench: cannot read the device properties\n");
      return 1;
    }
    j["bench"] = "engine";
    j["impl"] = "verifyd";
    j["meta"] = {
        {"commit", absl::GetFlag(FLAGS_commit)},
        {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())},
        {"device", prop.name},
        {"cc", absl::StrCat(prop.major, ".", prop.minor)},
        {"num_sms", prop.multiProcessorCount},
        {"driver_version", driver},
        {"runtime_version", runtime},
        {"sm_clock_mhz", sm_khz / 1000},
        {"mem_clock_mhz", mem_khz / 1000},
        {"timing",
         "step_ms = median wall time of Engine::Step over iters after warmup; the time split "
         "comes from one profiled step (CUDA events on rank 0)"},
    };
  }
  j["tp"] = tp;
  if (slice_rank >= 0) {
    j["slice"] = {{"rank", slice_rank}, {"world", tp}};
    j["comm_model"] = {{"name", comm_model.name},
                       {"source", comm_model.source},
                       {"all_reduce_latency_us", comm_model.all_reduce_latency_us},
                       {"all_reduce_bus_gbps", comm_model.all_reduce_bus_gbps},
                       {"all_gather_latency_us", comm_model.all_gather_latency_us},
                       {"all_gather_bus_gbps", comm_model.all_gather_bus_gbps}};
  }
  j["floor_tbps"] = absl::GetFlag(FLAGS_floor_tbps);
  j["expert_bytes"] = expert_bytes;
  j["other_weight_bytes"] = other_weight_bytes;
  j["kv_bytes_per_token"] = kv_token_bytes;
  j["memory"] = {{"device_bytes", e.memory().device_bytes},
                 {"weight_bytes_planned", e.memory().weight_bytes},
                 {"workspace_bytes_planned", e.memory().workspace_bytes},
                 {"used_before_kv_bytes", e.memory().used_before_kv_bytes},
                 {"kv_cache_bytes", e.memory().kv_cache_bytes},
                 {"kv_tokens", e.memory().kv_tokens},
                 {"create_s", create_s}};
  const verifyd::tp::CudaLoadReport load = e.load_report();
  j["expert_mode"] = load.expert_mode;
  j["shared_prefix"] = absl::GetFlag(FLAGS_shared_prefix);
  j["model"] = c.name;
  j["layers"] = c.num_hidden_layers;
  j["verify_kernel"] = rows.empty() ? false : rows[0].verify_kernel;
  j["verify_config"] = absl::GetFlag(FLAGS_verify_config);
  j["batch_invariant"] = absl::GetFlag(FLAGS_batch_invariant);
  j["shared_context"] = absl::GetFlag(FLAGS_shared_context);
  j["positional_chunk_keys"] = absl::GetFlag(FLAGS_positional_chunk_keys);
  j["positional_max_splits"] = absl::GetFlag(FLAGS_positional_max_splits);
  j["positional_partial_rows"] = absl::GetFlag(FLAGS_positional_partial_rows);
  {
    // A preset's weights are generated; a checkpoint is named by its directory's last part.
    const std::string m = absl::GetFlag(FLAGS_model);
    const std::vector<std::string> presets = verifyd::tp::PresetNames();
    j["weights"] = std::find(presets.begin(), presets.end(), m) != presets.end()
                       ? absl::StrCat("generated (", m, ", seed ", absl::GetFlag(FLAGS_seed), ")")
                       : absl::StrCat("checkpoint ", std::filesystem::path(m).filename().string());
  }
  j["fp8_attention"] = load.fp8_attention;
  j["kv_cache_dtype"] = e.kv_cache_dtype();
  j["fp8_mlps"] = load.fp8_mlps;
  j["fp8_gemm"] = load.fp8_gemm;
  for (const Row& r : rows) {
    j["rows"].push_back(
        {{"context", r.context},
         {"nodes", r.nodes},
         {"batch", r.batch},
         {"step_ms", r.step_ms},
         {"tokens_per_s", r.tokens_per_s},
         {"attention_ms", r.prof.attention_ms},
         {"gemm_ms", r.prof.gemm_ms},
         {"comm_ms", r.prof.comm_ms},
         {"other_ms", r.prof.other_ms},
         {"gpu_ms", r.prof.total_ms},
         {"host_ms", r.host_ms},
         {"attention_per_layer_us", 1e3 * r.prof.attention_ms / c.num_hidden_layers},
         {"standalone_kernel_us", r.standalone_us},
         {"shared_prefix_packs", r.shared_packs},
         {"extras_step_ms", r.extras_ms},
         {"router_ms", r.prof.router_ms},
         {"dispatch_ms", r.prof.dispatch_ms},
         {"experts_ms", r.prof.experts_ms},
         {"sampling_ms", r.prof.sampling_ms},
         {"distinct_experts", r.prof.experts_touched},
         {"collectives", r.collectives},
         {"comm_bytes", r.comm_bytes},
         {"modeled_comm_ms", r.modeled_comm_ms},
         {"step_with_comm_ms", r.step_ms + r.modeled_comm_ms},
         {"tokens_per_s_host", r.batch * (r.nodes + 1) / ((r.step_ms + r.modeled_comm_ms) / 1e3)},
         {"tokens_per_s_gpu",
          r.batch * (r.nodes + 1) / ((r.step_ms + r.modeled_comm_ms) / 1e3) / tp},
         {"floor_bytes", r.floor_bytes},
         {"floor_ms", r.floor_ms},
         {"floor_fraction", r.step_ms > 0 ? r.floor_ms / r.step_ms : 0.0},
         {"fits", true}});
  }
  if (!absl::GetFlag(FLAGS_json).empty()) {
    std::ofstream(absl::GetFlag(FLAGS_json)) << j.dump(2) << "\n";
  }
  std::printf(
      "\n%lld layers, TP=%d, attention: %s. step = median wall ms of one Engine::Step;"
      " split from one profiled step (GPU ms, rank 0); attn/L = attention per layer\n",
      static_cast<long long>(c.num_hidden_layers), tp,
      (!rows.empty() && rows[0].verify_kernel) ? "verify kernel" : "fallback");
  std::printf("%7s %5s %5s | %9s %10s | %8s %8s %6s %7s %7s | %9s %9s %5s\n", "context", "nodes",
              "batch", "step ms", "tokens/s", "attn ms", "gemm ms", "comm", "other", "host",
              "attn/L us", "alone us", "ratio");
  for (const Row& r : rows) {
    const double per_layer = 1e3 * r.prof.attention_ms / c.num_hidden_layers;
    std::printf(
        "%7lld %5lld %5lld | %9.2f %10.0f | %8.2f %8.2f %6.2f %7.2f %7.2f | %9.1f %9.1f %5.2f\n",
        static_cast<long long>(r.context), static_cast<long long>(r.nodes),
        static_cast<long long>(r.batch), r.step_ms, r.tokens_per_s, r.prof.attention_ms,
        r.prof.gemm_ms, r.prof.comm_ms, r.prof.other_ms, r.host_ms, per_layer, r.standalone_us,
        r.standalone_us > 0 ? per_layer / r.standalone_us : 0.0);
  }
  if (slice_rank >= 0 || c.moe.n_routed_experts > 0) {
    std::printf(
        "\nrank %d of %d alone; comm modeled (%s); floor = bytes the step must read / %.2f TB/s"
        "\n%7s %5s %5s | %9s %8s %9s | %7s %7s %7s %7s %7s %7s | %7s %8s %6s | %10s\n",
        std::max(0, slice_rank), tp, comm_model.name.c_str(), absl::GetFlag(FLAGS_floor_tbps),
        "context", "nodes", "batch", "step ms", "comm ms", "+comm ms", "router", "dispatch",
        "experts", "dense", "attn", "sample", "experts", "floor ms", "floor%", "host tok/s");
    for (const Row& r : rows) {
      const double with_comm = r.step_ms + r.modeled_comm_ms;
      std::printf(
          "%7lld %5lld %5lld | %9.2f %8.2f %9.2f | %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f | %7lld "
          "%8.2f %5.0f%% | %10.0f\n",
          static_cast<long long>(r.context), static_cast<long long>(r.nodes),
          static_cast<long long>(r.batch), r.step_ms, r.modeled_comm_ms, with_comm,
          r.prof.router_ms, r.prof.dispatch_ms, r.prof.experts_ms, r.prof.gemm_ms,
          r.prof.attention_ms, r.prof.sampling_ms, static_cast<long long>(r.prof.experts_touched),
          r.floor_ms, 100.0 * r.floor_ms / r.step_ms, r.batch * (r.nodes + 1) / (with_comm / 1e3));
    }
  }
  if (absl::GetFlag(FLAGS_extras)) {
    std::printf(
        "\nwith seeded sampling (T 0.7, top-p 0.9, top-k 50), top-5 logprobs and 3 hidden "
        "layers:\n%7s %5s %5s | %9s %9s %6s\n",
        "context", "nodes", "batch", "plain ms", "extras ms", "ratio");
    for (const Row& r : rows) {
      std::printf("%7lld %5lld %5lld | %9.2f %9.2f %6.3f\n", static_cast<long long>(r.context),
                  static_cast<long long>(r.nodes), static_cast<long long>(r.batch), r.step_ms,
                  r.extras_ms, r.extras_ms / r.step_ms);
    }
  }
  return 0;
}
