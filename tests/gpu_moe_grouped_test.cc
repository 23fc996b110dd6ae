// The MoE layer's grouped expert GEMMs (kernels/cuda/moe/grouped_gemm.h), FP8 activation
// quantization (moe.h) and the FP8 SwiGLU MLP of dense layers and shared experts (moe_mlp.h
// RunFp8Mlp) against host references, on fresh random inputs: group sizes with
// empty groups, single rows and several M tiles; output rows past the last group poisoned
// (NaN) and checked untouched.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/common.h"
#include "kernels/cuda/fp8/fp8_gemm.h"
#include "kernels/cuda/moe/grouped_gemm.h"
#include "kernels/cuda/moe/moe.h"
#include "kernels/cuda/moe/moe_mlp.h"
#include "kernels/kv_fp8.h"
#include "tests/gpu_test_util.h"

namespace verifyd {
namespace {

namespace kc = kernels::cuda;

using kernels::Bf16ToFloat;
using kernels::FloatToBf16;
// float8_e4m3fn: kernels/common.h decodes it; kernels/kv_fp8.h encodes to the nearest finite
// code (ties to the even code), saturating at +-448, as the device's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) does (kernels_kv_fp8_test checks that
// encoder against an exhaustive nearest-code search).
using kernels::Fp8E4m3FromFloat;
using kernels::Fp8E4m3ToFloat;

template <typename T>
T* ToDevice(const std::vector<T>& v) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return static_cast<T*>(p);
}
template <typename T>
std::vector<T> ToHost(const T* p, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}

// Group sizes: empty groups, a single row, one over two 128-row tiles.
std::vector<int32_t> Offsets(int groups, std::mt19937& rng) {
  std::vector<int32_t> sizes(groups);
  std::uniform_int_distribution<int> d(0, 40);
  for (int g = 0; g < groups; ++g) sizes[g] = d(rng);
  sizes[0] = 0;
  sizes[1] = 1;
  sizes[groups / 2] = 0;
  sizes[groups - 2] = 261;
  std::vector<int32_t> off(groups + 1, 0);
  for (int g = 0; g < groups; ++g) off[g + 1] = off[g] + sizes[g];
  return off;
}

struct Compare {
  double rel_l2 = 0, max_abs = 0, ref_max = 0;
  int64_t nonfinite = 0;
};
Compare CompareRows(const std::vector<float>& got, const std::vector<double>& ref) {
  Compare c;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++c.nonfinite;
      continue;
    }
    const double e = got[i] - ref[i];
    num += e * e;
    den += ref[i] * ref[i];
    c.max_abs = std::max(c.max_abs, std::fabs(e));
    c.ref_max = std::max(c.ref_max, std::fabs(ref[i]));
  }
  c.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  return c;
}

// Rows [from, to) of `got` (rows of n values) still hold the NaN poison; `past` names what
// they lie past.
void ExpectRowsPoisoned(const std::vector<float>& got, int64_t from, int64_t to, int64_t n,
                        const std::string& past) {
  for (int64_t i = from * n; i < to * n; ++i) {
    ASSERT_TRUE(std::isnan(got[i])) << "row " << i / n << " past " << past << " was written";
  }
}

// act_quant's scale of a 128-column group whose largest magnitude is amax.
float ActQuantScale(float amax) { return std::max(amax, 1e-10f) / 448.f; }

// One bf16 row x quantized as act_quant does, per 128 columns: its scale s[g] bit-exact and
// every code q[j] the nearest e4m3 of x[j] / s[g].
void ExpectActQuantRow(const uint16_t* x, const uint8_t* q, const float* s, int64_t groups,
                       const std::string& what) {
  for (int64_t g = 0; g < groups; ++g) {
    float amax = 0;
    for (int64_t j = g * 128; j < (g + 1) * 128; ++j) {
      amax = std::max(amax, std::fabs(Bf16ToFloat(x[j])));
    }
    const float want_s = ActQuantScale(amax);
    ASSERT_EQ(s[g], want_s) << "scale of " << what << " group " << g;
    for (int64_t j = g * 128; j < (g + 1) * 128; ++j) {
      ASSERT_EQ(q[j], Fp8E4m3FromFloat(Bf16ToFloat(x[j]) / want_s)) << what << " col " << j;
    }
  }
}

