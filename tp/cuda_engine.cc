// The CUDA engine (see cuda_engine.h).
//
// Buffers of a rank (R = max_batch * max_tail_rows rows at most; H_l local heads; lat =
// kv_lora + rope; I_l local intermediate; V_l local vocab rows, Vmax the largest shard):
//   x     [R, hidden] fp32    residual stream
//   xn    [R, hidden] bf16    RMSNorm(x): input of the projections
//   qa    [R, q_lora] fp32 -> qan bf16 (q_a_layernorm)
//   q     [R, H_l, nope + rope] bf16
//   kva   [R, lat] fp32       kv_a output, normed + roped into the layer's cache
//   qatt  [R, H_l, lat] bf16  absorbed query [q_nope . W_UK | roped q_rope]
//   olat  [R, H_l, kv_lora] bf16  attention output in the latent space
//   attn  [R, H_l * v] bf16   olat . W_UV^T
//   part  [R, hidden] fp32    o_proj / down partial sums (all-reduced when TP > 1)
//   gu    [R, 2 * I_l] fp32   [gate | up];  act [R, I_l] bf16 = silu(gate) * up
//   logits [R, Vmax] fp32;  pairs [R] / gathered [world, R] (value, index)
// At TP = 1 the o_proj and down GEMMs accumulate straight into x (beta = 1): no add kernel.
#include "tp/cuda_engine.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/dense/argmax.h"
#include "kernels/cuda/dense/elementwise.h"
#include "kernels/cuda/dense/gemm.h"
#include "kernels/cuda/dense/rms_norm.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/cuda/dense/status.h"
#include "kernels/cuda/dense/weight_gen.h"
#include "kernels/tree_accept.h"
#include "kernels/verify_attention.h"
#include "tp/cpu_forward.h"  // BuildBatchPlan, BatchPlan, kMaskWords
#include "tp/cuda/engine_kernels.h"
#include "tp/presets.h"
#include "tp/sharding.h"
#include "tp/weight_init.h"
#include "tp/weights.h"
#if VERIFYD_ENGINE_WITH_NCCL
#include "tp/nccl_communicator.h"
#endif
#if VERIFYD_ENGINE_HAS_VERIFY_KERNEL
#include "kernels/cuda/tree_accept_cuda.h"
#include "kernels/cuda/verify_attention_cuda.h"
#endif

namespace verifyd::tp {
namespace {

namespace kc = kernels::cuda;
using bf16 = kernels::bf16_bits;
using Clock = std::chrono::steady_clock;

#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    const absl::Status _st = (expr);           \
    if (!_st.ok()) return _st;                 \
  } while (0)

// Profile categories of the time split.
enum Category : int { kCatOther = 0, kCatGemm = 1, kCatAttention = 2, kCatComm = 3 };

// Offsets (bytes) of the step plan's arrays in one arena (host pinned and device copies).
struct PlanLayout {
  size_t mask = 0, tokens = 0, positions = 0, slots = 0, parents = 0, q_indptr = 0,
         kv_indptr = 0, kv_indices = 0, total = 0;
  static PlanLayout For(int64_t rows, int64_t batch, int64_t kv_total) {
    PlanLayout l;
    size_t o = 0;
    auto take = [&o](size_t bytes) {
      const size_t at = o;
      o += (bytes + 255) / 256 * 256;
      return at;
    };
    l.mask = take(rows * kMaskWords * sizeof(uint64_t));
    l.tokens = take(rows * 4);
    l.positions = take(rows * 4);
    l.slots = take(rows * 4);
    l.parents = take(rows * 4);
    l.q_indptr = take((batch + 1) * 4);
    l.kv_indptr = take((batch + 1) * 4);
    l.kv_indices = take(std::max<int64_t>(kv_total, 1) * 4);
    l.total = o;
    return l;
  }
};

// Waits for a stream with a deadline (TP = 1 has no communicator to poll).
absl::Status WaitStream(cudaStream_t s, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (int it = 0;; ++it) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      return absl::UnavailableError(absl::StrCat("stream failed: ", cudaGetErrorName(e), " ",
                                                 cudaGetErrorString(e)));
    }
    if (Clock::now() > deadline) {
      return absl::UnavailableError(absl::StrCat("stream not done after ", timeout_ms, " ms"));
    }
    if (it < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------
// One rank: its device, stream, handles, weights, KV pool and buffers. Used only by its own
// thread (after construction).
struct CudaRankCtx {
  int rank = 0;
  int device = 0;
  int world = 1;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
#if VERIFYD_ENGINE_WITH_NCCL
  std::unique_ptr<NcclCommunicator> comm;
#endif
  std::vector<void*> allocs;  // freed on this rank's thread at shutdown
  std::vector<void*> host_allocs;
  ShardRange heads, vocab, inter;
  int64_t vmax = 0;

  struct Layer {
    bf16 *input_norm = nullptr, *q_a = nullptr, *q_a_norm = nullptr, *q_b = nullptr;
    bf16 *kv_a = nullptr, *kv_a_norm = nullptr, *kv_b = nullptr, *o_proj = nullptr;
    bf16 *post_norm = nullptr, *gate_up = nullptr, *down = nullptr;
  };
  bf16* embed = nullptr;
  bf16* final_norm = nullptr;
  bf16* lm_head = nullptr;
  std::vector<Layer> layers;
  std::vector<bf16*> kv;  // [layers] -> [kv_capacity, lat]

  float *x = nullptr, *qa = nullptr, *kva = nullptr, *part = nullptr, *gu = nullptr;
  float *logits = nullptr, *cos_t = nullptr, *sin_t = nullptr, *inv_freq = nullptr;
  bf16 *xn = nullptr, *qan = nullptr, *q = nullptr, *qatt = nullptr, *olat = nullptr;
  bf16 *attn = nullptr, *act = nullptr;
  kc::ArgmaxPair *pairs = nullptr, *gathered = nullptr;
  int32_t *preds = nullptr, *accepted = nullptr, *num_accepted = nullptr, *bonus = nullptr;
  int32_t *kept = nullptr, *freed = nullptr;
  float* logits_gathered = nullptr;  // [world, R, Vmax] on demand (StepWithLogits, TP > 1)

  char* plan_dev = nullptr;
  size_t plan_dev_bytes = 0;
  char* out_host = nullptr;  // pinned: preds, accepted, kept, freed [R] + num_accepted, bonus [B]

#if VERIFYD_ENGINE_HAS_VERIFY_KERNEL
  bool have_vk = false;
  kc::VerifyAttentionDeviceInfo vk_info;
  kc::VerifyAttentionWorkspace vk_ws;
#endif

  // Profiling (rank 0): events in stream order and the category of the segment each opens.
  std::vector<cudaEvent_t> events;
  std::vector<int> event_cat;
  size_t events_used = 0;
  CudaStepProfile profile;

  // Job hand-off (guarded by the engine's mutex).
  uint64_t done_job = 0;
  absl::Status status;
  double seconds = 0;
  size_t free_bytes = 0;

  template <typename T>
  absl::StatusOr<T*> Alloc(int64_t count) {
    void* p = nullptr;
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T);
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes));
    allocs.push_back(p);
    return static_cast<T*>(p);
  }
};

