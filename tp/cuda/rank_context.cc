// The CUDA engine's per-rank device state (see rank_context.h).
#include "tp/cuda/rank_context.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string_view>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/dense/gemm.h"
#include "kernels/cuda/dense/moe.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/cuda/dense/weight_gen.h"
#include "kernels/kv_fp8.h"
#include "kernels/reference/yarn.h"
#include "kernels/status.h"
#include "kernels/weight_init.h"

namespace verifyd::tp {
namespace {

namespace kc = kernels::cuda;
using bf16 = kernels::bf16_bits;
using Clock = std::chrono::steady_clock;

// Waits for a stream with a deadline (TP = 1 has no communicator to poll).
absl::Status WaitStream(cudaStream_t s, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (int it = 0;; ++it) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      return absl::UnavailableError(
          absl::StrCat("stream failed: ", cudaGetErrorName(e), " ", cudaGetErrorString(e)));
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

// Largest host staging buffer of one upload: a bigger block goes up in chunks of rows.
constexpr int64_t kStagingBytes = int64_t{64} << 20;

// The next pinned staging buffer (CudaRankContext::UploadStaging) with room for `bytes`, once
// its previous copy has finished: the caller fills it while the other buffer's copy runs.
absl::StatusOr<char*> AcquireStaging(CudaRankContext& rk, size_t bytes) {
  CudaRankContext::UploadStaging& st = rk.staging;
  const int i = st.next;
  if (st.done[i] == nullptr) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&st.done[i], cudaEventDisableTiming));
  } else {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(st.done[i]));
  }
  if (st.bytes[i] < bytes) {
    if (st.buf[i] != nullptr) VERIFYD_CUDA_RETURN_IF_ERROR(cudaFreeHost(st.buf[i]));
    st.buf[i] = nullptr;
    st.bytes[i] = 0;
    void* h = nullptr;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h, bytes));
    st.buf[i] = static_cast<char*>(h);
    st.bytes[i] = bytes;
  }
  return st.buf[i];
}

// After the copies out of the buffer AcquireStaging gave were enqueued: records its event
// (it is reused once they finish) and turns to the other buffer.
absl::Status ReleaseStaging(CudaRankContext& rk) {
  CudaRankContext::UploadStaging& st = rk.staging;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventRecord(st.done[st.next], rk.stream));
  st.next ^= 1;
  return absl::OkStatus();
}

// Drains the stream and frees the staging buffers and events.
absl::Status FreeStaging(CudaRankContext& rk) {
  const cudaError_t sync = rk.stream != nullptr ? cudaStreamSynchronize(rk.stream) : cudaSuccess;
  CudaRankContext::UploadStaging& st = rk.staging;
  for (int i = 0; i < 2; ++i) {
    if (st.buf[i] != nullptr) cudaFreeHost(st.buf[i]);
    if (st.done[i] != nullptr) cudaEventDestroy(st.done[i]);
  }
  st = CudaRankContext::UploadStaging{};
  VERIFYD_CUDA_RETURN_IF_ERROR(sync);
  return absl::OkStatus();
}

// Copies the block [row0, +rows) x [col0, +cols) of tensor `name` from the source to dst
// [rows, cols] through a host staging buffer of at most kStagingBytes (at least one row):
// read(r0, n, out) fills rows [r0, r0 + n) of the block into out, every value must pass
// finite(v) (else InvalidArgument naming the tensor, its file and the element).
template <typename T, typename ReadFn, typename FiniteFn>
absl::Status UploadFromSource(const tp::WeightSource& source, CudaRankContext& rk,
                              const std::string& name, T* dst, int64_t rows, int64_t cols,
                              int64_t row0, int64_t col0, ReadFn read, FiniteFn finite) {
  const int64_t chunk = std::clamp<int64_t>(kStagingBytes / (cols * int64_t{sizeof(T)}), 1, rows);
  for (int64_t r = 0; r < rows; r += chunk) {
    const int64_t n = std::min(chunk, rows - r);
    VERIFYD_ASSIGN_OR_RETURN(char* buf, AcquireStaging(rk, chunk * cols * sizeof(T)));
    T* staging = reinterpret_cast<T*>(buf);
    VERIFYD_RETURN_IF_ERROR(read(row0 + r, n, staging));
    for (int64_t i = 0; i < n * cols; ++i) {
      if (!finite(staging[i])) {
        const std::string where = source.Location(name);
        return absl::InvalidArgumentError(
            absl::StrCat(where.empty() ? "" : where + ": ", "tensor '", name, "' element [",
                         row0 + r + i / cols, ", ", col0 + i % cols, "] is not finite"));
      }
    }
    // Asynchronous from pinned memory: the next block is read into the other buffer meanwhile.
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst + r * cols, staging,
                                                 static_cast<size_t>(n * cols) * sizeof(T),
                                                 cudaMemcpyHostToDevice, rk.stream));
    VERIFYD_RETURN_IF_ERROR(ReleaseStaging(rk));
  }
  return absl::OkStatus();
}

// Fills dst [rows, cols] (bf16) with the block [row0, +rows) x [col0, +cols) of tensor
// `name`: generated on the device from its spec and the seed, or read from the host source
// (ReadBlockBf16) through a staging buffer of at most kStagingBytes.
absl::Status FillTensor(const RankWeightInit& source, CudaRankContext& rk, const std::string& name,
                        bf16* dst, int64_t rows, int64_t cols, int64_t row0, int64_t col0) {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (source.host == nullptr) {
    auto it = source.specs->find(name);
    if (it == source.specs->end()) {
      return absl::InternalError(absl::StrCat("no spec for tensor ", name));
    }
    const TensorSpec& s = it->second;
    const int64_t full_cols = s.shape.size() > 1 ? s.shape[1] : s.shape[0];
    kc::GenerateWeightsParams g;
    g.tensor_key = kernels::WeightTensorKey(source.seed, kernels::WeightNameHash(name));
    g.scale = s.init_scale;
    g.offset = s.init_offset;
    g.rows = rows;
    g.cols = cols;
    g.full_cols = full_cols;
    g.row0 = row0;
    g.col0 = col0;
    g.out = dst;
    g.ld_out = cols;
    if (source.StoredAsFp8(name)) g.fp8_scale = kernels::WeightFp8Scale(s.init_scale);
    g.stream = rk.stream;
    return kc::GenerateWeightsCuda(g);
  }
  // FP8 checkpoints are read as bf16 too: ReadBlockBf16 dequantizes on the host, block by
  // block (fp8 x scale_inv in float32, rounded to bf16 once).
  return UploadFromSource<bf16>(
      *source.host, rk, name, dst, rows, cols, row0, col0,
      [&](int64_t r0, int64_t n, bf16* out) {
        return source.host->ReadBlockBf16(name, r0, n, col0, cols, out);
      },
      [](bf16 x) { return (x & 0x7f80) != 0x7f80; });
}

