// The CUDA engine's dense ops (kernels/cuda/dense) against the C++ reference ops on fresh
// seeded random inputs: on-device weight generation (bit-exact with kernels/weight_init.h),
// RMSNorm, RoPE table + query rope + latent KV write, SwiGLU, residual add, embedding gather,
// vocab-parallel argmax (ties, NaN), and the cuBLAS bf16 GEMMs (plain and batched, both
// weight layouts). Outputs are pre-filled with NaN so a missed write fails.
//
// Tolerances (relative L2 error against the fp32 reference on the same bf16-rounded inputs):
//   fp32 outputs of fp32 math (norm, rope, swiglu, add):  1e-5 (summation order only)
//   bf16 outputs:                                          8e-3 (one bf16 rounding, 2^-8)
//   GEMM fp32 out (fp32 accumulation, another order):      1e-5
// Label gpu; skipped with a message when no CUDA device is visible.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common.h"
#include "kernels/cuda/dense/elementwise.h"
#include "kernels/cuda/dense/gemm.h"
#include "kernels/cuda/dense/rms_norm.h"
#include "kernels/cuda/dense/rope.h"
#include "kernels/cuda/dense/weight_gen.h"
#include "kernels/cuda/sampling/argmax.h"
#include "kernels/kv_fp8.h"
#include "kernels/reference/ops.h"
#include "kernels/weight_init.h"
#include "tests/gpu_test_util.h"

namespace verifyd::kernels::cuda {
namespace {

using bf16 = bf16_bits;

template <typename T>
using Dev = test_util::DeviceArray<T>;  // tests/gpu_test_util.h

std::vector<float> RandomBf16Values(std::mt19937& rng, size_t n, float scale = 1.f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = RoundToBf16(u(rng));
  return v;
}
std::vector<bf16> ToBf16(const std::vector<float>& v) {
  std::vector<bf16> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = FloatToBf16(v[i]);
  return o;
}
std::vector<float> FromBf16(const std::vector<bf16>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = Bf16ToFloat(v[i]);
  return o;
}
const bf16 kBf16NaN = 0x7fc0;

// Relative L2 error; any NaN / Inf in `got` where ref is finite fails (returns +inf).
double RelL2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    num += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

// A shard of a generated weight tensor: `rows` x `cols` from (row0, col0) of a row-major tensor
// of full_cols columns.
struct Shard {
  int64_t rows, cols, full_cols, row0, col0;
};

// Generation parameters (GenerateWeightsParams or GenerateFp8WeightsParams) of shard `s` of
// tensor `key`, written densely (ld_out = cols) to `out`.
template <typename Params, typename T>
Params ShardParams(uint64_t key, const Shard& s, T* out) {
  Params p;
  p.tensor_key = key;
  p.rows = s.rows;
  p.cols = s.cols;
  p.full_cols = s.full_cols;
  p.row0 = s.row0;
  p.col0 = s.col0;
  p.out = out;
  p.ld_out = s.cols;
  return p;
}

TEST(GpuDense, WeightGenerationIsBitExact) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  for (int trial = 0; trial < 6; ++trial) {
    const uint64_t seed = rng();
    const std::string name = "model.layers." + std::to_string(trial) + ".mlp.down_proj.weight";
    const int64_t full_rows = 40 + rng() % 50, full_cols = 100 + rng() % 300;
    const int64_t row0 = rng() % 10, col0 = rng() % 40;
    const int64_t rows = full_rows - row0 - rng() % 5, cols = full_cols - col0 - rng() % 7;
    const float scale = 1.0f / std::sqrt(static_cast<float>(full_cols)) * (1 + trial);
    const float offset = trial % 2 ? 1.0f : 0.0f;
    const uint64_t key = kernels::WeightTensorKey(seed, kernels::WeightNameHash(name));
    Dev<bf16> out(rows * cols, kBf16NaN);
    GenerateWeightsParams p =
        ShardParams<GenerateWeightsParams>(key, {rows, cols, full_cols, row0, col0}, out.p);
    p.scale = scale;
    p.offset = offset;
    ASSERT_TRUE(GenerateWeightsCuda(p).ok());
    const std::vector<bf16> got = out.Get();
    int64_t mismatches = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float want =
            kernels::WeightValue(key, (row0 + r) * full_cols + col0 + c, scale, offset);
        if (FloatToBf16(want) != got[r * cols + c]) ++mismatches;
      }
    }
    EXPECT_EQ(mismatches, 0) << "trial " << trial << " of " << rows * cols << " values";
  }
}