struct CudaEngine::Impl {
  CudaEngineOptions options;
  ModelConfig config;
  std::shared_ptr<const ModelWeights> host_weights;  // null: generate on the device
  std::map<std::string, TensorSpec> specs;
  int tp = 1;
  int64_t kv_capacity = 0;
  EngineLimits limits;
  int64_t max_rows = 0;
  bool use_vk = false;
  std::atomic<bool> failed{false};
  std::string nccl_id;
#if VERIFYD_ENGINE_WITH_NCCL
  std::shared_ptr<NcclGroupState> nccl_group;
#endif

  std::vector<std::unique_ptr<CudaRankCtx>> ranks;
  std::vector<std::thread> threads;

  std::mutex step_mu;  // serialises Step calls

  std::mutex mu;
  std::condition_variable cv;
  uint64_t job_id = 0;                              // guarded by mu
  bool shutdown = false;                            // guarded by mu
  std::function<absl::Status(CudaRankCtx&)> job;        // guarded by mu
  int64_t step_index = 0;

  // Host plan arena (pinned), written by the Step thread before the ranks run.
  char* plan_host = nullptr;
  size_t plan_host_bytes = 0;

  ~Impl();
  void RankLoop(int r);
  absl::Status RunOnRanks(std::function<absl::Status(CudaRankCtx&)> fn, std::string* failure);
  absl::Status InitRank(CudaRankCtx& rk);
  absl::Status AllocKv(CudaRankCtx& rk);
  absl::Status FillTensor(CudaRankCtx& rk, const std::string& name, bf16* dst, int64_t rows,
                          int64_t cols, int64_t row0, int64_t col0);
  absl::Status Forward(CudaRankCtx& rk, const BatchPlan& plan, const PlanLayout& lay,
                       bool want_logits);
  absl::Status Wait(CudaRankCtx& rk);
  void Mark(CudaRankCtx& rk, int cat);
  absl::Status CollectProfile(CudaRankCtx& rk);
  void FreeRank(CudaRankCtx& rk);
  absl::StatusOr<std::vector<StepResult>> RunStep(const std::vector<StepRequest>& batch,
                                                  std::vector<float>* logits,
                                                  StepTiming* timing);
};

// ------------------------------------------------------------------------------------------
// Rank threads and the job hand-off.

void CudaEngine::Impl::RankLoop(int r) {
  CudaRankCtx& rk = *ranks[r];
  cudaSetDevice(rk.device);
  uint64_t seen = 0;
  for (;;) {
    std::function<absl::Status(CudaRankCtx&)> fn;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return shutdown || job_id != seen; });
      if (shutdown) break;
      seen = job_id;
      fn = job;
    }
    const auto t0 = Clock::now();
    absl::Status st = fn(rk);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu);
      rk.status = std::move(st);
      rk.seconds = secs;
      rk.done_job = seen;
    }
    cv.notify_all();
  }
  FreeRank(rk);
}

absl::Status CudaEngine::Impl::RunOnRanks(std::function<absl::Status(CudaRankCtx&)> fn,
                                          std::string* failure) {
  std::unique_lock<std::mutex> lock(mu);
  job = std::move(fn);
  const uint64_t id = ++job_id;
  cv.notify_all();
  auto all_done = [&] {
    for (const auto& r : ranks) {
      if (r->done_job != id) return false;
    }
    return true;
  };
  auto any_failed = [&] {
    for (const auto& r : ranks) {
      if (r->done_job == id && !r->status.ok()) return true;
    }
    return false;
  };
  // A healthy step never takes the collective timeout; a rank that does is declared hung.
  const auto guard = std::chrono::milliseconds(2 * options.comm_timeout_ms + 1000);
  cv.wait_for(lock, guard, [&] { return all_done() || any_failed(); });
  if (!all_done()) {
    lock.unlock();
#if VERIFYD_ENGINE_WITH_NCCL
    for (auto& r : ranks) {
      if (r->comm) r->comm->Abort();
    }
#endif
    lock.lock();
    cv.wait_for(lock, std::chrono::milliseconds(options.comm_timeout_ms), all_done);
  }
  for (int r = 0; r < tp; ++r) {
    const CudaRankCtx& rk = *ranks[r];
    if (rk.done_job != id) {
      *failure = absl::StrCat("rank ", r, " did not finish (hung)");
      return absl::UnavailableError(*failure);
    }
    if (!rk.status.ok()) {
      *failure = absl::StrCat("rank ", r, ": ", rk.status.ToString());
      return rk.status;
    }
  }
  return absl::OkStatus();
}

CudaEngine::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mu);
    shutdown = true;
  }
  cv.notify_all();
  for (auto& t : threads) {
    if (t.joinable()) t.join();
  }
  if (plan_host != nullptr) cudaFreeHost(plan_host);
}

void CudaEngine::Impl::FreeRank(CudaRankCtx& rk) {
  cudaSetDevice(rk.device);
  if (rk.stream != nullptr) cudaStreamSynchronize(rk.stream);
#if VERIFYD_ENGINE_WITH_NCCL
  rk.comm.reset();
#endif
#if VERIFYD_ENGINE_HAS_VERIFY_KERNEL
  if (rk.vk_ws.device != nullptr) (void)rk.vk_ws.Free();
#endif
  for (cudaEvent_t e : rk.events) cudaEventDestroy(e);
  rk.events.clear();
  if (rk.cublas != nullptr) cublasDestroy(rk.cublas);
  rk.cublas = nullptr;
  for (void* p : rk.allocs) cudaFree(p);
  rk.allocs.clear();
  for (void* p : rk.host_allocs) cudaFreeHost(p);
  rk.host_allocs.clear();
  if (rk.stream != nullptr) cudaStreamDestroy(rk.stream);
  rk.stream = nullptr;
}

// ------------------------------------------------------------------------------------------
// Initialisation on each rank's thread.

absl::Status CudaEngine::Impl::FillTensor(CudaRankCtx& rk, const std::string& name, bf16* dst,
                                          int64_t rows, int64_t cols, int64_t row0,
                                          int64_t col0) {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (host_weights == nullptr) {
    auto it = specs.find(name);
    if (it == specs.end()) return absl::InternalError(absl::StrCat("no spec for tensor ", name));
    const TensorSpec& s = it->second;
    const int64_t full_cols = s.shape.size() > 1 ? s.shape[1] : s.shape[0];
    kc::GenerateWeightsParams g;
    g.tensor_key = WeightTensorKey(options.seed, WeightNameHash(name));
    g.scale = s.init_scale;
    g.offset = s.init_offset;
    g.rows = rows;
    g.cols = cols;
    g.full_cols = full_cols;
    g.row0 = row0;
    g.col0 = col0;
    g.out = dst;
    g.ld_out = cols;
    g.stream = rk.stream;
    return kc::GenerateWeightsCuda(g);
  }
  const HostTensor* t = host_weights->Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("weights: tensor '", name, "' is missing"));
  const int64_t full_cols = t->shape.size() > 1 ? t->shape[1] : t->shape[0];
  std::vector<bf16> tmp(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float* src = t->data.data() + (row0 + r) * full_cols + col0;
    for (int64_t c = 0; c < cols; ++c) tmp[r * cols + c] = kernels::FloatToBf16(src[c]);
  }
  // Synchronous copy: tmp dies at return.
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, tmp.data(), tmp.size() * sizeof(bf16), cudaMemcpyHostToDevice, rk.stream));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
  return absl::OkStatus();
}