// n random e4m3 codes, every finite one possible (no NaN code 0x7f / 0xff).
std::vector<uint8_t> RandomE4m3(std::mt19937& rng, int64_t n) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> v(n);
  for (auto& c : v) {
    do c = static_cast<uint8_t>(byte(rng));
    while ((c & 0x7f) == 0x7f);
  }
  return v;
}

// fp64 reference of the block-scaled grouped GEMM (grouped_gemm.h kFp8Block128): for group g
// and its rows [off[g], off[g + 1]), d[r, j] = sum over 128-deep k blocks q of
// a_scale[r, q] * b_scale[g, j / 128, q] * (e4m3 a . e4m3 b over the block).
std::vector<double> BlockScaledGemmRef(const std::vector<int32_t>& off,
                                       const std::vector<uint8_t>& a, const std::vector<float>& sa,
                                       const std::vector<uint8_t>& b, const std::vector<float>& sb,
                                       int64_t n, int64_t k) {
  const int64_t kb = k / 128, nb = n / 128;
  const int groups = static_cast<int>(off.size()) - 1;
  std::vector<double> ref(static_cast<size_t>(off[groups]) * n);
  for (int g = 0; g < groups; ++g) {
    for (int64_t r = off[g]; r < off[g + 1]; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < kb; ++q) {
          double part = 0;
          for (int64_t t = q * 128; t < (q + 1) * 128; ++t) {
            part += static_cast<double>(Fp8E4m3ToFloat(a[r * k + t])) *
                    Fp8E4m3ToFloat(b[(static_cast<int64_t>(g) * n + j) * k + t]);
          }
          s += part * sa[r * kb + q] * sb[(static_cast<int64_t>(g) * nb + j / 128) * kb + q];
        }
        ref[r * n + j] = s;
      }
    }
  }
  return ref;
}

class GroupedGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    if (!kc::GroupedGemmAvailable(0)) GTEST_SKIP() << "grouped GEMMs need an sm_90 GPU";
  }
};

TEST_F(GroupedGemmTest, Bf16MatchesReference) {
  std::mt19937 rng(std::random_device{}());
  const int G = 12;
  const int64_t n = 384, k = 640;
  const std::vector<int32_t> off = Offsets(G, rng);
  const int64_t rows = off[G], pad = 7;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> a(rows * k), b(G * n * k);
  for (auto& v : a) v = FloatToBf16(nd(rng));
  for (auto& v : b) v = FloatToBf16(nd(rng) * 0.05f);
  int32_t* d_off = ToDevice(off);
  uint16_t* d_a = ToDevice(a);
  uint16_t* d_b = ToDevice(b);
  float* d_d = nullptr;
  CUDA_ASSERT(cudaMalloc(reinterpret_cast<void**>(&d_d), (rows + pad) * n * sizeof(float)));
  CUDA_ASSERT(cudaMemset(d_d, 0xFF, (rows + pad) * n * sizeof(float)));

  kc::GroupedGemmShape shape{kc::GroupedGemmKind::kBf16, G, n, k, 0};
  auto gemm = kc::GroupedGemm::Create(shape);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  kc::GroupedGemmArgs args;
  args.offsets = d_off;
  args.a = d_a;
  args.b = d_b;
  args.d = d_d;
  // Twice: the second run reuses the initialized kernel with rewritten arguments.
  for (int run = 0; run < 2; ++run) ASSERT_TRUE((*gemm)->Run(args).ok());
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<float> got = ToHost(d_d, (rows + pad) * n);

  std::vector<double> ref(rows * n);
  for (int g = 0; g < G; ++g) {
    for (int64_t r = off[g]; r < off[g + 1]; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t t = 0; t < k; ++t) {
          s += static_cast<double>(Bf16ToFloat(a[r * k + t])) *
               Bf16ToFloat(b[(static_cast<int64_t>(g) * n + j) * k + t]);
        }
        ref[r * n + j] = s;
      }
    }
  }
  const Compare c = CompareRows(got, ref);
  EXPECT_EQ(c.nonfinite, 0);
  std::printf("bf16 grouped gemm vs fp64 reference: rel-L2 %.3g, max abs %.3g of %.3g\n", c.rel_l2,
              c.max_abs, c.ref_max);
  EXPECT_LT(c.rel_l2, 1e-5) << "max abs " << c.max_abs << " of " << c.ref_max;
  ASSERT_NO_FATAL_FAILURE(ExpectRowsPoisoned(got, rows, rows + pad, n, "the last group"));
  cudaFree(d_off);
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFree(d_d);
}