// FP8-quantized generated weights: the device's codes and block scales, and its bf16 values of
// the same tensor, against the host generator (kernels/weight_init.h WeightFp8Input), on
// shards with a partial last row block and padded scale rows.
TEST(GpuDense, Fp8WeightGenerationIsBitExact) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  for (int trial = 0; trial < 5; ++trial) {
    const std::string name = "model.layers." + std::to_string(trial) + ".mlp.up_proj.weight";
    const uint64_t key = kernels::WeightTensorKey(rng(), kernels::WeightNameHash(name));
    const int64_t full_cols = 128 * (2 + rng() % 4), cols = full_cols - 128 * (rng() % 2);
    const int64_t col0 = full_cols - cols, row0 = 128 * (rng() % 3);
    const int64_t rows = 1 + rng() % 300, scale_ld = cols / 128 + rng() % 3;
    const float fp8_scale = kernels::WeightFp8Scale(0.05f * (1 + trial));
    Dev<uint8_t> codes(rows * cols, 0x7f);  // NaN codes: a skipped element shows
    const int64_t brows = (rows + 127) / 128;
    Dev<float> scales(brows * scale_ld, NAN);
    const Shard shard{rows, cols, full_cols, row0, col0};
    GenerateFp8WeightsParams p = ShardParams<GenerateFp8WeightsParams>(key, shard, codes.p);
    p.fp8_scale = fp8_scale;
    p.scales = scales.p;
    p.scale_ld = scale_ld;
    ASSERT_TRUE(GenerateFp8WeightsCuda(p).ok());
    Dev<bf16> values(rows * cols, kBf16NaN);
    GenerateWeightsParams g = ShardParams<GenerateWeightsParams>(key, shard, values.p);
    g.fp8_scale = fp8_scale;
    ASSERT_TRUE(GenerateWeightsCuda(g).ok());
    const std::vector<uint8_t> got = codes.Get();
    const std::vector<bf16> got_values = values.Get();
    int64_t code_mismatches = 0, value_mismatches = 0, nan_codes = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const uint64_t flat = static_cast<uint64_t>((row0 + r) * full_cols + col0 + c);
        const uint8_t want = kernels::Fp8E4m3FromFloat(kernels::WeightFp8Input(key, flat));
        code_mismatches += got[r * cols + c] != want;
        nan_codes += (got[r * cols + c] & 0x7f) == 0x7f;
        value_mismatches +=
            got_values[r * cols + c] != FloatToBf16(kernels::Fp8E4m3ToFloat(want) * fp8_scale);
      }
    }
    EXPECT_EQ(code_mismatches, 0) << "trial " << trial;
    EXPECT_EQ(value_mismatches, 0) << "trial " << trial;
    EXPECT_EQ(nan_codes, 0) << "trial " << trial;
    const std::vector<float> got_scales = scales.Get();
    for (int64_t b = 0; b < brows; ++b) {
      for (int64_t j = 0; j < scale_ld; ++j) {
        if (j < cols / 128) {
          EXPECT_EQ(got_scales[b * scale_ld + j], fp8_scale) << b << "," << j;
        } else {
          EXPECT_TRUE(std::isnan(got_scales[b * scale_ld + j])) << "padding written " << j;
        }
      }
    }
  }
}

TEST(GpuDense, RmsNormMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  for (int64_t cols : {64, 80, 512, 1536, 7168}) {
    const int64_t rows = 1 + rng() % 70, ld = cols + 8;
    std::vector<float> x = RandomBf16Values(rng, rows * ld, 3.f), w = RandomBf16Values(rng, cols);
    for (auto& v : w) v = RoundToBf16(1.f + 0.1f * v);
    std::vector<float> ref(rows * ld);
    ref::RmsNorm(x.data(), rows, cols, ld, w.data(), 1e-6f, ref.data());
    Dev<float> dx(x);
    Dev<bf16> dw(ToBf16(w));
    Dev<float> yf(rows * ld, NAN);
    Dev<bf16> yb(rows * cols, kBf16NaN);
    RmsNormParams p;
    p.rows = rows;
    p.cols = cols;
    p.x = dx.p;
    p.x_dtype = DType::kFloat32;
    p.ldx = ld;
    p.weight = dw.p;
    p.y = yf.p;
    p.y_dtype = DType::kFloat32;
    p.ldy = ld;
    ASSERT_TRUE(RmsNormCuda(p).ok());
    p.y = yb.p;
    p.y_dtype = DType::kBFloat16;
    p.ldy = cols;
    ASSERT_TRUE(RmsNormCuda(p).ok());
    std::vector<float> gf = yf.Get(), gb = FromBf16(yb.Get()), rf, gf2;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        rf.push_back(ref[r * ld + c]);
        gf2.push_back(gf[r * ld + c]);
      }
    }
    EXPECT_LT(RelL2(gf2, rf), 1e-5) << "cols " << cols;
    EXPECT_LT(RelL2(gb, rf), 8e-3) << "cols " << cols;
  }
}