// Fills dst [rows, cols] (fp32) with the block [row0, +rows) x [col0, +cols) of tensor
// `name`: the host weights' float values as they are (the MoE router and its correction bias,
// which checkpoints keep in fp32 / bf16), else FillTensor's bf16 values widened (exact).
absl::Status FillTensorF32(const RankWeightInit& source, CudaRankContext& rk,
                           const std::string& name, float* dst, int64_t rows, int64_t cols,
                           int64_t row0, int64_t col0) {
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (source.host != nullptr) {
    return UploadFromSource<float>(
        *source.host, rk, name, dst, rows, cols, row0, col0,
        [&](int64_t r0, int64_t n, float* out) {
          return source.host->ReadBlock(name, r0, n, col0, cols, out);
        },
        [](float x) { return std::isfinite(x); });
  }
  void* tmp = nullptr;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMalloc(&tmp, rows * cols * sizeof(bf16)));
  absl::Status st = FillTensor(source, rk, name, static_cast<bf16*>(tmp), rows, cols, row0, col0);
  if (st.ok()) st = kc::Bf16ToFloatCuda(static_cast<bf16*>(tmp), dst, rows * cols, rk.stream);
  const cudaError_t sync = cudaStreamSynchronize(rk.stream);
  cudaFree(tmp);
  VERIFYD_RETURN_IF_ERROR(st);
  VERIFYD_CUDA_RETURN_IF_ERROR(sync);
  return absl::OkStatus();
}

// Fills dst [rows, cols] (e4m3 bytes) and scale [ceil(rows / 128), cols / 128] (row stride
// scale_ld, default cols / 128: cuBLASLt's padded rows, fp8_gemm.h) with the block
// [row0, +rows) x [col0, +cols) of an FP8-stored tensor as stored (ReadBlockFp8: rows may end
// in a partial block at the tensor's last row), whole 128-row blocks at a time through a host
// staging buffer. Every scale must be finite and positive and no byte a NaN code (0x7f /
// 0xff), else InvalidArgument naming the tensor and its file.
absl::Status FillTensorFp8(const RankWeightInit& source, CudaRankContext& rk,
                           const std::string& name, uint8_t* dst, float* scale, int64_t rows,
                           int64_t cols, int64_t row0, int64_t col0, int64_t scale_ld = 0) {
  if (scale_ld == 0) scale_ld = cols / 128;
  if (source.host == nullptr) {
    auto it = source.specs->find(name);
    if (it == source.specs->end()) {
      return absl::InternalError(absl::StrCat("no spec for tensor ", name));
    }
    kc::GenerateFp8WeightsParams g;
    g.tensor_key = kernels::WeightTensorKey(source.seed, kernels::WeightNameHash(name));
    g.fp8_scale = kernels::WeightFp8Scale(it->second.init_scale);
    g.rows = rows;
    g.cols = cols;
    g.full_cols = it->second.shape.size() > 1 ? it->second.shape[1] : it->second.shape[0];
    g.row0 = row0;
    g.col0 = col0;
    g.out = dst;
    g.ld_out = cols;
    g.scales = scale;
    g.scale_ld = scale_ld;
    g.stream = rk.stream;
    return kc::GenerateFp8WeightsCuda(g);
  }
  const tp::WeightSource& src = *source.host;
  // A multiple of 128 rows (every chunk but the last starts and ends on a block boundary).
  const int64_t chunk = std::min(std::max<int64_t>(kStagingBytes / cols / 128 * 128, 128), rows);
  // One pinned buffer holds the block's bytes, then (16-byte aligned) its scales.
  const int64_t bytes_size = (chunk * cols + 15) / 16 * 16;
  const int64_t scales_size = (chunk + 127) / 128 * (cols / 128) * int64_t{sizeof(float)};
  for (int64_t r = 0; r < rows; r += chunk) {
    const int64_t n = std::min(chunk, rows - r), nb = (n + 127) / 128;
    VERIFYD_ASSIGN_OR_RETURN(char* buf, AcquireStaging(rk, bytes_size + scales_size));
    uint8_t* bytes = reinterpret_cast<uint8_t*>(buf);
    float* sc = reinterpret_cast<float*>(buf + bytes_size);
    VERIFYD_RETURN_IF_ERROR(src.ReadBlockFp8(name, row0 + r, n, col0, cols, bytes, sc));
    // (ReadBlockFp8 refuses NaN codes, naming the element.)
    const std::string where = src.Location(name);
    for (int64_t i = 0; i < nb * (cols / 128); ++i) {
      if (!(std::isfinite(sc[i]) && sc[i] > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(where.empty() ? "" : where + ": ",
                                                       "tensor '", name, "_scale_inv' has ", sc[i],
                                                       " (not a finite positive scale)"));
      }
    }
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        dst + r * cols, bytes, static_cast<size_t>(n * cols), cudaMemcpyHostToDevice, rk.stream));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        scale + r / 128 * scale_ld, scale_ld * sizeof(float), sc, (cols / 128) * sizeof(float),
        (cols / 128) * sizeof(float), nb, cudaMemcpyHostToDevice, rk.stream));
    VERIFYD_RETURN_IF_ERROR(ReleaseStaging(rk));
  }
  return absl::OkStatus();
}

// The row stride of a one-group FP8 linear's weight scales for depth k: cuBLASLt's padded
// rows when the rank runs them through cuBLASLt (fp8_gemm.h), else k / 128.
int64_t LinearScaleLd(const CudaRankContext& rk, int64_t k) {
  return rk.fp8_lt != nullptr ? kc::Fp8LtScaleLd(k) : k / 128;
}

// A SwiGLU MLP's weights kept in FP8 (prefix: "model.layers.{l}.mlp.", its
// "shared_experts." or "experts.{e}."): the rank's `inter` columns [i0, +inter) of gate_proj
// and up_proj as [gate rows | up rows] ([2 inter, hid] bytes, [2 inter / 128, hid / 128]
// scales) and of down_proj ([hid, inter], [hid / 128, inter / 128]), into device memory; the
// scale rows strided by LinearScaleLd when `linear` (a one-group MLP), else packed (the
// routed experts' grouped GEMMs).
absl::Status FillMlpFp8Into(const RankWeightInit& src, CudaRankContext& rk,
                            const std::string& prefix, int64_t hid, int64_t inter, int64_t i0,
                            bool linear, uint8_t* gate_up, float* gate_up_scale, uint8_t* down,
                            float* down_scale) {
  const int64_t ib = inter / 128;
  const int64_t ld_gu = linear ? LinearScaleLd(rk, hid) : hid / 128;
  const int64_t ld_dn = linear ? LinearScaleLd(rk, inter) : ib;
  VERIFYD_RETURN_IF_ERROR(FillTensorFp8(src, rk, prefix + "gate_proj.weight", gate_up,
                                        gate_up_scale, inter, hid, i0, 0, ld_gu));
  VERIFYD_RETURN_IF_ERROR(FillTensorFp8(src, rk, prefix + "up_proj.weight", gate_up + inter * hid,
                                        gate_up_scale + ib * ld_gu, inter, hid, i0, 0, ld_gu));
  return FillTensorFp8(src, rk, prefix + "down_proj.weight", down, down_scale, hid, inter, 0, i0,
                       ld_dn);
}