absl::Status CudaEngine::Impl::InitRank(CudaRankCtx& rk) {
  const ModelConfig& c = config;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaSetDevice(rk.device));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&rk.stream, cudaStreamNonBlocking));
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasCreate(&rk.cublas));
  VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasSetStream(rk.cublas, rk.stream));
  {
    // A fixed cuBLAS workspace: no allocation inside a step (graph-capture safe).
    constexpr size_t kCublasWs = size_t{32} << 20;
    absl::StatusOr<char*> ws = rk.Alloc<char>(kCublasWs);
    if (!ws.ok()) return ws.status();
    VERIFYD_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(rk.cublas, *ws, kCublasWs));
  }
#if VERIFYD_ENGINE_WITH_NCCL
  if (tp > 1) {
    auto comm = NcclCommunicator::Create(nccl_id, rk.rank, tp, rk.device,
                                         options.comm_timeout_ms, nccl_group);
    if (!comm.ok()) return comm.status();
    rk.comm = std::move(*comm);
  }
#endif
  rk.heads = HeadShard(c.num_attention_heads, tp, rk.rank);
  rk.vocab = VocabShard(c.vocab_size, tp, rk.rank);
  rk.inter = IntermediateShard(c.intermediate_size, tp, rk.rank);
  rk.vmax = CeilShardMax(c.vocab_size, tp);
  const int64_t hid = c.hidden_size, qk = c.qk_head_dim(), nope = c.qk_nope_head_dim;
  const int64_t v = c.v_head_dim, kvl = c.kv_lora_rank, lat = c.latent_dim();
  const int64_t Hl = rk.heads.size, h0 = rk.heads.begin, Il = rk.inter.size;
  const int64_t ql = c.q_lora_rank, R = max_rows;

#define ALLOC(ptr, T, n)                          \
  do {                                            \
    absl::StatusOr<T*> _a = rk.Alloc<T>(n);       \
    if (!_a.ok()) return _a.status();             \
    ptr = *_a;                                    \
  } while (0)

  // Weights (bf16): the rank's shard of every tensor.
  ALLOC(rk.embed, bf16, c.vocab_size * hid);
  RETURN_IF_ERROR(FillTensor(rk, "model.embed_tokens.weight", rk.embed, c.vocab_size, hid, 0, 0));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto n = [&](const char* suffix) { return LayerTensorName(l, suffix); };
    CudaRankCtx::Layer L;
    ALLOC(L.input_norm, bf16, hid);
    RETURN_IF_ERROR(FillTensor(rk, n("input_layernorm.weight"), L.input_norm, 1, hid, 0, 0));
    if (ql > 0) {
      ALLOC(L.q_a, bf16, ql * hid);
      RETURN_IF_ERROR(FillTensor(rk, n("self_attn.q_a_proj.weight"), L.q_a, ql, hid, 0, 0));
      ALLOC(L.q_a_norm, bf16, ql);
      RETURN_IF_ERROR(FillTensor(rk, n("self_attn.q_a_layernorm.weight"), L.q_a_norm, 1, ql, 0, 0));
      ALLOC(L.q_b, bf16, Hl * qk * ql);
      RETURN_IF_ERROR(FillTensor(rk, n("self_attn.q_b_proj.weight"), L.q_b, Hl * qk, ql, h0 * qk, 0));
    } else {
      ALLOC(L.q_b, bf16, Hl * qk * hid);
      RETURN_IF_ERROR(FillTensor(rk, n("self_attn.q_proj.weight"), L.q_b, Hl * qk, hid, h0 * qk, 0));
    }
    ALLOC(L.kv_a, bf16, lat * hid);
    RETURN_IF_ERROR(FillTensor(rk, n("self_attn.kv_a_proj_with_mqa.weight"), L.kv_a, lat, hid, 0, 0));
    ALLOC(L.kv_a_norm, bf16, kvl);
    RETURN_IF_ERROR(FillTensor(rk, n("self_attn.kv_a_layernorm.weight"), L.kv_a_norm, 1, kvl, 0, 0));
    // kv_b rows of the local heads, in the checkpoint layout: per head W_UK [nope, kv_lora]
    // then W_UV [v, kv_lora]; the batched GEMMs read both in place.
    ALLOC(L.kv_b, bf16, Hl * (nope + v) * kvl);
    RETURN_IF_ERROR(FillTensor(rk, n("self_attn.kv_b_proj.weight"), L.kv_b, Hl * (nope + v), kvl,
                               h0 * (nope + v), 0));
    ALLOC(L.o_proj, bf16, hid * Hl * v);
    RETURN_IF_ERROR(FillTensor(rk, n("self_attn.o_proj.weight"), L.o_proj, hid, Hl * v, 0, h0 * v));
    ALLOC(L.post_norm, bf16, hid);
    RETURN_IF_ERROR(FillTensor(rk, n("post_attention_layernorm.weight"), L.post_norm, 1, hid, 0, 0));
    if (Il > 0) {
      // [gate rows | up rows] of the local intermediate columns: one GEMM for both.
      ALLOC(L.gate_up, bf16, 2 * Il * hid);
      RETURN_IF_ERROR(FillTensor(rk, n("mlp.gate_proj.weight"), L.gate_up, Il, hid, rk.inter.begin, 0));
      RETURN_IF_ERROR(FillTensor(rk, n("mlp.up_proj.weight"), L.gate_up + Il * hid, Il, hid,
                                 rk.inter.begin, 0));
      ALLOC(L.down, bf16, hid * Il);
      RETURN_IF_ERROR(FillTensor(rk, n("mlp.down_proj.weight"), L.down, hid, Il, 0, rk.inter.begin));
    }
    rk.layers.push_back(L);
  }
  ALLOC(rk.final_norm, bf16, hid);
  RETURN_IF_ERROR(FillTensor(rk, "model.norm.weight", rk.final_norm, 1, hid, 0, 0));
  if (rk.vocab.size > 0) {
    ALLOC(rk.lm_head, bf16, rk.vocab.size * hid);
    RETURN_IF_ERROR(FillTensor(rk, c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                               rk.lm_head, rk.vocab.size, hid, rk.vocab.begin, 0));
  }

  // Activations for the largest step.
  ALLOC(rk.x, float, R * hid);
  ALLOC(rk.xn, bf16, R * hid);
  if (ql > 0) {
    ALLOC(rk.qa, float, R * ql);
    ALLOC(rk.qan, bf16, R * ql);
  }
  ALLOC(rk.q, bf16, R * Hl * qk);
  ALLOC(rk.kva, float, R * lat);
  ALLOC(rk.qatt, bf16, R * Hl * lat);
  ALLOC(rk.olat, bf16, R * Hl * kvl);
  ALLOC(rk.attn, bf16, R * Hl * v);
  ALLOC(rk.part, float, R * hid);
  ALLOC(rk.gu, float, R * 2 * std::max<int64_t>(Il, 1));
  ALLOC(rk.act, bf16, R * std::max<int64_t>(Il, 1));
  ALLOC(rk.logits, float, R * rk.vmax);
  ALLOC(rk.cos_t, float, R * c.qk_rope_head_dim / 2);
  ALLOC(rk.sin_t, float, R * c.qk_rope_head_dim / 2);
  ALLOC(rk.inv_freq, float, c.qk_rope_head_dim / 2);
  ALLOC(rk.pairs, kc::ArgmaxPair, R);
  ALLOC(rk.gathered, kc::ArgmaxPair, R * tp);
  ALLOC(rk.preds, int32_t, R);
  ALLOC(rk.accepted, int32_t, R);
  ALLOC(rk.kept, int32_t, R);
  ALLOC(rk.freed, int32_t, R);
  ALLOC(rk.num_accepted, int32_t, limits.max_batch);
  ALLOC(rk.bonus, int32_t, limits.max_batch);