TEST_F(GroupedGemmTest, Fp8BlockScaledMatchesReference) {
  std::mt19937 rng(std::random_device{}());
  const int G = 10;
  const int64_t n = 256, k = 512, kb = k / 128, nb = n / 128;
  const std::vector<int32_t> off = Offsets(G, rng);
  const int64_t rows = off[G], pad = 5;
  std::uniform_real_distribution<float> sc(0.25f, 4.f);
  const std::vector<uint8_t> a = RandomE4m3(rng, rows * k), b = RandomE4m3(rng, G * n * k);
  std::vector<float> sa(rows * kb), sb(G * nb * kb);
  for (auto& v : sa) v = sc(rng) / 448.f;
  for (auto& v : sb) v = sc(rng) / 448.f;
  int32_t* d_off = ToDevice(off);
  uint8_t* d_a = ToDevice(a);
  uint8_t* d_b = ToDevice(b);
  float* d_sa = ToDevice(sa);
  float* d_sb = ToDevice(sb);
  float* d_d = nullptr;
  CUDA_ASSERT(cudaMalloc(reinterpret_cast<void**>(&d_d), (rows + pad) * n * sizeof(float)));
  CUDA_ASSERT(cudaMemset(d_d, 0xFF, (rows + pad) * n * sizeof(float)));

  kc::GroupedGemmShape shape{kc::GroupedGemmKind::kFp8Block128, G, n, k, 0};
  const std::vector<double> ref = BlockScaledGemmRef(off, a, sa, b, sb, n, k);
  std::vector<float> first;
  for (const int tile_m : {128, 64}) {
    CUDA_ASSERT(cudaMemset(d_d, 0xFF, (rows + pad) * n * sizeof(float)));
    shape.tile_m = tile_m;
    auto gemm = kc::GroupedGemm::Create(shape);
    ASSERT_TRUE(gemm.ok()) << gemm.status();
    kc::GroupedGemmArgs args;
    args.offsets = d_off;
    args.a = d_a;
    args.a_scale = d_sa;
    args.b = d_b;
    args.b_scale = d_sb;
    args.d = d_d;
    ASSERT_TRUE((*gemm)->Run(args).ok());
    CUDA_ASSERT(cudaDeviceSynchronize());
    const std::vector<float> got = ToHost(d_d, (rows + pad) * n);
    const Compare c = CompareRows(got, ref);
    EXPECT_EQ(c.nonfinite, 0) << "tile_m " << tile_m;
    // Hopper's FP8 MMA accumulates with limited precision (about 14 bits, per DeepSeek-V3's
    // report) inside each 128-deep block before the fp32 promotion: ~1e-3 relative.
    std::printf(
        "fp8 grouped gemm (tile_m %d) vs fp64 reference: rel-L2 %.3g, max abs %.3g of "
        "%.3g\n",
        tile_m, c.rel_l2, c.max_abs, c.ref_max);
    EXPECT_LT(c.rel_l2, 3e-3) << "tile_m " << tile_m;
    ASSERT_NO_FATAL_FAILURE(ExpectRowsPoisoned(got, rows, rows + pad, n, "the last group"));
    // Both tilings give each output element the same k-block order: equal results.
    if (first.empty()) {
      first = got;
    } else {
      int64_t differ = 0;
      for (int64_t i = 0; i < rows * n; ++i) differ += std::memcmp(&got[i], &first[i], 4) != 0;
      std::printf("fp8 grouped gemm: tile_m 64 vs 128: %lld of %lld outputs differ in bits\n",
                  static_cast<long long>(differ), static_cast<long long>(rows * n));
    }
  }
  // Bad shapes are refused, naming the field.
  kc::GroupedGemmShape bad = shape;
  bad.n = 192;  // a multiple of 16, not of 128
  auto refused = kc::GroupedGemm::Create(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("multiples of 128"), std::string::npos);
  cudaFree(d_off);
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFree(d_sa);
  cudaFree(d_sb);
  cudaFree(d_d);
}