// A one-group FP8 MLP (dense MLPs, shared experts) into new device arrays.
absl::Status FillMlpFp8(const RankWeightInit& src, CudaRankContext& rk, const std::string& prefix,
                        int64_t hid, int64_t inter, int64_t i0, uint8_t** gate_up,
                        float** gate_up_scale, uint8_t** down, float** down_scale) {
  const int64_t hb = hid / 128, ib = inter / 128;
  VERIFYD_ASSIGN_OR_RETURN(*gate_up, rk.Alloc<uint8_t>(2 * inter * hid));
  VERIFYD_ASSIGN_OR_RETURN(*gate_up_scale, rk.Alloc<float>(2 * ib * LinearScaleLd(rk, hid)));
  VERIFYD_ASSIGN_OR_RETURN(*down, rk.Alloc<uint8_t>(hid * inter));
  VERIFYD_ASSIGN_OR_RETURN(*down_scale, rk.Alloc<float>(hb * LinearScaleLd(rk, inter)));
  return FillMlpFp8Into(src, rk, prefix, hid, inter, i0, /*linear=*/true, *gate_up, *gate_up_scale,
                        *down, *down_scale);
}

// A device buffer of `count` T with every byte 0xFF (an fp32 / bf16 NaN, an int32 -1), so a
// read of an element nothing wrote shows up.
template <typename T>
absl::StatusOr<T*> AllocPoisoned(CudaRankContext& rk, int64_t count) {
  VERIFYD_ASSIGN_OR_RETURN(T * p, rk.Alloc<T>(count));
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(p, 0xFF, std::max<int64_t>(count, 1) * sizeof(T), rk.stream));
  return p;
}

// The MoE MLP weights of layer l (CudaLayerWeights' MoE fields): router and bias replicated,
// the rank's IntermediateShard of every routed expert and of the shared experts.
absl::Status FillMoeLayer(const RankWeightInit& src, const ModelConfig& c, int64_t l,
                          CudaRankContext& rk, CudaLayerWeights& L) {
  auto n = [&](const std::string& suffix) { return LayerTensorName(l, suffix); };
  const int64_t hid = c.hidden_size, E = c.moe.n_routed_experts;
  const int64_t Il = rk.moe_inter.size, Sl = rk.moe_shared_inter.size;
  VERIFYD_ASSIGN_OR_RETURN(L.router, rk.Alloc<float>(E * hid));
  VERIFYD_RETURN_IF_ERROR(FillTensorF32(src, rk, n("mlp.gate.weight"), L.router, E, hid, 0, 0));
  VERIFYD_ASSIGN_OR_RETURN(L.router_bias, rk.Alloc<float>(E));
  VERIFYD_RETURN_IF_ERROR(
      FillTensorF32(src, rk, n("mlp.gate.e_score_correction_bias"), L.router_bias, 1, E, 0, 0));
  // The rank's routed experts (all of them under TP experts, a block under EP), each its
  // moe_inter columns; local expert le is the checkpoint's expert expert_begin + le.
  const int64_t El = rk.local_experts, i0 = rk.moe_inter.begin;
  auto expert = [&](int64_t le, const char* proj) {
    return n(absl::StrCat("mlp.experts.", rk.expert_begin + le, ".", proj, ".weight"));
  };
  if (Il > 0 && rk.expert_path == ExpertPath::kFp8Grouped) {
    const int64_t hb = hid / 128, ib = Il / 128;
    VERIFYD_ASSIGN_OR_RETURN(L.experts_gate_up_fp8, rk.Alloc<uint8_t>(El * 2 * Il * hid));
    VERIFYD_ASSIGN_OR_RETURN(L.experts_gate_up_scale, rk.Alloc<float>(El * 2 * ib * hb));
    VERIFYD_ASSIGN_OR_RETURN(L.experts_down_fp8, rk.Alloc<uint8_t>(El * hid * Il));
    VERIFYD_ASSIGN_OR_RETURN(L.experts_down_scale, rk.Alloc<float>(El * hb * ib));
    for (int64_t le = 0; le < El; ++le) {
      VERIFYD_RETURN_IF_ERROR(FillMlpFp8Into(
          src, rk, n(absl::StrCat("mlp.experts.", rk.expert_begin + le, ".")), hid, Il, i0,
          /*linear=*/false, L.experts_gate_up_fp8 + le * 2 * Il * hid,
          L.experts_gate_up_scale + le * 2 * ib * hb, L.experts_down_fp8 + le * hid * Il,
          L.experts_down_scale + le * hb * ib));
    }
  } else if (Il > 0) {
    VERIFYD_ASSIGN_OR_RETURN(L.experts_gate_up, rk.Alloc<bf16>(El * 2 * Il * hid));
    VERIFYD_ASSIGN_OR_RETURN(L.experts_down, rk.Alloc<bf16>(El * hid * Il));
    for (int64_t le = 0; le < El; ++le) {
      bf16* gu = L.experts_gate_up + le * 2 * Il * hid;
      VERIFYD_RETURN_IF_ERROR(FillTensor(src, rk, expert(le, "gate_proj"), gu, Il, hid, i0, 0));
      VERIFYD_RETURN_IF_ERROR(
          FillTensor(src, rk, expert(le, "up_proj"), gu + Il * hid, Il, hid, i0, 0));
      VERIFYD_RETURN_IF_ERROR(FillTensor(src, rk, expert(le, "down_proj"),
                                         L.experts_down + le * hid * Il, hid, Il, 0, i0));
    }
  }
  if (Sl > 0 && rk.fp8_shared) {
    const int64_t s0 = rk.moe_shared_inter.begin;
    VERIFYD_RETURN_IF_ERROR(FillMlpFp8(src, rk, n("mlp.shared_experts."), hid, Sl, s0,
                                       &L.shared_gate_up_fp8, &L.shared_gate_up_scale,
                                       &L.shared_down_fp8, &L.shared_down_scale));
  } else if (Sl > 0) {
    const int64_t s0 = rk.moe_shared_inter.begin;
    VERIFYD_ASSIGN_OR_RETURN(L.shared_gate_up, rk.Alloc<bf16>(2 * Sl * hid));
    VERIFYD_RETURN_IF_ERROR(FillTensor(src, rk, n("mlp.shared_experts.gate_proj.weight"),
                                       L.shared_gate_up, Sl, hid, s0, 0));
    VERIFYD_RETURN_IF_ERROR(FillTensor(src, rk, n("mlp.shared_experts.up_proj.weight"),
                                       L.shared_gate_up + Sl * hid, Sl, hid, s0, 0));
    VERIFYD_ASSIGN_OR_RETURN(L.shared_down, rk.Alloc<bf16>(hid * Sl));
    VERIFYD_RETURN_IF_ERROR(FillTensor(src, rk, n("mlp.shared_experts.down_proj.weight"),
                                       L.shared_down, hid, Sl, 0, s0));
  }
  return absl::OkStatus();
}