#undef ALLOC
  {
    const std::vector<float> inv = kc::RopeInvFreq(static_cast<int>(c.qk_rope_head_dim), c.rope_theta);
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rk.inv_freq, inv.data(), inv.size() * sizeof(float),
                                                 cudaMemcpyHostToDevice, rk.stream));
  }
  {
    void* h = nullptr;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h, (4 * R + 2 * limits.max_batch) * sizeof(int32_t)));
    rk.host_allocs.push_back(h);
    rk.out_host = static_cast<char*>(h);
  }
#if VERIFYD_ENGINE_HAS_VERIFY_KERNEL
  if (use_vk) {
    absl::StatusOr<kc::VerifyAttentionDeviceInfo> info = kc::VerifyAttentionDeviceInfo::Query();
    if (!info.ok()) return info.status();
    rk.vk_info = *info;
    absl::StatusOr<kc::VerifyAttentionWorkspace> ws = kc::VerifyAttentionWorkspace::AllocateDefault();
    if (!ws.ok()) return ws.status();
    rk.vk_ws = *ws;
    rk.have_vk = true;
  }
#endif
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
  size_t free_b = 0, total_b = 0;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  rk.free_bytes = free_b;
  return absl::OkStatus();
}

absl::Status CudaEngine::Impl::AllocKv(CudaRankCtx& rk) {
  const int64_t lat = config.latent_dim();
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    absl::StatusOr<bf16*> p = rk.Alloc<bf16>(kv_capacity * lat);
    if (!p.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat("latent KV pool of ", kv_capacity,
                                                       " slots: ", p.status().message()));
    }
    // Poison: every byte 0xFF is a bf16 NaN, so a read of a slot nothing wrote shows up.
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(*p, 0xFF, kv_capacity * lat * sizeof(bf16), rk.stream));
    rk.kv.push_back(*p);
  }
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------
// The forward of one step on one rank.

void CudaEngine::Impl::Mark(CudaRankCtx& rk, int cat) {
  if (!options.profile || rk.rank != 0) return;
  if (rk.events_used == rk.events.size()) {
    cudaEvent_t e;
    if (cudaEventCreate(&e) != cudaSuccess) return;
    rk.events.push_back(e);
    rk.event_cat.push_back(0);
  }
  cudaEventRecord(rk.events[rk.events_used], rk.stream);
  rk.event_cat[rk.events_used] = cat;
  ++rk.events_used;
}

absl::Status CudaEngine::Impl::CollectProfile(CudaRankCtx& rk) {
  CudaStepProfile p;
#if VERIFYD_ENGINE_HAS_VERIFY_KERNEL
  p.verify_kernel = rk.have_vk;
#endif
  for (size_t i = 0; i + 1 < rk.events_used; ++i) {
    float ms = 0;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, rk.events[i], rk.events[i + 1]));
    switch (rk.event_cat[i]) {
      case kCatGemm: p.gemm_ms += ms; break;
      case kCatAttention: p.attention_ms += ms; break;
      case kCatComm: p.comm_ms += ms; break;
      default: p.other_ms += ms; break;
    }
    p.total_ms += ms;
  }
  rk.profile = p;
  return absl::OkStatus();
}

absl::Status CudaEngine::Impl::Wait(CudaRankCtx& rk) {
#if VERIFYD_ENGINE_WITH_NCCL
  if (rk.comm) return rk.comm->Synchronize(rk.stream);
#endif
  return WaitStream(rk.stream, options.comm_timeout_ms);
}

absl::Status CudaEngine::Impl::Forward(CudaRankCtx& rk, const BatchPlan& plan, const PlanLayout& lay,
                                       bool want_logits) {
  const ModelConfig& c = config;
  const int64_t R = plan.total_rows, B = plan.batch;
  const int64_t hid = c.hidden_size, qk = c.qk_head_dim(), nope = c.qk_nope_head_dim;
  const int64_t rope = c.qk_rope_head_dim, v = c.v_head_dim, kvl = c.kv_lora_rank;
  const int64_t lat = c.latent_dim(), ql = c.q_lora_rank;
  const int64_t Hl = rk.heads.size, Il = rk.inter.size, Vl = rk.vocab.size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  void* s = rk.stream;
  rk.events_used = 0;
  Mark(rk, kCatOther);

  // Plan: one copy of the whole arena (grown when a step has more context slots).
  if (rk.plan_dev_bytes < lay.total) {
    if (rk.plan_dev != nullptr) {
      VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
      VERIFYD_CUDA_RETURN_IF_ERROR(cudaFree(rk.plan_dev));
      rk.allocs.erase(std::find(rk.allocs.begin(), rk.allocs.end(), rk.plan_dev));
      rk.plan_dev = nullptr;
    }
    absl::StatusOr<char*> p = rk.Alloc<char>(static_cast<int64_t>(lay.total * 5 / 4));
    if (!p.ok()) return p.status();
    rk.plan_dev = *p;
    rk.plan_dev_bytes = lay.total * 5 / 4;
  }
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(rk.plan_dev, plan_host, lay.total, cudaMemcpyHostToDevice, rk.stream));
  auto dev_i32 = [&](size_t off) { return reinterpret_cast<int32_t*>(rk.plan_dev + off); };
  const int32_t* d_tokens = dev_i32(lay.tokens);
  const int32_t* d_positions = dev_i32(lay.positions);
  const int32_t* d_slots = dev_i32(lay.slots);
  const int32_t* d_parents = dev_i32(lay.parents);
  const int32_t* d_q_indptr = dev_i32(lay.q_indptr);
  const int32_t* d_kv_indptr = dev_i32(lay.kv_indptr);
  const int32_t* d_kv_indices = dev_i32(lay.kv_indices);
  const uint64_t* d_mask = reinterpret_cast<const uint64_t*>(rk.plan_dev + lay.mask);

  // RoPE table for the step's positions: shared by every layer.
  {
    kc::RopeTableParams p;
    p.rows = static_cast<int>(R);
    p.rope_dim = static_cast<int>(rope);
    p.positions = d_positions;
    p.inv_freq = rk.inv_freq;
    p.cos_table = rk.cos_t;
    p.sin_table = rk.sin_t;
    p.stream = s;
    RETURN_IF_ERROR(kc::RopeTableCuda(p));
  }

  // Attention parameters shared by every layer (only kv changes).
  kernels::VerifyAttentionParams ap;
  ap.batch = static_cast<int>(B);
  ap.total_rows = static_cast<int>(R);
  ap.num_heads = static_cast<int>(Hl);
  ap.qk_dim = static_cast<int>(lat);
  ap.v_dim = static_cast<int>(kvl);
  ap.softmax_scale = 1.0f / std::sqrt(static_cast<float>(qk));
  ap.dtype = kernels::DType::kBFloat16;
  ap.q = rk.qatt;
  ap.num_slots = kv_capacity;
  ap.q_indptr = d_q_indptr;
  ap.kv_indptr = d_kv_indptr;
  ap.kv_indices = d_kv_indices;
  ap.tree_mask = d_mask;
  ap.mask_words = kMaskWords;
  ap.out = rk.olat;
  ap.stream = s;
  bool vk = false;
