// The weight shard of one CUDA rank (see rank_weights.h).
#include "tp/cuda/rank_weights.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/dense/weight_gen.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/status.h"
#include "kernels/weight_init.h"
#include "tp/sharding.h"
#include "tp/weights.h"

namespace verifyd::tp {
namespace {

namespace kc = kernels::cuda;
using bf16 = kernels::bf16_bits;

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

// Layer l's weights (CudaLayerWeights) into rk.layers.
absl::Status FillLayerWeights(const RankSetup& setup, int64_t l, CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  const int64_t hid = c.hidden_size, qk = c.qk_head_dim(), nope = c.qk_nope_head_dim;
  const int64_t v = c.v_head_dim, kvl = c.kv_lora_rank, lat = c.latent_dim();
  const int64_t Hl = rk.heads.size, h0 = rk.heads.begin, Il = rk.inter.size;
  const int64_t ql = c.q_lora_rank;
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
    VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("self_attn.kv_a_proj_with_mqa.weight"),
                                       L.kv_a, lat, hid, 0, 0));
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
    VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("mlp.gate_proj.weight"), L.gate_up, Il,
                                       hid, rk.inter.begin, 0));
    VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("mlp.up_proj.weight"),
                                       L.gate_up + Il * hid, Il, hid, rk.inter.begin, 0));
    VERIFYD_ASSIGN_OR_RETURN(L.down, rk.Alloc<bf16>(hid * Il));
    VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, n("mlp.down_proj.weight"), L.down, hid,
                                       Il, 0, rk.inter.begin));
  }
  rk.layers.push_back(L);
  return absl::OkStatus();
}

}  // namespace

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

absl::Status FillRankWeights(const RankSetup& setup, CudaRankContext& rk) {
  const ModelConfig& c = *setup.config;
  const int tp = rk.world;
  const int64_t hid = c.hidden_size;
  // The embedding: the whole table at TP 1, else the rank's vocabulary rows (the same rows as
  // its lm_head slice; the ranks' gathers are summed: mla_layer.cc EmbedTokens).
  const ShardRange erows = tp > 1 ? rk.vocab : ShardRange{0, c.vocab_size};
  VERIFYD_ASSIGN_OR_RETURN(rk.embed, rk.Alloc<bf16>(std::max<int64_t>(erows.size, 1) * hid));
  VERIFYD_RETURN_IF_ERROR(FillTensor(setup.weights, rk, "model.embed_tokens.weight", rk.embed,
                                     erows.size, hid, erows.begin, 0));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    VERIFYD_RETURN_IF_ERROR(FillLayerWeights(setup, l, rk));
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
  return FreeStaging(rk);
}

}  // namespace verifyd::tp