// The MoE activation buffers for R rows (see the top of rank_context.h), poisoned.
absl::Status AllocMoeBuffers(const ModelConfig& c, int64_t R, CudaRankContext& rk) {
  const int64_t hid = c.hidden_size, E = c.moe.n_routed_experts, K = c.moe.num_experts_per_tok;
  const int64_t P = R * K, Il = rk.moe_inter.size, Sl = rk.moe_shared_inter.size;
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_xf, AllocPoisoned<float>(rk, R * hid));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_logits, AllocPoisoned<float>(rk, R * E));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_experts, AllocPoisoned<int32_t>(rk, P));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_weights, AllocPoisoned<float>(rk, P));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_offsets, AllocPoisoned<int32_t>(rk, E + 1));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_touched, rk.Alloc<int32_t>(c.num_hidden_layers));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_rows, AllocPoisoned<int32_t>(rk, P));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_pos, AllocPoisoned<int32_t>(rk, P));
  VERIFYD_ASSIGN_OR_RETURN(
      rk.moe_permute_ws,
      AllocPoisoned<int32_t>(rk, kc::MoePermuteWorkspaceInts(P, static_cast<int>(E))));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_x, AllocPoisoned<bf16>(rk, P * hid));
  // The shared experts' rows rounded up for cuBLASLt (kc::Fp8LtRows: gate_up, output).
  const int64_t R4 = kc::Fp8LtRows(R);
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_gu, AllocPoisoned<float>(rk, std::max(P * 2 * Il, R4 * 2 * Sl)));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_act, AllocPoisoned<bf16>(rk, std::max(P * Il, R * Sl)));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_y, AllocPoisoned<float>(rk, P * hid));
  VERIFYD_ASSIGN_OR_RETURN(rk.moe_shared, AllocPoisoned<float>(rk, R4 * hid));
  if (rk.expert_path == ExpertPath::kFp8Grouped) {
    VERIFYD_ASSIGN_OR_RETURN(rk.moe_xq, AllocPoisoned<uint8_t>(rk, P * hid));
    VERIFYD_ASSIGN_OR_RETURN(rk.moe_xq_scale, AllocPoisoned<float>(rk, P * hid / 128));
    VERIFYD_ASSIGN_OR_RETURN(rk.moe_actq, AllocPoisoned<uint8_t>(rk, P * Il));
    VERIFYD_ASSIGN_OR_RETURN(rk.moe_actq_scale, AllocPoisoned<float>(rk, P * Il / 128));
  }
  if (rk.expert_path != ExpertPath::kBf16PerExpert) {
    const kc::GroupedGemmKind kind = rk.expert_path == ExpertPath::kFp8Grouped
                                         ? kc::GroupedGemmKind::kFp8Block128
                                         : kc::GroupedGemmKind::kBf16;
    // FP8: 64-row tiles (measured faster at every verify batch size, bench/moe_layer_bench;
    // bit-identical to 128-row tiles).
    const int tile_m = kind == kc::GroupedGemmKind::kFp8Block128 ? 64 : 128;
    const int El = static_cast<int>(rk.local_experts);
    VERIFYD_ASSIGN_OR_RETURN(rk.moe_gemm_gate_up,
                             kc::GroupedGemm::Create({kind, El, 2 * Il, hid, rk.device, tile_m}));
    VERIFYD_ASSIGN_OR_RETURN(rk.moe_gemm_down,
                             kc::GroupedGemm::Create({kind, El, hid, Il, rk.device, tile_m}));
  }
  void* h = nullptr;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMallocHost(&h, (E + 1) * sizeof(int32_t)));
  rk.host_allocs.push_back(h);
  rk.moe_offsets_host = static_cast<int32_t*>(h);
  return absl::OkStatus();
}

// The rank's expert path (rank_context.h): FP8 grouped when the checkpoint stores the routed
// experts in FP8 with 128 x 128 blocks, the rank's slice is 128-aligned and the GPU runs the
// grouped kernels; bf16 grouped when the GPU runs them and the dims are multiples of 16;
// per-expert cuBLAS otherwise.
ExpertPath ChooseExpertPath(const RankSetup& setup, const CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  const int64_t hid = c.hidden_size, Il = rk.moe_inter.size;
  if (Il == 0 || !setup.grouped_experts || !kc::GroupedGemmAvailable(rk.device)) {
    return ExpertPath::kBf16PerExpert;
  }
  int64_t first_moe = -1;
  for (int64_t l = 0; l < c.num_hidden_layers && first_moe < 0; ++l) {
    if (c.IsMoeLayer(l)) first_moe = l;
  }
  if (setup.fp8_experts && first_moe >= 0 &&
      setup.weights.StoredAsFp8(LayerTensorName(first_moe, "mlp.experts.0.gate_proj.weight")) &&
      c.quant.block_rows == 128 && c.quant.block_cols == 128 && hid % 128 == 0 && Il % 128 == 0 &&
      rk.moe_inter.begin % 128 == 0) {
    return ExpertPath::kFp8Grouped;
  }
  if (hid % 16 == 0 && Il % 16 == 0) return ExpertPath::kBf16Grouped;
  return ExpertPath::kBf16PerExpert;
}

// Which FP8-stored SwiGLU MLPs stay FP8 on this rank (rk.fp8_dense, rk.fp8_shared): those
// of a checkpoint with 128 x 128 blocks whose rank slice [begin, +size) of the intermediate
// is 128-aligned (and hidden too), when the GPU runs the grouped kernels and
// RankSetup::fp8_experts is set. The first dense layer's / first MoE layer's gate_proj
// decides for all (a checkpoint quantizes every layer alike).
// What every FP8 linear kept in FP8 needs: the option, FP8 weights (a checkpoint's or
// generated) with 128 x 128 scale blocks, hidden a multiple of 128 and the grouped kernels on
// this GPU.
bool Fp8WeightsCanStayFp8(const RankSetup& setup, const CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  return setup.fp8_experts && c.quant.method == "fp8" && c.quant.block_rows == 128 &&
         c.quant.block_cols == 128 && c.hidden_size % 128 == 0 &&
         kc::GroupedGemmAvailable(rk.device);
}

void ChooseFp8Mlps(const RankSetup& setup, CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  const RankWeightInit& host = setup.weights;
  if (!Fp8WeightsCanStayFp8(setup, rk)) return;
  auto aligned = [](const ShardRange& r) {
    return r.size > 0 && r.size % 128 == 0 && r.begin % 128 == 0;
  };
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (c.IsMoeLayer(l)) {
      rk.fp8_shared = aligned(rk.moe_shared_inter) &&
                      host.StoredAsFp8(LayerTensorName(l, "mlp.shared_experts.gate_proj.weight"));
      break;
    }
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsMoeLayer(l)) {
      rk.fp8_dense =
          aligned(rk.inter) && host.StoredAsFp8(LayerTensorName(l, "mlp.gate_proj.weight"));
      break;
    }
  }
}

// Whether the attention projections stay FP8 on this rank (rk.fp8_attention):
// Fp8WeightsCanStayFp8, and q_lora (when there is one) and the rank's head slices of q_b / q_proj
// (H_l qk rows from h0 qk) and o_proj (H_l v columns from h0 v) 128-aligned; layer 0's
// q_a_proj (or q_proj), kv_a_proj_with_mqa, q_b_proj and o_proj stored as FP8 decide for all.
// kv_a's lat rows (576 on DeepSeek-V3: 4.5 blocks) are padded with zero rows to whole blocks
// and fused behind q_a's into one GEMM (rk.fp8_qkv_a_cols columns).
void ChooseFp8Attention(const RankSetup& setup, CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  if (!Fp8WeightsCanStayFp8(setup, rk) || c.num_hidden_layers == 0) return;
  const int64_t ql = c.q_lora_rank, qk = c.qk_head_dim(), v = c.v_head_dim;
  const int64_t Hl = rk.heads.size, h0 = rk.heads.begin;
  const bool aligned = Hl > 0 && ql % 128 == 0 && (Hl * qk) % 128 == 0 && (h0 * qk) % 128 == 0 &&
                       (Hl * v) % 128 == 0 && (h0 * v) % 128 == 0;
  auto fp8 = [&](const char* suffix) {
    return setup.weights.StoredAsFp8(LayerTensorName(0, suffix));
  };
  const bool stored = (ql > 0 ? fp8("self_attn.q_a_proj.weight") && fp8("self_attn.q_b_proj.weight")
                              : fp8("self_attn.q_proj.weight")) &&
                      fp8("self_attn.kv_a_proj_with_mqa.weight") && fp8("self_attn.o_proj.weight");
  rk.fp8_attention = aligned && stored;
  if (rk.fp8_attention) rk.fp8_qkv_a_cols = ql + (c.latent_dim() + 127) / 128 * 128;
}