TEST(GpuDense, RopeAndLatentWriteMatchReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  struct Shape {
    int heads, nope, rope, kv_lora;
  };
  for (const Shape s : {Shape{8, 32, 16, 64}, Shape{16, 128, 64, 512}}) {
    const int rows = 1 + rng() % 100, qk = s.nope + s.rope, lat = s.kv_lora + s.rope;
    const double theta = 10000.0;
    std::vector<int32_t> pos(rows);
    for (auto& p : pos) p = rng() % 200000;
    // Query rope: bf16 q [rows, heads, qk] -> rotated rope part into out [rows, heads, lat].
    std::vector<float> q = RandomBf16Values(rng, rows * s.heads * qk);
    std::vector<float> qref = q;
    ref::ApplyRope(qref.data(), rows, s.heads, qk, s.nope, s.rope, pos.data(), (float)theta);
    Dev<int32_t> dpos(pos);
    const std::vector<float> inv = RopeInvFreq(s.rope, theta);
    Dev<float> dinv(inv), cos_t(rows * s.rope / 2), sin_t(rows * s.rope / 2);
    RopeTableParams tp;
    tp.rows = rows;
    tp.rope_dim = s.rope;
    tp.positions = dpos.p;
    tp.inv_freq = dinv.p;
    tp.cos_table = cos_t.p;
    tp.sin_table = sin_t.p;
    ASSERT_TRUE(RopeTableCuda(tp).ok());
    Dev<bf16> dq(ToBf16(q)), dout(rows * s.heads * lat, kBf16NaN);
    QRopeParams qp;
    qp.rows = rows;
    qp.heads = s.heads;
    qp.rope_dim = s.rope;
    qp.in = dq.p;
    qp.in_head_stride = qk;
    qp.in_offset = s.nope;
    qp.out = dout.p;
    qp.out_head_stride = lat;
    qp.out_offset = s.kv_lora;
    qp.cos_table = cos_t.p;
    qp.sin_table = sin_t.p;
    ASSERT_TRUE(QRopeCuda(qp).ok());
    const std::vector<float> got = FromBf16(dout.Get());
    std::vector<float> g, r;
    for (int i = 0; i < rows * s.heads; ++i) {
      for (int j = 0; j < s.rope; ++j) {
        g.push_back(got[i * lat + s.kv_lora + j]);
        r.push_back(qref[i * qk + s.nope + j]);
      }
    }
    EXPECT_LT(RelL2(g, r), 8e-3) << "query rope, rope " << s.rope;
    // The columns the rope does not own stay untouched (NaN poison).
    EXPECT_TRUE(std::isnan(got[0])) << "query rope wrote outside its columns";

    // Latent write: kva [rows, lat] fp32 -> norm + rope -> cache[slots[r]].
    std::vector<float> kva = RandomBf16Values(rng, rows * lat, 2.f),
                       w = RandomBf16Values(rng, s.kv_lora);
    for (auto& v : w) v = RoundToBf16(1.f + 0.1f * v);
    std::vector<float> kref = kva;
    ref::RmsNorm(kref.data(), rows, s.kv_lora, lat, w.data(), 1e-6f, kref.data());
    ref::ApplyRope(kref.data(), rows, 1, lat, s.kv_lora, s.rope, pos.data(), (float)theta);
    const int kv_slots = rows * 3;
    std::vector<int32_t> slots(kv_slots);
    for (int i = 0; i < kv_slots; ++i) slots[i] = i;
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(rows);
    Dev<float> dkva(kva);
    Dev<bf16> dw(ToBf16(w)), cache(static_cast<size_t>(kv_slots) * lat, kBf16NaN);
    Dev<int32_t> dslots(slots);
    LatentKvWriteParams lp;
    lp.rows = rows;
    lp.kv_lora = s.kv_lora;
    lp.rope_dim = s.rope;
    lp.kva = dkva.p;
    lp.ld_kva = lat;
    lp.kv_norm_weight = dw.p;
    lp.cos_table = cos_t.p;
    lp.sin_table = sin_t.p;
    lp.slots = dslots.p;
    lp.cache = cache.p;
    lp.kv_slots = kv_slots;
    ASSERT_TRUE(LatentKvWriteCuda(lp).ok());
    const std::vector<float> c = FromBf16(cache.Get());
    std::vector<float> cg;
    std::vector<char> written(kv_slots, 0);
    for (int i = 0; i < rows; ++i) {
      written[slots[i]] = 1;
      for (int j = 0; j < lat; ++j) cg.push_back(c[int64_t{slots[i]} * lat + j]);
    }
    EXPECT_LT(RelL2(cg, kref), 8e-3) << "latent write, kv_lora " << s.kv_lora;
    for (int sl = 0; sl < kv_slots; ++sl) {
      if (!written[sl]) {
        ASSERT_TRUE(std::isnan(c[int64_t{sl} * lat])) << "slot " << sl << " written";
      }
    }

    // The same rows into an FP8 cache (kernels/kv_fp8.h), poisoned 0xff: the rope part equals
    // the bf16 write's bit for bit, each group's scale is its largest |value| / 448 (bf16 write's
    // values: within one bf16 rounding), every c_kv value within half an e4m3 step of the bf16
    // write's (+ its rounding), unwritten rows untouched.
    const int64_t rb = KvFp8RowBytes(s.kv_lora, s.rope, kKvFp8Group);
    Dev<uint8_t> cache8(static_cast<size_t>(kv_slots * rb), 0xff);
    lp.cache = cache8.p;
    lp.fp8 = true;
    ASSERT_TRUE(LatentKvWriteCuda(lp).ok());
    const std::vector<uint8_t> c8 = cache8.Get();
    std::vector<float> row(lat);
    for (int i = 0; i < rows; ++i) {
      const uint8_t* stored = c8.data() + int64_t{slots[i]} * rb;
      KvFp8DecodeRow(stored, s.kv_lora, s.rope, kKvFp8Group, row.data());
      const float* b = c.data() + int64_t{slots[i]} * lat;
      for (int j = s.kv_lora; j < lat; ++j) ASSERT_EQ(row[j], b[j]) << "rope " << j;
      for (int g0 = 0; g0 < s.kv_lora; g0 += kKvFp8Group) {
        const int g1 = std::min(g0 + kKvFp8Group, s.kv_lora);
        float amax = 0.f, scale = 0.f;
        for (int j = g0; j < g1; ++j) amax = std::max(amax, std::fabs(b[j]));
        std::memcpy(&scale, stored + s.kv_lora + 4 * (g0 / kKvFp8Group), 4);
        EXPECT_NEAR(scale, amax / kE4m3Max, amax / kE4m3Max * 8e-3) << "group " << g0;
        for (int j = g0; j < g1; ++j) {
          const float bound =
              std::max(std::fabs(b[j]) / 16.f, scale / 1024.f) * 1.01f + std::fabs(b[j]) / 128.f;
          ASSERT_LE(std::fabs(row[j] - b[j]), bound) << "c_kv " << j << " row " << i;
        }
      }
    }
    for (int sl = 0; sl < kv_slots; ++sl) {
      if (!written[sl]) {
        for (int64_t j = 0; j < rb; ++j) ASSERT_EQ(c8[sl * rb + j], 0xff) << "slot " << sl;
      }
    }
  }
}