#if VERIFYD_ENGINE_HAS_VERIFY_KERNEL
  kc::VerifyAttentionPlan vk_plan;
  if (rk.have_vk) {
    ap.kv = rk.kv.empty() ? nullptr : rk.kv[0];
    if (kc::SupportsVerifyAttentionCuda(ap, rk.vk_info).ok()) {
      absl::StatusOr<kc::VerifyAttentionPlan> p = kc::PlanVerifyAttention(
          ap, plan.q_indptr.data(), plan.kv_indptr.data(), rk.vk_info, rk.vk_ws);
      if (!p.ok()) return p.status();
      vk_plan = std::move(*p);
      RETURN_IF_ERROR(kc::UploadVerifyAttentionPlan(vk_plan, rk.vk_ws, s));
      vk = true;
    }
  }
#endif

  {
    kc::EmbeddingGatherParams p;
    p.rows = static_cast<int>(R);
    p.hidden = hid;
    p.tokens = d_tokens;
    p.table = rk.embed;
    p.out = rk.x;
    p.stream = s;
    RETURN_IF_ERROR(kc::EmbeddingGatherCuda(p));
  }

  auto norm = [&](const void* x, kernels::DType xt, int64_t ldx, int64_t cols, const bf16* w,
                  void* y, kernels::DType yt, int64_t ldy) {
    kc::RmsNormParams p;
    p.rows = R;
    p.cols = cols;
    p.x = x;
    p.x_dtype = xt;
    p.ldx = ldx;
    p.weight = w;
    p.eps = eps;
    p.y = y;
    p.y_dtype = yt;
    p.ldy = ldy;
    p.stream = s;
    return kc::RmsNormCuda(p);
  };
  auto gemm = [&](const bf16* x, int64_t k, const bf16* w, int64_t n, void* y,
                  kernels::DType yt, float beta) {
    kc::GemmParams p;
    p.m = R;
    p.n = n;
    p.k = k;
    p.x = x;
    p.ldx = k;
    p.w = w;
    p.ldw = k;
    p.y = y;
    p.ldy = n;
    p.y_dtype = yt;
    p.beta = beta;
    return kc::GemmBf16(rk.cublas, p);
  };
  // x += AllReduce(part) (TP > 1); at TP = 1 the GEMM accumulated into x already.
  auto reduce_into_x = [&]() -> absl::Status {
    if (tp == 1) return absl::OkStatus();
#if VERIFYD_ENGINE_WITH_NCCL
    Mark(rk, kCatComm);
    RETURN_IF_ERROR(rk.comm->AllReduceSum(rk.part, R * hid, kernels::DType::kFloat32, s));
    Mark(rk, kCatOther);
    return kc::AddInPlaceCuda(rk.x, rk.part, R * hid, s);
#else
    return absl::UnimplementedError("tp > 1 needs NCCL");
#endif
  };
  constexpr auto F32 = kernels::DType::kFloat32;
  constexpr auto BF16 = kernels::DType::kBFloat16;

  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const CudaRankCtx::Layer& L = rk.layers[l];
    Mark(rk, kCatOther);
    RETURN_IF_ERROR(norm(rk.x, F32, hid, hid, L.input_norm, rk.xn, BF16, hid));
    Mark(rk, kCatGemm);
    if (ql > 0) {
      RETURN_IF_ERROR(gemm(rk.xn, hid, L.q_a, ql, rk.qa, F32, 0.f));
      Mark(rk, kCatOther);
      RETURN_IF_ERROR(norm(rk.qa, F32, ql, ql, L.q_a_norm, rk.qan, BF16, ql));
      Mark(rk, kCatGemm);
      RETURN_IF_ERROR(gemm(rk.qan, ql, L.q_b, Hl * qk, rk.q, BF16, 0.f));
    } else {
      RETURN_IF_ERROR(gemm(rk.xn, hid, L.q_b, Hl * qk, rk.q, BF16, 0.f));
    }
    RETURN_IF_ERROR(gemm(rk.xn, hid, L.kv_a, lat, rk.kva, F32, 0.f));
    // Absorbed query, latent part: qatt[r, h, 0:kvl] = q_nope[r, h] . W_UK[h] ([nope, kvl]).
    {
      kc::BatchedGemmParams p;
      p.batch = static_cast<int>(Hl);
      p.m = R;
      p.n = kvl;
      p.k = nope;
      p.x = rk.q;
      p.ldx = Hl * qk;
      p.stride_x = qk;
      p.w = L.kv_b;
      p.ldw = kvl;
      p.stride_w = (nope + v) * kvl;
      p.w_transposed = false;
      p.y = rk.qatt;
      p.ldy = Hl * lat;
      p.stride_y = lat;
      RETURN_IF_ERROR(kc::GemmBf16Batched(rk.cublas, p));
    }
    Mark(rk, kCatOther);
    {
      kc::LatentKvWriteParams p;
      p.rows = static_cast<int>(R);
      p.kv_lora = static_cast<int>(kvl);
      p.rope_dim = static_cast<int>(rope);
      p.kva = rk.kva;
      p.ld_kva = lat;
      p.kv_norm_weight = L.kv_a_norm;
      p.eps = eps;
      p.cos_table = rk.cos_t;
      p.sin_table = rk.sin_t;
      p.slots = d_slots;
      p.cache = rk.kv[l];
      p.num_slots = kv_capacity;
      p.stream = s;
      RETURN_IF_ERROR(kc::LatentKvWriteCuda(p));
    }
    {
      kc::QRopeParams p;
      p.rows = static_cast<int>(R);
      p.heads = static_cast<int>(Hl);
      p.rope_dim = static_cast<int>(rope);
      p.in = rk.q;
      p.in_head_stride = qk;
      p.in_offset = nope;
      p.out = rk.qatt;
      p.out_head_stride = lat;
      p.out_offset = kvl;
      p.cos_table = rk.cos_t;
      p.sin_table = rk.sin_t;
      p.stream = s;
      RETURN_IF_ERROR(kc::QRopeCuda(p));
    }
    Mark(rk, kCatAttention);
    ap.kv = rk.kv[l];
#if VERIFYD_ENGINE_HAS_VERIFY_KERNEL
    if (vk) {
      RETURN_IF_ERROR(kc::VerifyAttentionCuda(ap, vk_plan, rk.vk_ws));
    } else {
      RETURN_IF_ERROR(cuda::FallbackVerifyAttentionCuda(ap));
    }
#else
    RETURN_IF_ERROR(cuda::FallbackVerifyAttentionCuda(ap));