// Layer l's attention projections in FP8 (rk.fp8_attention; CudaLayerWeights' FP8 fields).
absl::Status FillAttentionFp8(const RankWeightInit& src, const ModelConfig& c, int64_t l,
                              CudaRankContext& rk, CudaLayerWeights& L) {
  auto n = [&](const char* suffix) { return LayerTensorName(l, suffix); };
  const int64_t hid = c.hidden_size, hb = hid / 128, ql = c.q_lora_rank, lat = c.latent_dim();
  const int64_t qk = c.qk_head_dim(), v = c.v_head_dim, Hl = rk.heads.size, h0 = rk.heads.begin;
  const int64_t na = rk.fp8_qkv_a_cols, qin = ql > 0 ? ql : hid;
  const int64_t ld_a = LinearScaleLd(rk, hid), ld_q = LinearScaleLd(rk, qin);
  const int64_t ld_o = LinearScaleLd(rk, Hl * v);
  VERIFYD_ASSIGN_OR_RETURN(L.qkv_a_fp8, rk.Alloc<uint8_t>(na * hid));
  VERIFYD_ASSIGN_OR_RETURN(L.qkv_a_scale, rk.Alloc<float>(na / 128 * ld_a));
  if (ql > 0) {
    VERIFYD_RETURN_IF_ERROR(FillTensorFp8(src, rk, n("self_attn.q_a_proj.weight"), L.qkv_a_fp8,
                                          L.qkv_a_scale, ql, hid, 0, 0, ld_a));
  }
  VERIFYD_RETURN_IF_ERROR(FillTensorFp8(src, rk, n("self_attn.kv_a_proj_with_mqa.weight"),
                                        L.qkv_a_fp8 + ql * hid, L.qkv_a_scale + ql / 128 * ld_a,
                                        lat, hid, 0, 0, ld_a));
  // The pad rows: zero weights (their scale is kv_a's last block's), so columns >= ql + lat of
  // the GEMM's output are 0 and nothing reads them.
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(L.qkv_a_fp8 + (ql + lat) * hid, 0, (na - ql - lat) * hid, rk.stream));
  VERIFYD_ASSIGN_OR_RETURN(L.q_b_fp8, rk.Alloc<uint8_t>(Hl * qk * qin));
  VERIFYD_ASSIGN_OR_RETURN(L.q_b_scale, rk.Alloc<float>(Hl * qk / 128 * ld_q));
  VERIFYD_RETURN_IF_ERROR(
      FillTensorFp8(src, rk, n(ql > 0 ? "self_attn.q_b_proj.weight" : "self_attn.q_proj.weight"),
                    L.q_b_fp8, L.q_b_scale, Hl * qk, qin, h0 * qk, 0, ld_q));
  VERIFYD_ASSIGN_OR_RETURN(L.o_proj_fp8, rk.Alloc<uint8_t>(hid * Hl * v));
  VERIFYD_ASSIGN_OR_RETURN(L.o_proj_scale, rk.Alloc<float>(hb * ld_o));
  return FillTensorFp8(src, rk, n("self_attn.o_proj.weight"), L.o_proj_fp8, L.o_proj_scale, hid,
                       Hl * v, 0, h0 * v, ld_o);
}