// The GPU's FP8 encoder (KvFp8EncodeRowsCuda; the KV write shares its code) stores exactly the
// bytes of the host's KvFp8EncodeRow: random bf16 rows of several magnitudes, a zero group, a
// group with one huge value, subnormal-scale values.
TEST(GpuDense, KvFp8EncodeIsTheHostFormat) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(15);
  for (const int kv_lora : {512, 64, 200}) {
    const int rope = 64, lat = kv_lora + rope, rows = 257;
    std::vector<float> v(static_cast<size_t>(rows) * lat);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int r = 0; r < rows; ++r) {
      const float mag = std::ldexp(1.f, static_cast<int>(rng() % 30) - 20);
      for (int j = 0; j < lat; ++j) v[r * lat + j] = RoundToBf16(nd(rng) * mag);
    }
    for (int j = 0; j < std::min(kv_lora, 128); ++j) v[j] = 0.f;  // row 0: a zero group
    v[lat + 5] = RoundToBf16(3e4f);                               // row 1: one huge value
    Dev<bf16> in(ToBf16(v));
    const int64_t rb = KvFp8RowBytes(kv_lora, rope, kKvFp8Group);
    Dev<uint8_t> out(static_cast<size_t>(rows * rb), 0xab);
    KvFp8EncodeRowsParams p;
    p.rows = rows;
    p.kv_lora = kv_lora;
    p.rope_dim = rope;
    p.in = in.p;
    p.ld_in = lat;
    p.out = out.p;
    ASSERT_TRUE(KvFp8EncodeRowsCuda(p).ok());
    const std::vector<uint8_t> got = out.Get();
    std::vector<uint8_t> want(static_cast<size_t>(rb));
    int64_t differing = 0;
    for (int r = 0; r < rows; ++r) {
      KvFp8EncodeRow(v.data() + r * lat, kv_lora, rope, kKvFp8Group, want.data());
      differing += std::memcmp(want.data(), got.data() + r * rb, rb) != 0;
    }
    EXPECT_EQ(differing, 0) << "kv_lora " << kv_lora;
  }
  KvFp8EncodeRowsParams bad;
  bad.rows = 1;
  bad.kv_lora = 30;
  bad.rope_dim = 64;
  bad.ld_in = 94;
  bad.in = reinterpret_cast<const bf16*>(16);
  bad.out = reinterpret_cast<void*>(16);
  EXPECT_EQ(KvFp8EncodeRowsCuda(bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST(GpuDense, SwiGluAddGatherMatchReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  const int rows = 37, n = 300, vocab = 97, hidden = 130;
  std::vector<float> gu = RandomBf16Values(rng, rows * 2 * n, 6.f);
  std::vector<float> ref(rows * n);
  for (int r = 0; r < rows; ++r) {
    ref::SwiGlu(gu.data() + r * 2 * n, gu.data() + r * 2 * n + n, 1, n, n, ref.data() + r * n);
  }
  Dev<float> dgu(gu);
  Dev<bf16> out(rows * n, kBf16NaN);
  SwiGluParams sp;
  sp.rows = rows;
  sp.n = n;
  sp.gate_up = dgu.p;
  sp.ld_in = 2 * n;
  sp.up_offset = n;
  sp.out = out.p;
  sp.ld_out = n;
  ASSERT_TRUE(SwiGluCuda(sp).ok());
  EXPECT_LT(RelL2(FromBf16(out.Get()), ref), 8e-3);

  std::vector<float> y = RandomBf16Values(rng, 1000), x = RandomBf16Values(rng, 1000), yr = y;
  ref::AddInPlace(yr.data(), x.data(), 1000);
  Dev<float> dy(y), dx(x);
  ASSERT_TRUE(AddInPlaceCuda(dy.p, dx.p, 1000, nullptr).ok());
  EXPECT_EQ(dy.Get(), yr);  // one fp32 add per element: bit-exact

  std::vector<float> table = RandomBf16Values(rng, vocab * hidden);
  std::vector<int32_t> tok(rows);
  for (auto& t : tok) t = rng() % vocab;
  Dev<bf16> dt(ToBf16(table));
  Dev<int32_t> dtok(tok);
  Dev<float> emb(rows * hidden, NAN);
  EmbeddingGatherParams ep;
  ep.rows = rows;
  ep.hidden = hidden;
  ep.tokens = dtok.p;
  ep.table = dt.p;
  ep.out = emb.p;
  ASSERT_TRUE(EmbeddingGatherCuda(ep).ok());
  const std::vector<float> e = emb.Get();
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < hidden; ++j) ASSERT_EQ(e[r * hidden + j], table[tok[r] * hidden + j]);
  }
  // Vocab-parallel: a slice of the rows; tokens outside it give zeros, and the slices of a
  // partition sum to the whole gather.
  std::vector<float> sum(rows * hidden, 0.f);
  const int64_t cut[] = {0, vocab / 3, vocab / 3 + 1, vocab};
  for (int k = 0; k < 3; ++k) {
    const int64_t b0 = cut[k], n = cut[k + 1] - cut[k];
    Dev<bf16> slice(
        ToBf16(std::vector<float>(table.begin() + b0 * hidden, table.begin() + (b0 + n) * hidden)));
    emb.Put(std::vector<float>(rows * hidden, NAN));
    ep.table = slice.p;
    ep.vocab_begin = b0;
    ep.vocab_rows = n;
    ASSERT_TRUE(EmbeddingGatherCuda(ep).ok());
    const std::vector<float> part = emb.Get();
    for (int r = 0; r < rows; ++r) {
      const bool in = tok[r] >= b0 && tok[r] < b0 + n;
      for (int j = 0; j < hidden; ++j) {
        ASSERT_EQ(part[r * hidden + j], in ? table[tok[r] * hidden + j] : 0.f) << k << " " << r;
        sum[r * hidden + j] += part[r * hidden + j];
      }
    }
  }
  EXPECT_EQ(sum, e);
}