#endif
    Mark(rk, kCatGemm);
    // attn[r, h*v : (h+1)*v] = olat[r, h] . W_UV[h]^T (W_UV[h] [v, kvl]).
    {
      kc::BatchedGemmParams p;
      p.batch = static_cast<int>(Hl);
      p.m = R;
      p.n = v;
      p.k = kvl;
      p.x = rk.olat;
      p.ldx = Hl * kvl;
      p.stride_x = kvl;
      p.w = L.kv_b + nope * kvl;
      p.ldw = kvl;
      p.stride_w = (nope + v) * kvl;
      p.w_transposed = true;
      p.y = rk.attn;
      p.ldy = Hl * v;
      p.stride_y = v;
      RETURN_IF_ERROR(kc::GemmBf16Batched(rk.cublas, p));
    }
    RETURN_IF_ERROR(gemm(rk.attn, Hl * v, L.o_proj, hid, tp == 1 ? rk.x : rk.part, F32,
                         tp == 1 ? 1.f : 0.f));
    RETURN_IF_ERROR(reduce_into_x());
    Mark(rk, kCatOther);
    RETURN_IF_ERROR(norm(rk.x, F32, hid, hid, L.post_norm, rk.xn, BF16, hid));
    if (Il > 0) {
      Mark(rk, kCatGemm);
      RETURN_IF_ERROR(gemm(rk.xn, hid, L.gate_up, 2 * Il, rk.gu, F32, 0.f));
      Mark(rk, kCatOther);
      kc::SwiGluParams p;
      p.rows = static_cast<int>(R);
      p.n = Il;
      p.gate_up = rk.gu;
      p.ld_in = 2 * Il;
      p.up_offset = Il;
      p.out = rk.act;
      p.ld_out = Il;
      p.stream = s;
      RETURN_IF_ERROR(kc::SwiGluCuda(p));
      Mark(rk, kCatGemm);
      RETURN_IF_ERROR(gemm(rk.act, Il, L.down, hid, tp == 1 ? rk.x : rk.part, F32,
                           tp == 1 ? 1.f : 0.f));
    } else if (tp > 1) {
      VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(rk.part, 0, R * hid * sizeof(float), rk.stream));
    }
    RETURN_IF_ERROR(reduce_into_x());
  }

  // LM head on the local vocab rows and the vocab-parallel argmax.
  Mark(rk, kCatOther);
  RETURN_IF_ERROR(norm(rk.x, F32, hid, hid, rk.final_norm, rk.xn, BF16, hid));
  if (Vl > 0) {
    Mark(rk, kCatGemm);
    kc::GemmParams p;
    p.m = R;
    p.n = Vl;
    p.k = hid;
    p.x = rk.xn;
    p.ldx = hid;
    p.w = rk.lm_head;
    p.ldw = hid;
    p.y = rk.logits;
    p.ldy = rk.vmax;
    p.y_dtype = F32;
    RETURN_IF_ERROR(kc::GemmBf16(rk.cublas, p));
  }
  Mark(rk, kCatOther);
  {
    kc::ArgmaxRowsParams p;
    p.rows = static_cast<int>(R);
    p.n = Vl;
    p.logits = rk.logits;
    p.ld = rk.vmax;
    p.index_offset = rk.vocab.begin;
    p.out = rk.pairs;
    p.stream = s;
    RETURN_IF_ERROR(kc::ArgmaxRowsCuda(p));
  }
  const kc::ArgmaxPair* cand = rk.pairs;
#if VERIFYD_ENGINE_WITH_NCCL
  if (tp > 1) {
    Mark(rk, kCatComm);
    RETURN_IF_ERROR(rk.comm->AllGather(rk.pairs, rk.gathered, R * sizeof(kc::ArgmaxPair), s));
    cand = rk.gathered;
    Mark(rk, kCatOther);
  }
#endif
  {
    kc::ArgmaxCombineParams p;
    p.rows = static_cast<int>(R);
    p.world = tp;
    p.gathered = cand;
    p.predictions = rk.preds;
    p.stream = s;
    RETURN_IF_ERROR(kc::ArgmaxCombineCuda(p));
  }
  if (want_logits && tp > 1) {
#if VERIFYD_ENGINE_WITH_NCCL
    if (rk.logits_gathered == nullptr) {
      absl::StatusOr<float*> g = rk.Alloc<float>(static_cast<int64_t>(tp) * max_rows * rk.vmax);
      if (!g.ok()) return g.status();
      rk.logits_gathered = *g;
    }
    RETURN_IF_ERROR(rk.comm->AllGather(rk.logits, rk.logits_gathered,
                                       R * rk.vmax * sizeof(float), s));
#endif
  }
  // Acceptance and the kept / freed slot lists, once, on rank 0; one copy out.
  if (rk.rank == 0) {
    kernels::TreeAcceptParams p;
    p.batch = static_cast<int>(B);
    p.row_indptr = d_q_indptr;
    p.tokens = d_tokens;
    p.parents = d_parents;
    p.predictions = rk.preds;
    p.tail_slots = d_slots;
    p.accepted = rk.accepted;
    p.num_accepted = rk.num_accepted;
    p.bonus = rk.bonus;
    p.kept_slots = rk.kept;
    p.freed_slots = rk.freed;
    p.stream = s;
#if VERIFYD_ENGINE_HAS_VERIFY_KERNEL
    RETURN_IF_ERROR(kc::TreeAcceptCuda(p));  // kernels/cuda (tested against the reference)
#else
    RETURN_IF_ERROR(cuda::TreeAcceptCuda(p));  // the engine's own copy of the rule
#endif
    int32_t* h = reinterpret_cast<int32_t*>(rk.out_host);
    const size_t rb = R * sizeof(int32_t), bb = B * sizeof(int32_t);
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h, rk.preds, rb, cudaMemcpyDeviceToHost, rk.stream));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + R, rk.accepted, rb, cudaMemcpyDeviceToHost, rk.stream));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + 2 * R, rk.kept, rb, cudaMemcpyDeviceToHost, rk.stream));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + 3 * R, rk.freed, rb, cudaMemcpyDeviceToHost, rk.stream));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + 4 * R, rk.num_accepted, bb, cudaMemcpyDeviceToHost, rk.stream));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(h + 4 * R + B, rk.bonus, bb, cudaMemcpyDeviceToHost, rk.stream));
  }
  Mark(rk, kCatOther);
  RETURN_IF_ERROR(Wait(rk));
  if (options.profile && rk.rank == 0) RETURN_IF_ERROR(CollectProfile(rk));
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------------------
// Step.