// The one-group FP8 GEMMs and scratch of the FP8 linears for R rows (rk.fp8_attention,
// fp8_dense, fp8_shared).
absl::Status AllocFp8Buffers(const RankSetup& setup, const ModelConfig& c, int64_t R,
                             CudaRankContext& rk) {
  const int64_t hid = c.hidden_size;
  const int64_t inter =
      std::max(rk.fp8_dense ? rk.inter.size : 0, rk.fp8_shared ? rk.moe_shared_inter.size : 0);
  if (inter == 0 && !rk.fp8_attention) return absl::OkStatus();
  using kc::GroupedGemm;
  constexpr kc::GroupedGemmKind kFp8 = kc::GroupedGemmKind::kFp8Block128;
  const int64_t ql = c.q_lora_rank, qk = c.qk_head_dim(), Hl = rk.heads.size;
  const int64_t v = c.v_head_dim;
  rk.fp8_xq_cols = hid;
  if (rk.fp8_attention) rk.fp8_xq_cols = std::max({hid, ql, Hl * v});
  VERIFYD_ASSIGN_OR_RETURN(rk.fp8_offsets, AllocPoisoned<int32_t>(rk, 2));
  // Rows rounded up for cuBLASLt (kc::Fp8LtRows: it computes whole groups of 4 rows).
  R = kc::Fp8LtRows(R);
  VERIFYD_ASSIGN_OR_RETURN(rk.fp8_xq, AllocPoisoned<uint8_t>(rk, R * rk.fp8_xq_cols));
  VERIFYD_ASSIGN_OR_RETURN(rk.fp8_xq_scale, AllocPoisoned<float>(rk, R * rk.fp8_xq_cols / 128));
  if (inter > 0) {
    VERIFYD_ASSIGN_OR_RETURN(rk.fp8_actq, AllocPoisoned<uint8_t>(rk, R * inter));
    VERIFYD_ASSIGN_OR_RETURN(rk.fp8_actq_scale, AllocPoisoned<float>(rk, R * inter / 128));
  }

  // 64-row tiles, as the routed experts' (few rows per step at verify batch sizes).
  if (rk.fp8_attention) {
    const int64_t na = rk.fp8_qkv_a_cols, qin = ql > 0 ? ql : hid;
    VERIFYD_ASSIGN_OR_RETURN(rk.attn_gemm_qkv_a,
                             GroupedGemm::Create({kFp8, 1, na, hid, rk.device, 64}));
    VERIFYD_ASSIGN_OR_RETURN(rk.attn_gemm_q_b,
                             GroupedGemm::Create({kFp8, 1, Hl * qk, qin, rk.device, 64}));
    VERIFYD_ASSIGN_OR_RETURN(rk.attn_gemm_o,
                             GroupedGemm::Create({kFp8, 1, hid, Hl * v, rk.device, 64}));
    VERIFYD_ASSIGN_OR_RETURN(rk.qkva, AllocPoisoned<float>(rk, R * na));
    VERIFYD_ASSIGN_OR_RETURN(rk.qf, AllocPoisoned<float>(rk, R * Hl * qk));
  }
  if (rk.fp8_dense) {
    const int64_t I = rk.inter.size;
    VERIFYD_ASSIGN_OR_RETURN(rk.dense_gemm_gate_up,
                             GroupedGemm::Create({kFp8, 1, 2 * I, hid, rk.device, 64}));
    VERIFYD_ASSIGN_OR_RETURN(rk.dense_gemm_down,
                             GroupedGemm::Create({kFp8, 1, hid, I, rk.device, 64}));
  }
  if (rk.fp8_shared) {
    const int64_t S = rk.moe_shared_inter.size;
    VERIFYD_ASSIGN_OR_RETURN(rk.shared_gemm_gate_up,
                             GroupedGemm::Create({kFp8, 1, 2 * S, hid, rk.device, 64}));
    VERIFYD_ASSIGN_OR_RETURN(rk.shared_gemm_down,
                             GroupedGemm::Create({kFp8, 1, hid, S, rk.device, 64}));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status InitRankContext(const RankSetup& setup, CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  const int tp = rk.world;
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
    rk.batch_invariant = setup.batch_invariant;
    rk.shared_context_attention = setup.shared_context_attention;
    rk.positional_split = setup.positional_split;
    if (rk.batch_invariant) {
      VERIFYD_RETURN_IF_ERROR(
          kc::EnableFixedGemmAlgorithms(rk.cublas, *ws, kCublasWs, setup.max_rows));
    }
  }
  if (tp > 1 && setup.recording) {
    const size_t rank_order_bytes =
        setup.batch_invariant ? static_cast<size_t>(setup.max_rows * c.hidden_size) * sizeof(float)
                              : 0;
    VERIFYD_ASSIGN_OR_RETURN(rk.comm,
                             RecordingCommunicator::Create(rk.rank, tp, rk.device, rank_order_bytes,
                                                           setup.comm_timeout_ms));
  } else if (tp > 1 && setup.loopback != nullptr) {
    VERIFYD_ASSIGN_OR_RETURN(rk.comm,
                             LoopbackCommunicator::Create(setup.loopback, rk.rank, rk.device));
  } else if (tp > 1) {
    VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                             NcclCommunicator::Create(setup.nccl_id, rk.rank, tp, rk.device,
                                                      setup.comm_timeout_ms, setup.nccl_group));
    // Batch-invariant steps: the layer reductions ([rows, hidden] fp32) summed in rank order.
    if (setup.batch_invariant) {
      VERIFYD_RETURN_IF_ERROR(nccl->EnableRankOrderReduce(
          static_cast<size_t>(setup.max_rows * c.hidden_size) * sizeof(float)));
    }
    rk.comm = std::move(nccl);
  }
  rk.heads = HeadShard(c.num_attention_heads, tp, rk.rank);
  rk.vocab = VocabShard(c.vocab_size, tp, rk.rank);
  rk.inter = IntermediateShard(c.intermediate_size, tp, rk.rank);
  // Routed experts: expert parallelism (a block of whole experts per rank) when asked for and
  // the experts divide evenly, else a slice of every expert (tensor-parallel experts).
  const int64_t E = c.moe.n_routed_experts;
  if (setup.expert_parallel && tp > 1 && E > 0 && E % tp == 0) {
    rk.expert_begin = rk.rank * (E / tp);
    rk.local_experts = E / tp;
    rk.moe_inter = ShardRange{0, c.moe.moe_intermediate_size};
  } else {
    rk.expert_begin = 0;
    rk.local_experts = E;
    rk.moe_inter = IntermediateShard(c.moe.moe_intermediate_size, tp, rk.rank);
  }
  rk.moe_shared_inter =
      IntermediateShard(c.moe.moe_intermediate_size * c.moe.n_shared_experts, tp, rk.rank);
  rk.vmax = CeilShardMax(c.vocab_size, tp);
  if (c.moe.n_routed_experts > 0) rk.expert_path = ChooseExpertPath(setup, rk);
  ChooseFp8Mlps(setup, rk);
  ChooseFp8Attention(setup, rk);
  // The one-group FP8 linears through cuBLASLt (before the weights: it sets their scale
  // layout), unless the steps are batch-invariant or it has no algorithm for this GPU.
  if ((rk.fp8_attention || rk.fp8_dense || rk.fp8_shared) && setup.fp8_cublaslt &&
      !setup.batch_invariant) {
    absl::StatusOr<std::unique_ptr<kc::Fp8BlockGemmLt>> lt = kc::Fp8BlockGemmLt::Create();
    if (lt.ok()) {
      rk.fp8_lt = std::move(*lt);
    } else if (lt.status().code() != absl::StatusCode::kFailedPrecondition) {
      return lt.status();
    }  // else: the grouped kernel (CudaEngine::fp8_gemm says which)
  }
  const int64_t hid = c.hidden_size, qk = c.qk_head_dim(), nope = c.qk_nope_head_dim;
  const int64_t v = c.v_head_dim, kvl = c.kv_lora_rank, lat = c.latent_dim();
  const int64_t Hl = rk.heads.size, h0 = rk.heads.begin, Il = rk.inter.size;
  const int64_t ql = c.q_lora_rank, R = setup.max_rows;

  // Weights (bf16): the rank's shard of every tensor.
  // The embedding: the whole table at TP 1, else the rank's vocabulary rows (the same rows as
  // its lm_head slice; the ranks' gathers are summed: mla_layer.cc EmbedTokens).
  const ShardRange erows = tp > 1 ? rk.vocab : ShardRange{0, c.vocab_size};
  VERIFYD_ASSIGN_OR_RETURN(rk.embed, rk.Alloc<bf16>(std::max<int64_t>(erows.size, 1) * hid));
  VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, "model.embed_tokens.weight", rk.embed,
                                     erows.size, hid, erows.begin, 0));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto n = [&](const char* suffix) { return LayerTensorName(l, suffix); };
    CudaLayerWeights L;
    VERIFYD_ASSIGN_OR_RETURN(L.input_norm, rk.Alloc<bf16>(hid));
    VERIFYD_RETURN_IF_ERROR(
        FillTensor(setup.weights, rk, n("input_layernorm.weight"), L.input_norm, 1, hid, 0, 0));
    if (ql > 0) {
      VERIFYD_ASSIGN_OR_RETURN(L.q_a_norm, rk.Alloc<bf16>(ql));
      VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("self_attn.q_a_layernorm.weight"),
                                         L.q_a_norm, 1, ql, 0, 0));
    }
    if (rk.fp8_attention) {
      VERIFYD_RETURN_IF_ERROR(FillAttentionFp8(setup.weights, c, l, rk, L));
    } else if (ql > 0) {
      VERIFYD_ASSIGN_OR_RETURN(L.q_a, rk.Alloc<bf16>(ql * hid));
      VERIFYD_RETURN_IF_ERROR(
          FillTensor(setup.weights, rk, n("self_attn.q_a_proj.weight"), L.q_a, ql, hid, 0, 0));
      VERIFYD_ASSIGN_OR_RETURN(L.q_b, rk.Alloc<bf16>(Hl * qk * ql));
      VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("self_attn.q_b_proj.weight"), L.q_b,
                                         Hl * qk, ql, h0 * qk, 0));
    } else {
      VERIFYD_ASSIGN_OR_RETURN(L.q_b, rk.Alloc<bf16>(Hl * qk * hid));
      VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("self_attn.q_proj.weight"), L.q_b,
                                         Hl * qk, hid, h0 * qk, 0));
    }
    if (!rk.fp8_attention) {
      VERIFYD_ASSIGN_OR_RETURN(L.kv_a, rk.Alloc<bf16>(lat * hid));
      VERIFYD_RETURN_IF_ERROR(FillTensor(
          setup.weights, rk, n("self_attn.kv_a_proj_with_mqa.weight"), L.kv_a, lat, hid, 0, 0));
      VERIFYD_ASSIGN_OR_RETURN(L.o_proj, rk.Alloc<bf16>(hid * Hl * v));
      VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("self_attn.o_proj.weight"), L.o_proj,
                                         hid, Hl * v, 0, h0 * v));
    }
    VERIFYD_ASSIGN_OR_RETURN(L.kv_a_norm, rk.Alloc<bf16>(kvl));
    VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("self_attn.kv_a_layernorm.weight"),
                                       L.kv_a_norm, 1, kvl, 0, 0));
    // kv_b rows of the local heads, in the checkpoint layout: per head W_UK [nope, kv_lora]
    // then W_UV [v, kv_lora]; the batched GEMMs read both in place.
    VERIFYD_ASSIGN_OR_RETURN(L.kv_b, rk.Alloc<bf16>(Hl * (nope + v) * kvl));
    VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("self_attn.kv_b_proj.weight"), L.kv_b,
                                       Hl * (nope + v), kvl, h0 * (nope + v), 0));
    VERIFYD_ASSIGN_OR_RETURN(L.post_norm, rk.Alloc<bf16>(hid));
    VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("post_attention_layernorm.weight"),
                                       L.post_norm, 1, hid, 0, 0));
    if (c.IsMoeLayer(l)) {
      VERIFYD_RETURN_IF_ERROR(FillMoeLayer(setup.weights, c, l, rk, L));
    } else if (Il > 0 && rk.fp8_dense) {
      VERIFYD_RETURN_IF_ERROR(FillMlpFp8(setup.weights, rk, n("mlp."), hid, Il, rk.inter.begin,
                                         &L.gate_up_fp8, &L.gate_up_scale, &L.down_fp8,
                                         &L.down_scale));
    } else if (Il > 0) {
      // [gate rows | up rows] of the local intermediate columns: one GEMM for both.
      VERIFYD_ASSIGN_OR_RETURN(L.gate_up, rk.Alloc<bf16>(2 * Il * hid));
      VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("mlp.gate_proj.weight"), L.gate_up,
                                         Il, hid, rk.inter.begin, 0));
      VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("mlp.up_proj.weight"),
                                         L.gate_up + Il * hid, Il, hid, rk.inter.begin, 0));
      VERIFYD_ASSIGN_OR_RETURN(L.down, rk.Alloc<bf16>(hid * Il));
      VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("mlp.down_proj.weight"), L.down, hid,
                                         Il, 0, rk.inter.begin));
    }
    rk.layers.push_back(L);
  }
  VERIFYD_ASSIGN_OR_RETURN(rk.final_norm, rk.Alloc<bf16>(hid));
  VERIFYD_RETURN_IF_ERROR(
      FillTensor(setup.weights, rk, "model.norm.weight", rk.final_norm, 1, hid, 0, 0));
  if (rk.vocab.size > 0 && c.tie_word_embeddings && erows.begin == rk.vocab.begin &&
      erows.size == rk.vocab.size) {
    rk.lm_head = rk.embed;  // tied: the embedding slice is the lm_head slice
  } else if (rk.vocab.size > 0) {
    VERIFYD_ASSIGN_OR_RETURN(rk.lm_head, rk.Alloc<bf16>(rk.vocab.size * hid));
    VERIFYD_RETURN_IF_ERROR(FillTensor(
        setup.weights, rk, c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
        rk.lm_head, rk.vocab.size, hid, rk.vocab.begin, 0));
  }
  VERIFYD_RETURN_IF_ERROR(FreeStaging(rk));

  // Activations for the largest step.
  VERIFYD_ASSIGN_OR_RETURN(rk.x, rk.Alloc<float>(R * hid));
  VERIFYD_ASSIGN_OR_RETURN(rk.xn, rk.Alloc<bf16>(R * hid));
  if (ql > 0) {
    if (!rk.fp8_attention) {
      VERIFYD_ASSIGN_OR_RETURN(rk.qa, rk.Alloc<float>(R * ql));
    }
    VERIFYD_ASSIGN_OR_RETURN(rk.qan, rk.Alloc<bf16>(R * ql));
  }
  VERIFYD_ASSIGN_OR_RETURN(rk.q, rk.Alloc<bf16>(R * Hl * qk));
  if (!rk.fp8_attention) {
    VERIFYD_ASSIGN_OR_RETURN(rk.kva, rk.Alloc<float>(R * lat));
  }
  VERIFYD_ASSIGN_OR_RETURN(rk.qatt, rk.Alloc<bf16>(R * Hl * lat));
  VERIFYD_ASSIGN_OR_RETURN(rk.olat, rk.Alloc<bf16>(R * Hl * kvl));
  VERIFYD_ASSIGN_OR_RETURN(rk.attn, rk.Alloc<bf16>(R * Hl * v));
  // part and gu take FP8 linears' outputs: rows rounded up for cuBLASLt (kc::Fp8LtRows).
  VERIFYD_ASSIGN_OR_RETURN(rk.part, rk.Alloc<float>(kc::Fp8LtRows(R) * hid));
  VERIFYD_ASSIGN_OR_RETURN(rk.gu, rk.Alloc<float>(kc::Fp8LtRows(R) * 2 * std::max<int64_t>(Il, 1)));
  VERIFYD_ASSIGN_OR_RETURN(rk.act, rk.Alloc<bf16>(R * std::max<int64_t>(Il, 1)));
  VERIFYD_ASSIGN_OR_RETURN(rk.logits, rk.Alloc<float>(R * rk.vmax));
  VERIFYD_ASSIGN_OR_RETURN(rk.cos_t, rk.Alloc<float>(R * c.qk_rope_head_dim / 2));
  VERIFYD_ASSIGN_OR_RETURN(rk.sin_t, rk.Alloc<float>(R * c.qk_rope_head_dim / 2));
  VERIFYD_ASSIGN_OR_RETURN(rk.inv_freq, rk.Alloc<float>(c.qk_rope_head_dim / 2));
  VERIFYD_ASSIGN_OR_RETURN(rk.pairs, rk.Alloc<kc::ArgmaxPair>(R));
  VERIFYD_ASSIGN_OR_RETURN(rk.gathered, rk.Alloc<kc::ArgmaxPair>(R * tp));
  VERIFYD_ASSIGN_OR_RETURN(rk.preds, rk.Alloc<int32_t>(R));
  VERIFYD_ASSIGN_OR_RETURN(rk.accepted, rk.Alloc<int32_t>(R));
  VERIFYD_ASSIGN_OR_RETURN(rk.kept, rk.Alloc<int32_t>(R));
  VERIFYD_ASSIGN_OR_RETURN(rk.freed, rk.Alloc<int32_t>(R));
  VERIFYD_ASSIGN_OR_RETURN(rk.num_accepted, rk.Alloc<int32_t>(setup.max_batch));
  VERIFYD_ASSIGN_OR_RETURN(rk.bonus, rk.Alloc<int32_t>(setup.max_batch));
  bool has_moe = false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) has_moe = has_moe || c.IsMoeLayer(l);
  if (has_moe) VERIFYD_RETURN_IF_ERROR(AllocMoeBuffers(c, R, rk));
  VERIFYD_RETURN_IF_ERROR(AllocFp8Buffers(setup, c, R, rk));
  {
    // Plain RoPE: RopeInvFreq (factor 1); YaRN: the reference's table and cos / sin factor.
    std::vector<float> inv;
    if (c.rope_scaling.type == "yarn") {
      const kernels::ref::YarnParams y = YarnParamsOf(c);
      inv = kernels::ref::YarnInvFreq(y);
      rk.rope_attention_factor = static_cast<float>(kernels::ref::YarnAttentionFactor(y));
    } else {
      inv = kc::RopeInvFreq(static_cast<int>(c.qk_rope_head_dim), c.rope_theta);
      rk.rope_attention_factor = 1.0f;
    }
    // Synchronous below (cudaStreamSynchronize before return): inv outlives the copy.
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        rk.inv_freq, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice, rk.stream));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
  }
  {
    void* h = nullptr;
    VERIFYD_CUDA_RETURN_IF_ERROR(
        cudaMallocHost(&h, (4 * R + 2 * setup.max_batch) * sizeof(int32_t)));
    rk.host_allocs.push_back(h);
    rk.out_host = static_cast<char*>(h);
  }
  if (setup.use_verify_kernel) {
    absl::StatusOr<kc::VerifyAttentionDeviceInfo> info = kc::VerifyAttentionDeviceInfo::Query();
    if (!info.ok()) return info.status();
    rk.vk_info = *info;
    // Batch-invariant steps: room for every row of a full step at the most splits, partial
    // rows (EngineOptions::cuda.positional_partial_rows: 1 GiB by default) and index entries
    // (64 MB) for a pass (PositionalCapacity; tp/memory_plan.cc counts the same). A step that
    // needs more runs in passes, one after another, each launch holding only its pass's work:
    // with 128k partial rows a step of 32 trees of 64 nodes over 65k tokens at 64 heads took
    // 33 passes of fewer CTAs than SMs (2.1x the batch-adaptive attention time; docs/PERF.md).
    absl::StatusOr<kc::VerifyAttentionWorkspace> ws =
        rk.batch_invariant
            ? kc::VerifyAttentionWorkspace::AllocateLike(
                  kc::VerifyAttentionWorkspace::PositionalCapacity(
                      setup.max_rows, rk.heads.size, setup.positional_split.max_splits,
                      setup.positional_partial_rows))
            : kc::VerifyAttentionWorkspace::AllocateDefault(
                  rk.vk_info.cc_major == 9 ? setup.fp8_staging_keys : 0);
    if (!ws.ok()) return ws.status();
    rk.vk_ws = *ws;
    rk.have_vk = true;
  }
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
  size_t free_b = 0, total_b = 0;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  rk.free_bytes = free_b;
  return absl::OkStatus();
}