// The FP8 activation quantization (gather and SwiGLU forms) against the host's
// act_quant: scales bit-exact, codes exact (gather) or within one code step (SwiGLU: the
// device expf may differ from the host's by an ulp).
TEST(MoeQuantFp8Test, GatherAndSwiGluMatchHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(std::random_device{}());
  const int64_t R = 37, cols = 384, groups = cols / 128, n = 53;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(R * cols);
  for (auto& v : x) v = FloatToBf16(nd(rng) * 3.f);
  for (int64_t j = 128; j < 256; ++j) x[5 * cols + j] = 0;  // an all-zero group
  std::vector<int32_t> perm(n);
  std::uniform_int_distribution<int> pr(0, R - 1);
  for (auto& v : perm) v = pr(rng);
  uint16_t* d_x = ToDevice(x);
  int32_t* d_perm = ToDevice(perm);
  uint8_t* d_q = nullptr;
  float* d_s = nullptr;
  CUDA_ASSERT(cudaMalloc(reinterpret_cast<void**>(&d_q), n * cols));
  CUDA_ASSERT(cudaMalloc(reinterpret_cast<void**>(&d_s), n * groups * sizeof(float)));
  kc::MoeGatherQuantFp8Params p;
  p.n = n;
  p.cols = cols;
  p.x = d_x;
  p.ldx = cols;
  p.perm_rows = d_perm;
  p.out = d_q;
  p.out_scale = d_s;
  ASSERT_TRUE(kc::MoeGatherQuantFp8Cuda(p).ok());
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<uint8_t> q = ToHost(d_q, n * cols);
  const std::vector<float> s = ToHost(d_s, n * groups);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NO_FATAL_FAILURE(ExpectActQuantRow(&x[perm[i] * cols], &q[i * cols], &s[i * groups],
                                              groups, absl::StrCat("row ", i)));
  }
  // SwiGLU form.
  std::vector<float> gu(R * 2 * cols);
  for (auto& v : gu) v = nd(rng) * 2.f;
  float* d_gu = ToDevice(gu);
  kc::SwiGluQuantFp8Params w;
  w.rows = R;
  w.cols = cols;
  w.gate_up = d_gu;
  w.ld_in = 2 * cols;
  w.up_offset = cols;
  w.out = d_q;
  w.out_scale = d_s;
  ASSERT_TRUE(kc::SwiGluQuantFp8Cuda(w).ok());
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<uint8_t> q2 = ToHost(d_q, R * cols);
  const std::vector<float> s2 = ToHost(d_s, R * groups);
  for (int64_t i = 0; i < R; ++i) {
    for (int64_t g = 0; g < groups; ++g) {
      std::vector<float> v(128);
      float amax = 0;
      for (int t = 0; t < 128; ++t) {
        const float a = gu[i * 2 * cols + g * 128 + t];
        v[t] = a / (1.f + std::exp(-a)) * gu[i * 2 * cols + cols + g * 128 + t];
        amax = std::max(amax, std::fabs(v[t]));
      }
      const float want_s = ActQuantScale(amax);
      ASSERT_NEAR(s2[i * groups + g], want_s, 2e-6f * want_s);
      for (int t = 0; t < 128; ++t) {
        const float got = Fp8E4m3ToFloat(q2[i * cols + g * 128 + t]) * s2[i * groups + g];
        // One e4m3 step is 1/8 of the value's binade (normal) or s * 2^-9 (subnormal).
        const float step = std::max(std::fabs(v[t]) / 8.f, want_s * std::ldexp(1.f, -9));
        ASSERT_LE(std::fabs(got - v[t]), step) << "row " << i << " col " << g * 128 + t;
      }
    }
  }
  // Bad shapes name the problem.
  kc::MoeGatherQuantFp8Params bad = p;
  bad.cols = 100;
  EXPECT_FALSE(kc::MoeGatherQuantFp8Cuda(bad).ok());
  cudaFree(d_x);
  cudaFree(d_perm);
  cudaFree(d_q);
  cudaFree(d_s);
  cudaFree(d_gu);
}