absl::StatusOr<std::vector<StepResult>> CudaEngine::Impl::RunStep(
    const std::vector<StepRequest>& batch, std::vector<float>* logits, StepTiming* timing) {
  std::lock_guard<std::mutex> step_lock(step_mu);
  const auto t0 = Clock::now();
  if (failed.load()) return absl::UnavailableError("cuda engine: a rank failed earlier");
  absl::StatusOr<BatchPlan> planned =
      BuildBatchPlan(batch, config, limits, kv_capacity, /*with_kv_indices=*/false);
  if (!planned.ok()) return planned.status();
  // Shared with the rank jobs by value: a rank that outlives a timed-out step still reads a
  // live plan.
  auto shared_plan = std::make_shared<const BatchPlan>(std::move(*planned));
  const BatchPlan& plan = *shared_plan;
  if (plan.total_rows == 0) {
    if (logits) logits->clear();
    return std::vector<StepResult>{};
  }
  const int64_t R = plan.total_rows, B = plan.batch;
  const PlanLayout lay =
      PlanLayout::For(R, B, static_cast<int64_t>(plan.kv_indptr.back()));
  if (plan_host_bytes < lay.total) {
    if (plan_host != nullptr) cudaFreeHost(plan_host);
    plan_host = nullptr;
    plan_host_bytes = 0;
    void* h = nullptr;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h, lay.total * 5 / 4));
    plan_host = static_cast<char*>(h);
    plan_host_bytes = lay.total * 5 / 4;
  }
  auto put = [&](size_t off, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(plan_host + off, src, bytes);
  };
  put(lay.mask, plan.tree_mask.data(), plan.tree_mask.size() * sizeof(uint64_t));
  put(lay.tokens, plan.tokens.data(), R * 4);
  put(lay.positions, plan.positions.data(), R * 4);
  put(lay.slots, plan.tail_slots.data(), R * 4);
  put(lay.parents, plan.parents.data(), R * 4);
  put(lay.q_indptr, plan.q_indptr.data(), (B + 1) * 4);
  put(lay.kv_indptr, plan.kv_indptr.data(), (B + 1) * 4);
  // Slot lists straight from the requests into the pinned buffer (the plan holds only their
  // offsets): context slots then tail slots, per request.
  {
    size_t off = lay.kv_indices;
    for (const StepRequest& q : batch) {
      put(off, q.context_slots.data(), q.context_slots.size() * 4);
      off += q.context_slots.size() * 4;
      put(off, q.tail_slots.data(), q.tail_slots.size() * 4);
      off += q.tail_slots.size() * 4;
    }
  }

  const int64_t step_no = step_index++;
  const bool want_logits = logits != nullptr;
  std::string failure;
  absl::Status st = RunOnRanks(
      [this, shared_plan, lay, step_no, want_logits](CudaRankCtx& rk) -> absl::Status {
        if (options.fault_hook) RETURN_IF_ERROR(options.fault_hook(rk.rank, step_no));
        return Forward(rk, *shared_plan, lay, want_logits);
      },
      &failure);
  if (!st.ok()) {
    failed.store(true);
#if VERIFYD_ENGINE_WITH_NCCL
    for (auto& r : ranks) {
      if (r->comm) r->comm->Abort();
    }
#endif
    return absl::UnavailableError(absl::StrCat("cuda engine step failed: ", failure));
  }

  CudaRankCtx& r0 = *ranks[0];
  const int32_t* h = reinterpret_cast<const int32_t*>(r0.out_host);
  const int32_t* preds = h;
  const int32_t* accepted = h + R;
  const int32_t* kept = h + 2 * R;
  const int32_t* freed = h + 3 * R;
  const int32_t* num_acc = h + 4 * R;
  const int32_t* bonus = h + 4 * R + B;
  for (int64_t r = 0; r < R; ++r) {
    if (preds[r] < 0) {
      return absl::InternalError(absl::StrCat("cuda forward: row ", r, " has no finite logit"));
    }
  }
  std::vector<StepResult> results(batch.size());
  for (int64_t b = 0; b < B; ++b) {
    const int32_t row0 = plan.q_indptr[b], n = plan.q_indptr[b + 1] - row0;
    StepResult& res = results[b];
    res.predictions.assign(preds + row0, preds + row0 + n);
    if (!batch[b].accept) {
      // Prefill chunk: every row is committed; bonus = the prediction after the last row.
      res.bonus = res.predictions.back();
      res.kept_slots = batch[b].tail_slots;
      continue;
    }
    const int32_t na = num_acc[b];
    res.accepted_rows.assign(accepted + row0, accepted + row0 + na);
    res.bonus = bonus[b];
    res.kept_slots.assign(kept + row0, kept + row0 + 1 + na);
    res.freed_slots.assign(freed + row0, freed + row0 + (n - 1 - na));
  }
  if (want_logits) {
    // [world, R, Vmax] (TP > 1, gathered on every rank) or [R, Vmax] -> [R, vocab].
    const int64_t V = config.vocab_size, vmax = r0.vmax;
    std::vector<float> raw(static_cast<size_t>(tp) * R * vmax);
    const float* src = tp > 1 ? r0.logits_gathered : r0.logits;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaSetDevice(r0.device));
    VERIFYD_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(raw.data(), src, raw.size() * sizeof(float), cudaMemcpyDeviceToHost));
    logits->assign(R * V, 0.f);
    for (int k = 0; k < tp; ++k) {
      const ShardRange vr = VocabShard(V, tp, k);
      for (int64_t r = 0; r < R; ++r) {
        std::memcpy(logits->data() + r * V + vr.begin, raw.data() + (k * R + r) * vmax,
                    vr.size * sizeof(float));
      }
    }
  }
  if (timing) {
    timing->per_rank_s.clear();
    for (const auto& r : ranks) timing->per_rank_s.push_back(r->seconds);
    timing->total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  return results;
}

// ------------------------------------------------------------------------------------------
// Public API.

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  return n;
}

bool CudaDevicesAvailable() { return CudaDeviceCount() > 0; }

CudaEngine::CudaEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaEngine::~CudaEngine() = default;

const ModelConfig& CudaEngine::config() const { return impl_->config; }
int CudaEngine::tp_size() const { return impl_->tp; }
int64_t CudaEngine::kv_capacity() const { return impl_->kv_capacity; }
EngineLimits CudaEngine::limits() const { return impl_->limits; }
bool CudaEngine::failed() const { return impl_->failed.load(); }

absl::StatusOr<std::vector<StepResult>> CudaEngine::Step(const std::vector<StepRequest>& batch,
                                                         StepTiming* timing) {
  return impl_->RunStep(batch, nullptr, timing);
}

absl::StatusOr<std::vector<StepResult>> CudaEngine::StepWithLogits(
    const std::vector<StepRequest>& batch, std::vector<float>* logits, StepTiming* timing) {
  if (logits == nullptr) return absl::InvalidArgumentError("logits must not be null");
  return impl_->RunStep(batch, logits, timing);
}

void CudaEngine::set_profile(bool on) {
  std::lock_guard<std::mutex> lock(impl_->step_mu);
  impl_->options.profile = on;
}

CudaStepProfile CudaEngine::last_profile() const {
  std::lock_guard<std::mutex> lock(impl_->step_mu);
  return impl_->ranks.empty() ? CudaStepProfile{} : impl_->ranks[0]->profile;
}

absl::StatusOr<std::vector<float>> CudaEngine::LatentRow(int rank, int64_t layer, int32_t slot) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> step_lock(m.step_mu);
  if (rank < 0 || rank >= m.tp) return absl::InvalidArgumentError("rank out of range");
  if (layer < 0 || layer >= m.config.num_hidden_layers) return absl::InvalidArgumentError("layer out of range");
  if (slot < 0 || slot >= m.kv_capacity) return absl::InvalidArgumentError("slot out of range");
  const int64_t lat = m.config.latent_dim();
  std::vector<bf16> raw(lat);
  std::string failure;
  absl::Status st = m.RunOnRanks(
      [&](CudaRankCtx& rk) -> absl::Status {
        if (rk.rank != rank) return absl::OkStatus();
        VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpy(raw.data(), rk.kv[layer] + int64_t{slot} * lat,
                                                lat * sizeof(bf16), cudaMemcpyDeviceToHost));
        return absl::OkStatus();
      },
      &failure);
  if (!st.ok()) return st;
  std::vector<float> out(lat);
  for (int64_t i = 0; i < lat; ++i) out[i] = kernels::Bf16ToFloat(raw[i]);
  return out;
}