int64_t KvRowBytes(const ModelConfig& config, bool kv_fp8) {
  return kv_fp8 ? kernels::KvFp8RowBytes(config.kv_lora_rank, config.qk_rope_head_dim,
                                         kernels::kKvFp8Group)
                : config.latent_dim() * static_cast<int64_t>(sizeof(bf16));
}

absl::Status AllocateKvPool(const ModelConfig& config, int64_t kv_slots, bool kv_fp8,
                            CudaRankContext& rk) {
  rk.kv_fp8 = kv_fp8;
  rk.kv_row_bytes = KvRowBytes(config, kv_fp8);
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    absl::StatusOr<uint8_t*> p = rk.Alloc<uint8_t>(kv_slots * rk.kv_row_bytes);
    if (!p.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("latent KV pool of ", kv_slots, " slots: ", p.status().message()));
    }
    // Poison: every byte 0xFF is a bf16 NaN (FP8: NaN codes and scales), so a read of a slot
    // nothing wrote shows up.
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(*p, 0xFF, kv_slots * rk.kv_row_bytes, rk.stream));
    rk.kv.push_back(*p);
  }
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(rk.stream));
  return absl::OkStatus();
}

void FreeRankContext(CudaRankContext& rk) {
  cudaSetDevice(rk.device);
  if (rk.stream != nullptr) cudaStreamSynchronize(rk.stream);
  rk.comm.reset();
  rk.moe_gemm_gate_up.reset();
  rk.moe_gemm_down.reset();
  rk.fp8_lt.reset();
  rk.attn_gemm_qkv_a.reset();
  rk.attn_gemm_q_b.reset();
  rk.attn_gemm_o.reset();
  rk.dense_gemm_gate_up.reset();
  rk.dense_gemm_down.reset();
  rk.shared_gemm_gate_up.reset();
  rk.shared_gemm_down.reset();
  if (rk.vk_ws.device != nullptr) (void)rk.vk_ws.Free();
  for (cudaEvent_t e : rk.events) cudaEventDestroy(e);
  rk.events.clear();
  if (rk.cublas != nullptr) {
    kc::DisableFixedGemmAlgorithms(rk.cublas);
    cublasDestroy(rk.cublas);
  }
  rk.cublas = nullptr;
  for (void* p : rk.allocs) cudaFree(p);
  rk.allocs.clear();
  (void)FreeStaging(rk);
  for (void* p : rk.host_allocs) cudaFreeHost(p);
  rk.host_allocs.clear();
  if (rk.stream != nullptr) cudaStreamDestroy(rk.stream);
  rk.stream = nullptr;
}