TEST(GpuDense, VocabParallelArgmaxMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(15);
  const int rows = 50, vocab = 3001;
  for (int world : {1, 2, 3, 4}) {
    // Values from a small set: many ties, across shards too; some NaN; one all-NaN row.
    std::vector<float> logits(rows * vocab);
    for (auto& v : logits) v = static_cast<float>(static_cast<int>(rng() % 50)) * 0.25f;
    for (int i = 0; i < 500; ++i) logits[rng() % logits.size()] = NAN;
    for (int j = 0; j < vocab; ++j) logits[7 * vocab + j] = NAN;  // row 7: no value at all
    std::vector<float> want_v(rows);
    std::vector<int32_t> want_i(rows);
    ref::ArgmaxRows(logits.data(), rows, vocab, vocab, 0, want_v.data(), want_i.data());
    const int64_t per = (vocab + world - 1) / world;
    std::vector<ArgmaxPair> all;
    for (int k = 0; k < world; ++k) {
      const int64_t b = std::min<int64_t>(vocab, per * k),
                    e = std::min<int64_t>(vocab, per * (k + 1));
      std::vector<float> shard(rows * per, NAN);
      for (int r = 0; r < rows; ++r) {
        for (int64_t j = b; j < e; ++j) shard[r * per + (j - b)] = logits[r * vocab + j];
      }
      Dev<float> ds(shard);
      Dev<ArgmaxPair> pairs(rows);
      ArgmaxRowsParams p;
      p.rows = rows;
      p.n = e - b;
      p.logits = ds.p;
      p.ld = per;
      p.index_offset = b;
      p.out = pairs.p;
      ASSERT_TRUE(ArgmaxRowsCuda(p).ok());
      const std::vector<ArgmaxPair> got = pairs.Get();
      all.insert(all.end(), got.begin(), got.end());
    }
    Dev<ArgmaxPair> g(all);
    Dev<int32_t> pred(rows, -777);
    ArgmaxCombineParams cp;
    cp.rows = rows;
    cp.world = world;
    cp.gathered = g.p;
    cp.predictions = pred.p;
    ASSERT_TRUE(ArgmaxCombineCuda(cp).ok());
    EXPECT_EQ(pred.Get(), want_i) << "world " << world;
  }
}