// RunFp8Mlp (FP8 dense MLPs and shared experts) on fresh random inputs, stage by stage
// against fp64 host references fed the device's own quantized operands (the quantizers are
// checked bit-exact above): gate_up = xq . W_gu^T and out = actq . W_down^T with the block
// scales, every row; the quantized inputs equal the host's act_quant of x. Rows past `rows`
// stay poisoned, and a row's output bits do not depend on how many rows run with it.
TEST(Fp8MlpTest, MatchesHostReferenceStageByStage) {
  SKIP_WITHOUT_GPU();
  if (!kc::GroupedGemmAvailable(0)) GTEST_SKIP() << "FP8 MLPs need the grouped GEMMs (sm_90)";
  std::mt19937 rng(std::random_device{}());
  const int64_t R = 77, H = 256, I = 384, hb = H / 128, ib = I / 128, pad = 3;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> sc(0.25f, 4.f);
  std::vector<uint16_t> x(R * H);
  for (auto& v : x) v = FloatToBf16(nd(rng));
  const std::vector<uint8_t> wgu = RandomE4m3(rng, 2 * I * H), wdn = RandomE4m3(rng, H * I);
  std::vector<float> sgu(2 * ib * hb), sdn(hb * ib);
  for (auto& v : sgu) v = sc(rng) / 448.f / 64.f;  // |gate_up| ~ 1: SwiGLU in its curved part
  for (auto& v : sdn) v = sc(rng) / 448.f;
  auto gemm_gu = kc::GroupedGemm::Create({kc::GroupedGemmKind::kFp8Block128, 1, 2 * I, H, 0, 64});
  auto gemm_dn = kc::GroupedGemm::Create({kc::GroupedGemmKind::kFp8Block128, 1, H, I, 0, 64});
  ASSERT_TRUE(gemm_gu.ok()) << gemm_gu.status();
  ASSERT_TRUE(gemm_dn.ok()) << gemm_dn.status();
  uint16_t* d_x = ToDevice(x);
  uint8_t* d_wgu = ToDevice(wgu);
  uint8_t* d_wdn = ToDevice(wdn);
  float* d_sgu = ToDevice(sgu);
  float* d_sdn = ToDevice(sdn);
  void *d_off, *d_xq, *d_xqs, *d_gu, *d_aq, *d_aqs, *d_out;
  CUDA_ASSERT(cudaMalloc(&d_off, 2 * sizeof(int32_t)));
  CUDA_ASSERT(cudaMalloc(&d_xq, R * H));
  CUDA_ASSERT(cudaMalloc(&d_xqs, R * hb * sizeof(float)));
  CUDA_ASSERT(cudaMalloc(&d_gu, R * 2 * I * sizeof(float)));
  CUDA_ASSERT(cudaMalloc(&d_aq, R * I));
  CUDA_ASSERT(cudaMalloc(&d_aqs, R * ib * sizeof(float)));
  CUDA_ASSERT(cudaMalloc(&d_out, (R + pad) * H * sizeof(float)));
  kc::Fp8MlpArgs f;
  f.hidden = H;
  f.inter = I;
  f.x = d_x;
  f.gate_up = d_wgu;
  f.gate_up_scale = d_sgu;
  f.down = d_wdn;
  f.down_scale = d_sdn;
  f.gemm_gate_up = gemm_gu->get();
  f.gemm_down = gemm_dn->get();
  f.offsets = static_cast<int32_t*>(d_off);
  f.xq = static_cast<uint8_t*>(d_xq);
  f.xq_scale = static_cast<float*>(d_xqs);
  f.gu = static_cast<float*>(d_gu);
  f.actq = static_cast<uint8_t*>(d_aq);
  f.actq_scale = static_cast<float*>(d_aqs);
  f.out = static_cast<float*>(d_out);
  auto run = [&](int64_t rows) {
    CUDA_ASSERT(cudaMemset(d_out, 0xFF, (R + pad) * H * sizeof(float)));
    f.rows = rows;
    ASSERT_TRUE(kc::SingleGroupOffsetsCuda(static_cast<int32_t*>(d_off), rows, nullptr).ok());
    ASSERT_TRUE(kc::RunFp8Mlp(f).ok());
    CUDA_ASSERT(cudaDeviceSynchronize());
  };
  ASSERT_NO_FATAL_FAILURE(run(R));
  const std::vector<uint8_t> xq = ToHost(static_cast<uint8_t*>(d_xq), R * H);
  const std::vector<float> xqs = ToHost(static_cast<float*>(d_xqs), R * hb);
  const std::vector<float> gu = ToHost(static_cast<float*>(d_gu), R * 2 * I);
  const std::vector<uint8_t> aq = ToHost(static_cast<uint8_t*>(d_aq), R * I);
  const std::vector<float> aqs = ToHost(static_cast<float*>(d_aqs), R * ib);
  const std::vector<float> out = ToHost(static_cast<float*>(d_out), (R + pad) * H);
  // Stage 1: the inputs quantized as act_quant does (first row, every group).
  ASSERT_NO_FATAL_FAILURE(ExpectActQuantRow(x.data(), xq.data(), xqs.data(), hb, "the first row"));
  // The block-scaled GEMMs over the device's own operands, fp64 (one group of R rows).
  const std::vector<int32_t> one = {0, static_cast<int32_t>(R)};
  const Compare c1 = CompareRows(gu, BlockScaledGemmRef(one, xq, xqs, wgu, sgu, 2 * I, H));
  const Compare c2 = CompareRows(std::vector<float>(out.begin(), out.begin() + R * H),
                                 BlockScaledGemmRef(one, aq, aqs, wdn, sdn, H, I));
  std::printf("fp8 mlp: gate_up rel-L2 %.3g, down rel-L2 %.3g (fp64 references)\n", c1.rel_l2,
              c2.rel_l2);
  EXPECT_EQ(c1.nonfinite, 0);
  EXPECT_EQ(c2.nonfinite, 0);
  EXPECT_LT(c1.rel_l2, 3e-3);
  EXPECT_LT(c2.rel_l2, 3e-3);
  ASSERT_NO_FATAL_FAILURE(ExpectRowsPoisoned(out, R, R + pad, H, "`rows`"));
  // Fewer rows: the first rows' outputs are bit-identical.
  ASSERT_NO_FATAL_FAILURE(run(5));
  const std::vector<float> few = ToHost(static_cast<float*>(d_out), 5 * H);
  EXPECT_EQ(std::memcmp(few.data(), out.data(), 5 * H * sizeof(float)), 0);
  // Bad shapes are refused, naming the problem.
  kc::Fp8MlpArgs bad = f;
  bad.inter = 200;
  const absl::Status st = kc::RunFp8Mlp(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("multiples of 128"), std::string::npos) << st;
  for (void* p : {static_cast<void*>(d_x), static_cast<void*>(d_wgu), static_cast<void*>(d_wdn),
                  static_cast<void*>(d_sgu), static_cast<void*>(d_sdn), d_off, d_xq, d_xqs, d_gu,
                  d_aq, d_aqs, d_out}) {
    cudaFree(p);
  }
}