absl::Status WaitRankStream(CudaRankContext& rk, int timeout_ms) {
  if (rk.comm) return rk.comm->Synchronize(rk.stream);
  return WaitStream(rk.stream, timeout_ms);
}

void MarkProfile(CudaRankContext& rk, ProfileCategory cat) {
  if (!rk.profiling) return;
  if (rk.events_used == rk.events.size()) {
    cudaEvent_t e;
    if (cudaEventCreate(&e) != cudaSuccess) return;
    rk.events.push_back(e);
    rk.event_cat.push_back(ProfileCategory::kOther);
  }
  cudaEventRecord(rk.events[rk.events_used], rk.stream);
  rk.event_cat[rk.events_used] = cat;
  ++rk.events_used;
}

absl::Status CollectProfile(CudaRankContext& rk) {
  CudaStepProfile p;
  p.verify_kernel = std::string_view(rk.last_verify_kernel) != "fallback";
  for (size_t i = 0; i + 1 < rk.events_used; ++i) {
    float ms = 0;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, rk.events[i], rk.events[i + 1]));
    switch (rk.event_cat[i]) {
      case ProfileCategory::kGemm:
        p.gemm_ms += ms;
        break;
      case ProfileCategory::kAttention:
        p.attention_ms += ms;
        break;
      case ProfileCategory::kComm:
        p.comm_ms += ms;
        break;
      case ProfileCategory::kRouter:
        p.router_ms += ms;
        break;
      case ProfileCategory::kDispatch:
        p.dispatch_ms += ms;
        break;
      case ProfileCategory::kExperts:
        p.experts_ms += ms;
        break;
      case ProfileCategory::kSampling:
        p.sampling_ms += ms;
        break;
      default:
        p.other_ms += ms;
        break;
    }
    p.total_ms += ms;
  }
  if (rk.moe_touched != nullptr) {
    std::vector<int32_t> touched(rk.layers.size());
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        touched.data(), rk.moe_touched, touched.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    for (int32_t t : touched) p.experts_touched += t;
  }
  rk.profile = p;
  return absl::OkStatus();
}

}  // namespace verifyd::tp
