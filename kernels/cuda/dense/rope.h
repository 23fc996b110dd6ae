// Rotary embedding and the latent KV write of MLA on the GPU, Hugging Face DeepSeek-V3 style
// as kernels::ref::ApplyRope: the rope_dim values of a head are de-interleaved
// ([x0 x2 ... | x1 x3 ...]) and rotated by rotate_half with inv_freq[i] = theta^(-2i/rope_dim);
// the result stays in the de-interleaved layout.
//
// Plan once per step: RopeTableCuda computes cos/sin [rows, rope_dim/2] for the step's
// positions (angle = float(pos) * inv_freq[i] as a float product, cos/sin in double then
// rounded, then times attention_factor, exactly as the reference); every layer's QRopeCuda /
// LatentKvWriteCuda reads it. YaRN (kernels/yarn.h) is an inv_freq table from
// YarnInvFreq and attention_factor = YarnAttentionFactor; plain RoPE is RopeInvFreq with
// factor 1 (an exact multiply: the same table values as without the factor).
// Host header (no CUDA code). Thread-safety: launchers are reentrant.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common.h"

namespace verifyd::kernels::cuda {

// inv_freq[i] = float(1 / theta^(2i / rope_dim)), i < rope_dim / 2 (host; the reference's
// formula: computed in double, rounded to float once).
std::vector<float> RopeInvFreq(int rope_dim, double theta);

struct RopeTableParams {
  int rows = 0;
  int rope_dim = 0;                    // even
  const int32_t* positions = nullptr;  // [rows], device
  const float* inv_freq = nullptr;     // [rope_dim / 2], device (RopeInvFreq / YarnInvFreq)
  float attention_factor = 1.0f;       // multiplies cos and sin (YaRN's mscale ratio)
  float* cos_table = nullptr;          // [rows, rope_dim / 2] fp32, device
  float* sin_table = nullptr;          // [rows, rope_dim / 2] fp32, device
  void* stream = nullptr;
};
absl::Status RopeTableCuda(const RopeTableParams& p);

// Query rope: reads the rope part of every head of q, rotates it, and writes it into the
// attention query buffer (the absorbed query's last rope_dim columns).
//   in [rows, heads, in_head_stride] bf16, columns [in_offset, in_offset + rope_dim)
//   out[rows, heads, out_head_stride] bf16, columns [out_offset, out_offset + rope_dim)
struct QRopeParams {
  int rows = 0;
  int heads = 0;
  int rope_dim = 0;
  const bf16_bits* in = nullptr;
  int64_t in_head_stride = 0;  // elements between heads; rows are heads * stride apart
  int64_t in_offset = 0;
  bf16_bits* out = nullptr;
  int64_t out_head_stride = 0;
  int64_t out_offset = 0;
  const float* cos_table = nullptr;  // [rows, rope_dim / 2] (RopeTableCuda)
  const float* sin_table = nullptr;
  void* stream = nullptr;
};
absl::Status QRopeCuda(const QRopeParams& p);

// The latent KV row of each tail row: kv_a output [rows, ld_kva] fp32 whose first kv_lora
// columns are RMS-normalised with kv_norm_weight and whose next rope_dim columns are rotated;
// the row (kv_lora + rope_dim bf16 values) is written to cache[slots[r], :].
struct LatentKvWriteParams {
  int rows = 0;
  int kv_lora = 0;             // 512 in the real models
  int rope_dim = 0;            // 64
  const float* kva = nullptr;  // [rows, ld_kva] fp32, device
  int64_t ld_kva = 0;
  const bf16_bits* kv_norm_weight = nullptr;  // [kv_lora] bf16
  float eps = 1e-6f;
  const float* cos_table = nullptr;  // [rows, rope_dim / 2]
  const float* sin_table = nullptr;
  const int32_t* slots = nullptr;  // [rows] cache slot of each row, device
  // [kv_slots, kv_lora + rope_dim] bf16, or with fp8 [kv_slots, KvFp8RowBytes] bytes
  void* cache = nullptr;
  // The cache holds rows of the FP8 format (kernels/kv_fp8.h): each row's normed c_kv is
  // stored as e4m3 codes with a float32 scale per kKvFp8Group columns, k_pe as bf16; the bytes
  // KvFp8EncodeRow gives for the same float row. Needs kv_lora % 4 == 0 (aligned scales).
  bool fp8 = false;
  int64_t kv_slots = 0;  // slots are trusted (validated on the host)
  void* stream = nullptr;
};
absl::Status LatentKvWriteCuda(const LatentKvWriteParams& p);

// Stores `rows` bf16 latent rows ([rows, ld_in], kv_lora + rope_dim columns) in the FP8 format
// (kernels/kv_fp8.h): row i at out + i * KvFp8RowBytes, bit for bit KvFp8EncodeRow of the
// row's float values. (Random cache contents for benchmarks; the test of the encoder.)
struct KvFp8EncodeRowsParams {
  int64_t rows = 0;
  int kv_lora = 0;  // % 4 == 0
  int rope_dim = 0;
  const bf16_bits* in = nullptr;
  int64_t ld_in = 0;
  void* out = nullptr;
  void* stream = nullptr;
};
absl::Status KvFp8EncodeRowsCuda(const KvFp8EncodeRowsParams& p);

}  // namespace verifyd::kernels::cuda