// W_UK absorption's batched GEMM (the absorbed-MLA layout, heads interleaved in the rows): for
// each of `heads` heads h, y[m, h, kvl] = q[m, h, :nope] . w_h[nope, kvl] with q rows of qk
// values per head and w_h = w + h * stride_w (not transposed).
BatchedGemmParams AbsorbWukParams(int heads, int64_t m, int64_t nope, int64_t kvl, int64_t qk,
                                  const bf16* q, const bf16* w, int64_t stride_w, bf16* y) {
  BatchedGemmParams bp;
  bp.batch = heads;
  bp.m = m;
  bp.n = kvl;
  bp.k = nope;
  bp.x = q;
  bp.ldx = heads * qk;
  bp.stride_x = qk;
  bp.w = w;
  bp.ldw = kvl;
  bp.stride_w = stride_w;
  bp.w_transposed = false;
  bp.y = y;
  bp.ldy = heads * kvl;
  bp.stride_y = kvl;
  return bp;
}

TEST(GpuDense, GemmsMatchReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(16);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape s : {Shape{1, 64, 128}, Shape{65, 576, 7168 / 4}, Shape{130, 1000, 256}}) {
    std::vector<float> x = RandomBf16Values(rng, s.m * s.k), w = RandomBf16Values(rng, s.n * s.k);
    std::vector<float> y0 = RandomBf16Values(rng, s.m * s.n), ref(s.m * s.n);
    ref::Linear(x.data(), s.m, s.k, s.k, w.data(), s.n, ref.data(), s.n);
    Dev<bf16> dx(ToBf16(x)), dw(ToBf16(w));
    Dev<float> dy(y0);
    GemmParams p;
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.x = dx.p;
    p.ldx = s.k;
    p.w = dw.p;
    p.ldw = s.k;
    p.y = dy.p;
    p.ldy = s.n;
    p.beta = 1.f;  // accumulate into y0 (the residual form)
    ASSERT_TRUE(GemmBf16(h, p).ok());
    std::vector<float> want = ref;
    for (size_t i = 0; i < want.size(); ++i) want[i] += y0[i];
    EXPECT_LT(RelL2(dy.Get(), want), 1e-5) << "m " << s.m << " n " << s.n << " k " << s.k;
  }
  // Batched, both layouts: the absorbed-MLA products at tiny-ish sizes.
  const int heads = 4;
  const int64_t m = 33, nope = 32, kvl = 64, v = 16, qk = 48;
  std::vector<float> q = RandomBf16Values(rng, m * heads * qk),
                     kvb = RandomBf16Values(rng, heads * (nope + v) * kvl);
  Dev<bf16> dq(ToBf16(q)), dkvb(ToBf16(kvb)), dqlat(m * heads * kvl);
  BatchedGemmParams bp =
      AbsorbWukParams(heads, m, nope, kvl, qk, dq.p, dkvb.p, (nope + v) * kvl, dqlat.p);
  ASSERT_TRUE(GemmBf16Batched(h, bp).ok());
  std::vector<float> want(m * heads * kvl, 0.f);
  for (int64_t r = 0; r < m; ++r)
    for (int hh = 0; hh < heads; ++hh)
      for (int64_t j = 0; j < kvl; ++j) {
        float acc = 0;
        for (int64_t d = 0; d < nope; ++d)
          acc += q[(r * heads + hh) * qk + d] * kvb[(hh * (nope + v) + d) * kvl + j];
        want[(r * heads + hh) * kvl + j] = acc;
      }
  EXPECT_LT(RelL2(FromBf16(dqlat.Get()), want), 8e-3) << "absorb W_UK";
  std::vector<float> ol = RandomBf16Values(rng, m * heads * kvl);
  Dev<bf16> dol(ToBf16(ol)), dattn(m * heads * v);
  bp.n = v;
  bp.k = kvl;
  bp.x = dol.p;
  bp.ldx = heads * kvl;
  bp.stride_x = kvl;
  bp.w = dkvb.p + nope * kvl;
  bp.ldw = kvl;
  bp.w_transposed = true;
  bp.y = dattn.p;
  bp.ldy = heads * v;
  bp.stride_y = v;
  ASSERT_TRUE(GemmBf16Batched(h, bp).ok());
  std::vector<float> want2(m * heads * v);
  for (int64_t r = 0; r < m; ++r)
    for (int hh = 0; hh < heads; ++hh)
      for (int64_t i = 0; i < v; ++i) {
        float acc = 0;
        for (int64_t j = 0; j < kvl; ++j)
          acc += ol[(r * heads + hh) * kvl + j] * kvb[(hh * (nope + v) + nope + i) * kvl + j];
        want2[(r * heads + hh) * v + i] = acc;
      }
  EXPECT_LT(RelL2(FromBf16(dattn.Get()), want2), 8e-3) << "W_UV";
  cublasDestroy(h);
}