absl::Status CudaEngine::FillLatentCacheRandom(uint64_t seed) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> step_lock(m.step_mu);
  if (m.failed.load()) return absl::UnavailableError("cuda engine: a rank failed earlier");
  const int64_t lat = m.config.latent_dim();
  std::string failure;
  return m.RunOnRanks(
      [&](CudaRankCtx& rk) -> absl::Status {
        for (size_t l = 0; l < rk.kv.size(); ++l) {
          kc::GenerateWeightsParams g;
          // Same values on every rank (each keeps the full latent cache).
          g.tensor_key = WeightTensorKey(seed, WeightNameHash(absl::StrCat("kv_pool.", l)));
          g.scale = 1.0f;
          g.rows = m.kv_capacity;
          g.cols = lat;
          g.full_cols = lat;
          g.out = rk.kv[l];
          g.ld_out = lat;
          g.stream = rk.stream;
          RETURN_IF_ERROR(kc::GenerateWeightsCuda(g));
        }
        VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
        return absl::OkStatus();
      },
      &failure);
}

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(const CudaEngineOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (o.tp < 1) return bad("tp: ", o.tp, " must be >= 1");
  if (o.max_batch < 1) return bad("max_batch: ", o.max_batch, " must be >= 1");
  if (o.max_tail_rows < 1 || o.max_tail_rows > kernels::kMaxTailRows) {
    return bad("max_tail_rows: ", o.max_tail_rows, " must be in [1, ", kernels::kMaxTailRows, "]");
  }
  if (o.max_context < 0) return bad("max_context: ", o.max_context, " must be >= 0");
  if (o.kv_capacity < 0 || o.kv_capacity > INT32_MAX) return bad("kv_capacity: ", o.kv_capacity, " out of range");
  if (o.kv_capacity == 0 && !(o.kv_memory_fraction > 0 && o.kv_memory_fraction < 1)) {
    return bad("kv_memory_fraction: ", o.kv_memory_fraction, " must be in (0, 1)");
  }
  if (o.comm_timeout_ms <= 0) return bad("comm_timeout_ms must be > 0");
  const int ndev = CudaDeviceCount();
  if (ndev == 0) return absl::FailedPreconditionError("cuda engine: no CUDA device is visible");
  std::vector<int> devices = o.devices;
  if (devices.empty()) {
    for (int r = 0; r < o.tp; ++r) devices.push_back(r);
  }
  if (static_cast<int>(devices.size()) != o.tp) {
    return bad("devices: ", devices.size(), " entries for tp ", o.tp);
  }
  for (int d : devices) {
    if (d < 0 || d >= ndev) return bad("devices: device ", d, " is not in [0, ", ndev, ")");
  }
#if !VERIFYD_ENGINE_WITH_NCCL
  if (o.tp > 1) return absl::UnimplementedError("tp > 1 needs a build with NCCL");
#endif

  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.options = o;
  m.tp = o.tp;
  // The model.
  if (o.weights) {
    m.host_weights = o.weights;
    m.config = o.weights->config;
    RETURN_IF_ERROR(ValidateModelWeights(*o.weights));
  } else if (o.config) {
    m.config = *o.config;
  } else {
    absl::StatusOr<ModelConfig> preset = PresetConfig(o.model, o.preset_layers);
    if (preset.ok()) {
      m.config = *preset;
    } else if (preset.status().code() != absl::StatusCode::kNotFound) {
      return preset.status();
    } else {
      std::error_code ec;
      if (!std::filesystem::is_directory(o.model, ec)) {
        return bad("model: '", o.model, "' is neither a preset (", absl::StrJoin(PresetNames(), ", "),
                   ") nor a checkpoint directory");
      }
      absl::StatusOr<ModelWeights> w = LoadModelFromDirectory(o.model);
      if (!w.ok()) return w.status();
      RETURN_IF_ERROR(ValidateModelWeights(*w));
      m.config = w->config;
      m.host_weights = std::make_shared<const ModelWeights>(std::move(*w));
    }
  }
  RETURN_IF_ERROR(ValidateModelConfig(m.config));
  RETURN_IF_ERROR(ValidateTpSize(m.config, o.tp));
  if (m.config.qk_rope_head_dim % 2 != 0) return bad("qk_rope_head_dim must be even");
  for (const TensorSpec& s : ModelTensorSpecs(m.config)) m.specs[s.name] = s;
  m.limits.max_batch = o.max_batch;
  m.limits.max_tail_rows = o.max_tail_rows;
  m.limits.max_context = o.max_context == 0
                             ? m.config.max_position_embeddings
                             : std::min(o.max_context, m.config.max_position_embeddings);
  m.max_rows = static_cast<int64_t>(o.max_batch) * o.max_tail_rows;
#if VERIFYD_ENGINE_HAS_VERIFY_KERNEL
  m.use_vk = o.use_verify_kernel;
#endif
#if VERIFYD_ENGINE_WITH_NCCL
  if (o.tp > 1) {
    absl::StatusOr<std::string> id = NcclCommunicator::NewUniqueId();
    if (!id.ok()) return id.status();
    m.nccl_id = *id;
    m.nccl_group = std::make_shared<NcclGroupState>();
  }
#endif
  for (int r = 0; r < o.tp; ++r) {
    auto rk = std::make_unique<CudaRankCtx>();
    rk->rank = r;
    rk->device = devices[r];
    rk->world = o.tp;
    m.ranks.push_back(std::move(rk));
  }
  for (int r = 0; r < o.tp; ++r) m.threads.emplace_back([&m, r] { m.RankLoop(r); });

  // Phase 1: devices, communicators, weights, buffers; phase 2: the KV pool, sized from the
  // smallest free memory over the ranks.
  std::string failure;
  absl::Status st = m.RunOnRanks([&m](CudaRankCtx& rk) { return m.InitRank(rk); }, &failure);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("cuda engine init: ", failure));
  }
  if (o.kv_capacity > 0) {
    m.kv_capacity = o.kv_capacity;
  } else {
    size_t free_min = std::numeric_limits<size_t>::max();
    for (const auto& r : m.ranks) free_min = std::min(free_min, r->free_bytes);
    const double per_slot = static_cast<double>(m.config.num_hidden_layers) *
                            m.config.latent_dim() * sizeof(bf16);
    m.kv_capacity = std::min<int64_t>(
        INT32_MAX, static_cast<int64_t>(o.kv_memory_fraction * free_min / per_slot));
    if (m.kv_capacity < 1) {
      return absl::ResourceExhaustedError("cuda engine: no device memory left for the KV pool");
    }
  }
  st = m.RunOnRanks([&m](CudaRankCtx& rk) { return m.AllocKv(rk); }, &failure);
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat("cuda engine init: ", failure));
  return std::unique_ptr<CudaEngine>(new CudaEngine(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Engine>> CreateCudaEngine(const CudaEngineOptions& options) {
  absl::StatusOr<std::unique_ptr<CudaEngine>> e = CudaEngine::Create(options);
  if (!e.ok()) return e.status();
  return std::unique_ptr<Engine>(std::move(*e));
}

}  // namespace verifyd::tp