// FloatToBf16Cuda rounds as the host's FloatToBf16 (nearest even), specials included, on
// fresh random floats spread over the exponent range.
TEST(Fp8LinearTest, FloatToBf16MatchesHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(std::random_device{}());
  std::vector<float> x(100003);
  for (auto& v : x) {
    uint32_t bits = static_cast<uint32_t>(rng());
    std::memcpy(&v, &bits, 4);
    if (std::isnan(v)) v = 1.5f;
  }
  x[0] = INFINITY, x[1] = -INFINITY, x[2] = 0.f, x[3] = -0.f, x[4] = 1.00390625f;  // a tie
  float* d_in = ToDevice(x);
  void* d_raw = nullptr;
  CUDA_ASSERT(cudaMalloc(&d_raw, x.size() * sizeof(uint16_t)));
  uint16_t* d_out = static_cast<uint16_t*>(d_raw);
  ASSERT_TRUE(kc::FloatToBf16Cuda(d_in, d_out, static_cast<int64_t>(x.size()), nullptr).ok());
  CUDA_ASSERT(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = ToHost(d_out, x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], FloatToBf16(x[i])) << x[i];
  cudaFree(d_in);
  cudaFree(d_out);
}

// RunFp8Linear (the FP8 attention projections) on fresh random inputs, through the grouped
// kernel and through cuBLASLt (its layouts: scales by column group over 48 rows for 45, the
// weight's scale rows padded to 4): a strided input (ldx > k, as the attention's projections
// read a column block), quantized per row and 128 columns, then the block-scaled GEMM,
// against the fp64 reference over the device's own quantized operands; rows past the rows
// computed stay poisoned; a bad stride is refused.
TEST(Fp8LinearTest, StridedInputMatchesHostReference) {
  SKIP_WITHOUT_GPU();
  if (!kc::GroupedGemmAvailable(0)) GTEST_SKIP() << "FP8 linears need the grouped GEMMs (sm_90)";
  std::mt19937 rng(std::random_device{}());
  const int64_t R = 45, K = 384, N = 640, ldx = K + 128, kb = K / 128, nb = N / 128, pad = 2;
  const int64_t R4 = kc::Fp8LtRows(R), kb4 = kc::Fp8LtScaleLd(K);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> sc(0.25f, 4.f);
  std::vector<uint16_t> x(R * ldx);
  for (auto& v : x) v = FloatToBf16(nd(rng));
  const std::vector<uint8_t> w = RandomE4m3(rng, N * K);
  std::vector<float> ws(nb * kb), ws_lt(nb * kb4, 1.f);
  for (int64_t i = 0; i < nb * kb; ++i) {
    ws[i] = sc(rng) / 448.f;
    ws_lt[i / kb * kb4 + i % kb] = ws[i];
  }
  auto gemm = kc::GroupedGemm::Create({kc::GroupedGemmKind::kFp8Block128, 1, N, K, 0, 64});
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  auto lt = kc::Fp8BlockGemmLt::Create();
  uint16_t* d_x = ToDevice(x);
  uint8_t* d_w = ToDevice(w);
  float* d_ws = ToDevice(ws);
  float* d_ws_lt = ToDevice(ws_lt);
  void *d_off, *d_xq, *d_xqs, *d_out;
  CUDA_ASSERT(cudaMalloc(&d_off, 2 * sizeof(int32_t)));
  CUDA_ASSERT(cudaMalloc(&d_xq, R4 * K));
  CUDA_ASSERT(cudaMalloc(&d_xqs, R4 * kb * sizeof(float)));
  CUDA_ASSERT(cudaMalloc(&d_out, (R4 + pad) * N * sizeof(float)));
  ASSERT_TRUE(kc::SingleGroupOffsetsCuda(static_cast<int32_t*>(d_off), R, nullptr).ok());
  kc::Fp8LinearArgs a;
  a.rows = R;
  a.x = d_x;
  a.ldx = ldx;
  a.w = d_w;
  a.w_scale = d_ws;
  a.gemm = gemm->get();
  a.offsets = static_cast<int32_t*>(d_off);
  a.xq = static_cast<uint8_t*>(d_xq);
  a.xq_scale = static_cast<float*>(d_xqs);
  a.out = static_cast<float*>(d_out);
  for (const bool use_lt : {false, true}) {
    if (use_lt && !lt.ok()) {
      std::printf("fp8 linear: no cuBLASLt path here (%s)\n", lt.status().ToString().c_str());
      continue;
    }
    a.lt = use_lt ? lt->get() : nullptr;
    a.w_scale = use_lt ? d_ws_lt : d_ws;
    const int64_t rows_out = use_lt ? R4 : R;  // the rows the GEMM computes
    CUDA_ASSERT(cudaMemset(d_xq, 0, R4 * K));  // finite pad rows for cuBLASLt
    CUDA_ASSERT(cudaMemset(d_xqs, 0, R4 * kb * sizeof(float)));
    CUDA_ASSERT(cudaMemset(d_out, 0xFF, (R4 + pad) * N * sizeof(float)));
    const absl::Status run = kc::RunFp8Linear(a);
    ASSERT_TRUE(run.ok()) << run;
    CUDA_ASSERT(cudaDeviceSynchronize());
    const std::vector<uint8_t> xq = ToHost(static_cast<uint8_t*>(d_xq), R * K);
    const std::vector<float> raw = ToHost(static_cast<float*>(d_xqs), R4 * kb);
    std::vector<float> xqs(R * kb);  // row-major [R][kb] for the reference
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t g = 0; g < kb; ++g) xqs[r * kb + g] = use_lt ? raw[g * R4 + r] : raw[r * kb + g];
    }
    const std::vector<float> out = ToHost(static_cast<float*>(d_out), (R4 + pad) * N);
    // The last row's quantized input is its own first K columns (not the stride's tail).
    const int64_t r = R - 1;
    ASSERT_NO_FATAL_FAILURE(
        ExpectActQuantRow(&x[r * ldx], &xq[r * K], &xqs[r * kb], kb, "the last row"));
    const std::vector<int32_t> one = {0, static_cast<int32_t>(R)};
    const Compare c = CompareRows(std::vector<float>(out.begin(), out.begin() + R * N),
                                  BlockScaledGemmRef(one, xq, xqs, w, ws, N, K));
    std::printf("fp8 linear (%s): rel-L2 %.3g (fp64 reference)\n", use_lt ? "cublaslt" : "grouped",
                c.rel_l2);
    EXPECT_EQ(c.nonfinite, 0);
    EXPECT_LT(c.rel_l2, 3e-3);
    ASSERT_NO_FATAL_FAILURE(
        ExpectRowsPoisoned(out, rows_out, R4 + pad, N, absl::StrCat(rows_out, " rows")));
  }
  kc::Fp8LinearArgs bad = a;
  bad.ldx = K - 128;
  const absl::Status st = kc::RunFp8Linear(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("ldx"), std::string::npos) << st;
  for (void* p : {static_cast<void*>(d_x), static_cast<void*>(d_w), static_cast<void*>(d_ws),
                  static_cast<void*>(d_ws_lt), d_off, d_xq, d_xqs, d_out}) {
    cudaFree(p);
  }
}