// Batch-invariant GEMMs (gemm.h EnableFixedGemmAlgorithms, the engine's default): the first
// rows of a call are bit-identical whatever the call's row count (1 to 2,080: every row class,
// each served by its own algorithm), dense and batched (the absorbed-MLA layout), with the
// output buffers poisoned (NaN) before every call; and the results stay within the reference.
TEST(GpuDense, BatchInvariantGemmRowsDoNotDependOnTheRowCount) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(29);
  cublasHandle_t h;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  constexpr int64_t kMaxRows = 2080;
  constexpr size_t kWs = size_t{32} << 20;
  Dev<char> ws(kWs);
  ASSERT_TRUE(EnableFixedGemmAlgorithms(h, ws.p, kWs, kMaxRows).ok());
  constexpr int64_t kProbe = 3;  // rows compared; the first call has exactly these rows
  const std::vector<int64_t> row_counts = {kProbe, 1, 17, 64, 65, 200, 257, 700, 1025, kMaxRows};
  // Dense: y[m, n] = x[m, k] . w[n, k]^T, fp32 out.
  const int64_t n = 1536, k = 1024;
  std::vector<float> x = RandomBf16Values(rng, kMaxRows * k), w = RandomBf16Values(rng, n * k);
  Dev<bf16> dx(ToBf16(x)), dw(ToBf16(w));
  Dev<float> dy(kMaxRows * n);
  std::vector<float> first;
  for (const int64_t m : row_counts) {
    ASSERT_EQ(cudaMemset(dy.p, 0xff, kMaxRows * n * sizeof(float)), cudaSuccess);  // NaN
    ASSERT_TRUE(GemmBf16Packed(h, m, dx.p, k, dw.p, n, dy.p).ok()) << m;
    std::vector<float> y = dy.Get();
    const int64_t rows = std::min(m, kProbe);
    if (first.empty()) {
      std::vector<float> ref(n);
      ref::Linear(x.data(), 1, k, k, w.data(), n, ref.data(), n);
      EXPECT_LT(RelL2(std::vector<float>(y.begin(), y.begin() + n), ref), 1e-5);
      first.assign(y.begin(), y.begin() + kProbe * n);
    }
    EXPECT_EQ(std::memcmp(y.data(), first.data(), rows * n * sizeof(float)), 0)
        << "dense rows changed bits at m = " << m;
    for (int64_t i = m * n; i < std::min<int64_t>(kMaxRows, m + 1) * n; ++i) {
      ASSERT_TRUE(std::isnan(y[i])) << "wrote past row " << m;
    }
  }
  // Batched (W_UK absorption's layout: heads interleaved in the rows), bf16 out.
  const int heads = 8;
  const int64_t nope = 128, kvl = 512, qk = 192;
  std::vector<float> q = RandomBf16Values(rng, kMaxRows * heads * qk),
                     kvb = RandomBf16Values(rng, heads * nope * kvl, 0.1f);
  Dev<bf16> dq(ToBf16(q)), dkvb(ToBf16(kvb)), dout(kMaxRows * heads * kvl);
  std::vector<bf16> bfirst;
  for (const int64_t m : row_counts) {
    ASSERT_EQ(cudaMemset(dout.p, 0xff, kMaxRows * heads * kvl * sizeof(bf16)), cudaSuccess);
    const BatchedGemmParams bp =
        AbsorbWukParams(heads, m, nope, kvl, qk, dq.p, dkvb.p, nope * kvl, dout.p);
    ASSERT_TRUE(GemmBf16Batched(h, bp).ok()) << m;
    std::vector<bf16> y = dout.Get();
    const int64_t rows = std::min(m, kProbe);
    if (bfirst.empty()) bfirst.assign(y.begin(), y.begin() + kProbe * heads * kvl);
    EXPECT_EQ(std::memcmp(y.data(), bfirst.data(), rows * heads * kvl * sizeof(bf16)), 0)
        << "batched rows changed bits at m = " << m;
  }
  // Every row class was given an algorithm bit-equal to the reference (or kept it).
  const std::vector<GemmRowClassChoice> choices = FixedGemmChoices(h);
  EXPECT_GE(choices.size(), 2u * 8);
  for (const GemmRowClassChoice& c : choices) {
    EXPECT_TRUE(c.candidate == 0 || c.equal_candidates == 1) << c.n << "x" << c.k << " " << c.max_m;
  }
  DisableFixedGemmAlgorithms(h);
  cublasDestroy(h);
}

TEST(GpuDense, LaunchersRejectBadShapes) {
  // Host-side validation only: runs without a GPU too.
  RmsNormParams p;
  p.rows = 2;
  p.cols = 0;
  EXPECT_EQ(RmsNormCuda(p).code(), absl::StatusCode::kInvalidArgument);
  QRopeParams q;
  q.rope_dim = 3;
  EXPECT_EQ(QRopeCuda(q).code(), absl::StatusCode::kInvalidArgument);
  GemmParams g;
  g.m = 2;
  g.n = 4;
  g.k = 8;
  g.ldx = 4;  // < k
  EXPECT_EQ(GemmBf16(reinterpret_cast<void*>(1), g).code(), absl::StatusCode::kInvalidArgument);
  GenerateWeightsParams w;
  w.rows = 1;
  w.cols = 10;
  w.full_cols = 5;
  w.ld_out = 10;
  w.out = reinterpret_cast<bf16*>(8);
  EXPECT_EQ(GenerateWeightsCuda(w).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace verifyd::kernels::cuda