// Fp8BlockGemmLt (cuBLASLt's block-scaled FP8 GEMM) on fresh random operands against the fp64
// reference, in its documented layouts (fp8_gemm.h: activation scales by column group with
// the rows rounded up to 4, weight scale rows padded to 4): 45 rows (48 computed) and 1 row
// (4 computed); rows past the rounded count stay poisoned; bad shapes are refused.
TEST(Fp8BlockGemmLtTest, MatchesHostReference) {
  SKIP_WITHOUT_GPU();
  auto lt = kc::Fp8BlockGemmLt::Create();
  if (!lt.ok()) GTEST_SKIP() << lt.status();
  std::mt19937 rng(std::random_device{}());
  const int64_t M = 45, K = 384, N = 640, kb = K / 128, nb = N / 128, pad = 3;
  const int64_t M4 = kc::Fp8LtRows(M), kb4 = kc::Fp8LtScaleLd(K);
  ASSERT_EQ(M4, 48);
  ASSERT_EQ(kb4, 4);
  std::uniform_real_distribution<float> sc(0.25f, 4.f);
  const std::vector<uint8_t> x = RandomE4m3(rng, M4 * K), w = RandomE4m3(rng, N * K);
  std::vector<float> xs(M4 * kb), ws(nb * kb);  // row-major, as the reference reads them
  for (auto& v : xs) v = sc(rng) / 448.f;
  for (auto& v : ws) v = sc(rng) / 448.f;
  std::vector<float> ws_lt(nb * kb4, 1.f);
  for (int64_t i = 0; i < nb; ++i) {
    for (int64_t b = 0; b < kb; ++b) ws_lt[i * kb4 + b] = ws[i * kb + b];
  }
  uint8_t* d_x = ToDevice(x);
  uint8_t* d_w = ToDevice(w);
  float* d_ws = ToDevice(ws_lt);
  void* d_y = nullptr;
  CUDA_ASSERT(cudaMalloc(&d_y, (M4 + pad) * N * sizeof(float)));
  for (const int64_t m : {M, int64_t{1}}) {
    const int64_t m4 = kc::Fp8LtRows(m);
    std::vector<float> xs_lt(kb * m4);  // by column group: [kb][m4]
    for (int64_t r = 0; r < m4; ++r) {
      for (int64_t b = 0; b < kb; ++b) xs_lt[b * m4 + r] = xs[r * kb + b];
    }
    float* d_xs = ToDevice(xs_lt);
    CUDA_ASSERT(cudaMemset(d_y, 0xFF, (M4 + pad) * N * sizeof(float)));
    kc::Fp8BlockGemmArgs a;
    a.m = m;
    a.n = N;
    a.k = K;
    a.x = d_x;
    a.x_scale = d_xs;
    a.w = d_w;
    a.w_scale = d_ws;
    a.y = static_cast<float*>(d_y);
    const absl::Status st = (*lt)->Run(a);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_ASSERT(cudaDeviceSynchronize());
    cudaFree(d_xs);
    const std::vector<float> y = ToHost(static_cast<float*>(d_y), (M4 + pad) * N);
    const std::vector<int32_t> one = {0, static_cast<int32_t>(m)};
    const Compare c = CompareRows(
        std::vector<float>(y.begin(), y.begin() + m * N),
        BlockScaledGemmRef(one, std::vector<uint8_t>(x.begin(), x.begin() + m * K),
                           std::vector<float>(xs.begin(), xs.begin() + m * kb), w, ws, N, K));
    std::printf("cublaslt fp8 block gemm m=%lld: rel-L2 %.3g (fp64 reference)\n",
                static_cast<long long>(m), c.rel_l2);
    EXPECT_EQ(c.nonfinite, 0);
    EXPECT_LT(c.rel_l2, 3e-3) << "m=" << m;
    ASSERT_NO_FATAL_FAILURE(ExpectRowsPoisoned(y, m4, M4 + pad, N, absl::StrCat(m4, " rows")));
  }
  kc::Fp8BlockGemmArgs bad;
  bad.m = 4;
  bad.n = 640;
  bad.k = 200;
  const absl::Status st = (*lt)->Run(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  cudaFree(d_x);
  cudaFree(d_w);
  cudaFree(d_ws);
  cudaFree(d_y);
}

}  // namespace
}  // namespace verifyd
