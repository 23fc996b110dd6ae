// What Hopper's e4m3 tensor-core products give for the FP8 latent cache's arithmetic, measured
// on the device (sm_90a): the facts a kernel computing S = Q K^T and P V with e4m3 wgmmas on
// the landed codes depends on, which a CPU emulation (bench/fp8_attention_numerics) assumes
// rather than measures.
//
//   precision   D[64 x 64] = A[64 x K] B[64 x K]^T for random e4m3 values, K = 512 x R: one
//               512-wide tile pair (both operands K-major in shared memory, 128-byte swizzle, the
//               kernels' layout) run R = 1, 4, 16 times (the sums grow R-fold: a harder case for
//               an accumulator than fresh data, whose sums grow ~sqrt(R)-fold),
//               accumulated three ways: e4m3 m64n64k32 wgmmas into one accumulator for the whole
//               K ("in place"); e4m3 wgmmas into a fresh accumulator per 128 K that is added to
//               an fp32 sum by the threads ("promoted", DeepSeek-V3's remedy for the FP8
//               accumulator's ~14 bits); and bf16 m64n64k16 wgmmas on the same values (exact in
//               bf16) into one accumulator. Reported per mode: the largest |D - exact| over
//               sum_k |a_k b_k| of that element (the accumulator's effective precision), and
//               the rel-L2 of D against the exact products (double on the host).
//   rate        back-to-back wgmmas on shared-memory-resident tiles, 2 warpgroups per CTA, one
//               CTA per SM: TFLOP/s of e4m3 m64n256k32 against bf16 m64n256k16 (tensor rate
//               only: no loads, no softmax).
//   convert     an f16 tile per landed FP8 tile: codes -> f16 (cvt.rn.f16x2.e4m3x2) x a scale
//               (f16x2 multiply) -> shared memory, one CTA per SM of 128 / 256 / 384 threads:
//               SM cycles per key (512 codes), against the 34 MMA cycles a key of 64 rows.
//   gather_convert  the same fed by 8/16-byte register gathers of whole stored rows from a
//               656 MB pool at random slots (128 threads a CTA, registers uncapped and capped
//               at 56), with the converted tile checked value by value against the host.
// A benchmark: prints a table and writes JSON (--json); it asserts nothing. Needs an sm_90a
// device; elsewhere it says so and exits 2.
//   fp8_wgmma_probe [--json=FILE] [--rate_iters=20000]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_cuda.h"
#include "kernels/common.h"
#include "kernels/cuda/verify_attention/ptx.cuh"
#include "kernels/kv_fp8.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, json, "", "write the results as JSON here");
ABSL_FLAG(int, rate_iters, 20000, "wgmma groups per warpgroup in the rate test");

namespace {

using namespace verifyd::kernels::cuda::detail;

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define PROBE_SM90A 1
#endif

constexpr int kRows = 64;         // M = N = 64 in the precision test
constexpr int kAtomBytes = 8192;  // 64 rows x 128 bytes, 128-byte swizzle

// Byte offset of (row, byte) of a K-major operand stored as 128-byte-swizzled atoms of 128
// bytes of K each (for e4m3: 128 K elements; for bf16: 64).
__host__ __device__ inline int SwizzledOffset(int row, int byte) {
  const int atom = byte / 128, b = byte % 128;
  return atom * kAtomBytes + row * 128 + (((b / 16) ^ (row % 8)) * 16) + b % 16;
}

// D[64 x 64] (+)= A[64 x 32] * B[64 x 32]^T, e4m3 x e4m3 -> f32; scale_d == 0 overwrites D.
#ifdef PROBE_SM90A
__device__ __forceinline__ void WgmmaM64N64K32E4m3(float* d, uint64_t desc_a, uint64_t desc_b,
                                                   int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%"
      "25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
#endif

enum Mode : int { kInPlace = 0, kPromoted = 1, kBf16 = 2 };

// One warpgroup: A and B (k_bytes of K each, K-major swizzled atoms) into shared memory, then
// the products of `mode`; D (row-major [64][64] float) to global memory.
__global__ void __launch_bounds__(128)
    PrecisionKernel(const uint8_t* a, const uint8_t* b, int k_bytes, int repeats, int mode,
                    float* out) {
#ifdef PROBE_SM90A
  extern __shared__ __align__(1024) uint8_t smem[];
  const int atoms = k_bytes / 128;
  uint8_t* sa = smem;
  uint8_t* sb = smem + atoms * kAtomBytes;
  for (int i = threadIdx.x * 16; i < atoms * kAtomBytes; i += 128 * 16) {
    *reinterpret_cast<uint4*>(sa + i) = *reinterpret_cast<const uint4*>(a + i);
    *reinterpret_cast<uint4*>(sb + i) = *reinterpret_cast<const uint4*>(b + i);
  }
  FenceProxyAsyncShared();
  __syncthreads();
  float d[32], sum[32];
  for (int i = 0; i < 32; ++i) d[i] = sum[i] = 0.0f;
  const uint32_t a0 = SmemAddr(sa), b0 = SmemAddr(sb);
  const int steps = k_bytes / 32;  // 32 bytes of K per wgmma (e4m3 k32, bf16 k16)
  for (int rs = 0; rs < steps * repeats; ++rs) {
    const int s = rs % steps;
    const uint32_t off = (s / 4) * kAtomBytes + (s % 4) * 32;
    const uint64_t da = WgmmaDesc(a0 + off, 16, 1024), db = WgmmaDesc(b0 + off, 16, 1024);
    const int first = mode == kPromoted ? (s % 4 == 0) : (rs == 0);
    WgmmaFence();
    if (mode == kBf16) {
      WgmmaM64N64SmemA(d, da, db, first ? 0 : 1);
    } else {
      WgmmaM64N64K32E4m3(d, da, db, first ? 0 : 1);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    if (mode == kPromoted && s % 4 == 3) {
      for (int i = 0; i < 32; ++i) sum[i] += d[i];
    }
  }
  if (mode != kPromoted) {
    for (int i = 0; i < 32; ++i) sum[i] = d[i];
  }
  // wgmma m64nN f32 fragment: warp w holds rows 16 w .. 16 w + 15.
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  for (int i = 0; i < 32; ++i) {
    const int row = w * 16 + l / 4 + 8 * ((i / 2) % 2);
    const int col = (i / 4) * 8 + (l % 4) * 2 + (i % 2);
    out[row * kRows + col] = sum[i];
  }
#endif
}

// The tensor rate: each warpgroup issues `iters` groups of 4 dependent m64n256 wgmmas (K 128
// bytes) on shared-memory tiles that are never rewritten (their contents do not matter).
#ifdef PROBE_SM90A
// D[64 x 256] += A B for one warpgroup, both operands in shared memory: SHAPE is the
// k / type suffix, TAIL the 16-bit types' transpose operands (none for e4m3).
#define PROBE_DEFINE_WGMMA_M64N256(NAME, SHAPE, TAIL)                                              \
  __device__ __forceinline__ void NAME(float* d, uint64_t da, uint64_t db) {                       \
    asm volatile(                                                                                  \
        "wgmma.mma_async.sync.aligned.m64n256" SHAPE                                               \
        " "                                                                                        \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,"  \
        "%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45," \
        "%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67," \
        "%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89," \
        "%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,"    \
        "%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,"    \
        "%126,%127}, %128, %129, 1, 1, 1" TAIL ";\n"                                               \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),      \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),  \
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),            \
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),            \
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]),            \
          "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),            \
          "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),            \
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),            \
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]),            \
          "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]),            \
          "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]),            \
          "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),            \
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),            \
          "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),            \
          "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]),            \
          "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),        \
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]),      \
          "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),      \
          "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]),      \
          "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])       \
        : "l"(da), "l"(db));                                                                       \
  }
PROBE_DEFINE_WGMMA_M64N256(WgmmaM64N256K32E4m3, "k32.f32.e4m3.e4m3", "")
PROBE_DEFINE_WGMMA_M64N256(WgmmaM64N256K16Bf16, "k16.f32.bf16.bf16", ", 0, 0")
#endif

// A: [64 x 128 bytes] one atom; B: [256 x 128 bytes] four atoms (N = 256, K-major).
template <bool kFp8>
__global__ void __launch_bounds__(256) RateKernel(int iters, float* sink) {
#ifdef PROBE_SM90A
  extern __shared__ __align__(1024) uint8_t smem[];
  for (int i = threadIdx.x * 16; i < 5 * kAtomBytes; i += 256 * 16) {
    *reinterpret_cast<uint4*>(smem + i) = make_uint4(0x38383838u, 0, 0, 0);
  }
  FenceProxyAsyncShared();
  __syncthreads();
  float d[128];
  for (int i = 0; i < 128; ++i) d[i] = 0.0f;
  const uint32_t a0 = SmemAddr(smem), b0 = SmemAddr(smem + kAtomBytes);
  for (int it = 0; it < iters; ++it) {
    WgmmaFence();
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint64_t da = WgmmaDesc(a0 + s * 32, 16, 1024), db = WgmmaDesc(b0 + s * 32, 16, 1024);
      if constexpr (kFp8) {
        WgmmaM64N256K32E4m3(d, da, db);
      } else {
        WgmmaM64N256K16Bf16(d, da, db);
      }
    }
    WgmmaCommit();
    WgmmaWait<0>();
  }
  float acc = 0;
  for (int i = 0; i < 128; ++i) acc += d[i];
  if (acc == 12345.0f) sink[threadIdx.x] = acc;  // keeps the products live
#endif
}

// The conversion rate of an f16 tile per landed FP8 tile: each thread turns 16-byte chunks of
// codes (in shared memory) into f16 (cvt.rn.f16x2.e4m3x2), multiplies them by a per-group f16
// scale (f16x2 multiply) and stores the 32 bytes back into shared memory; `iters` passes over
// one 64-key tile of 512 codes a key (32 KB in, 64 KB out).
__global__ void __launch_bounds__(384) ConvertKernel(int iters, float* sink) {
#ifdef PROBE_SM90A
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* in = smem;           // 64 keys x 512 codes
  uint8_t* out = smem + 32768;  // 64 keys x 512 f16
  for (int i = threadIdx.x * 16; i < 32768; i += blockDim.x * 16) {
    *reinterpret_cast<uint4*>(in + i) =
        make_uint4(0x3a383634u ^ i, 0x42403e3cu, 0x2c2a2826u, 0x4c4a4846u);
  }
  __syncthreads();
  const __half2 scale = __floats2half2_rn(0.75f, 0.75f);
  uint32_t acc = 0;
  for (int it = 0; it < iters; ++it) {
    for (int c = threadIdx.x; c < 2048; c += blockDim.x) {  // 2048 chunks of 16 codes
      const uint4 v = *reinterpret_cast<const uint4*>(in + c * 16);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      uint32_t h[8];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        uint32_t lo, hi;
        E4m3x4ToF16x2x2(w[k] ^ it, lo, hi);
        __half2 a = __hmul2(*reinterpret_cast<__half2*>(&lo), scale);
        __half2 b = __hmul2(*reinterpret_cast<__half2*>(&hi), scale);
        h[2 * k] = *reinterpret_cast<uint32_t*>(&a);
        h[2 * k + 1] = *reinterpret_cast<uint32_t*>(&b);
      }
      uint4* dst = reinterpret_cast<uint4*>(out + c * 32);
      dst[0] = make_uint4(h[0], h[1], h[2], h[3]);
      dst[1] = make_uint4(h[4], h[5], h[6], h[7]);
      acc ^= h[0];
    }
  }
  if (acc == 0x12345678u) sink[threadIdx.x] = static_cast<float>(acc);
#endif
}

// Gather + convert, as a producer warpgroup of the f16-tile plan would: 128 threads gather the
// 64 stored FP8 rows of a tile (656 bytes: 512 codes, 4 float scales, 64 bf16 rope) from
// random slots of a pool larger than L2 with 8- and 16-byte loads (no cp.async), convert the
// codes to f16 x f16(scale) and store the tile as nine 128-byte-swizzled atoms (f16 columns
// 0-511, then the bf16 rope) in shared memory. Warp w takes rows 16 w .. 16 w + 15, four at a
// time: lane l owns 16-byte chunk (l & 7) of each atom row of row 16 w + 4 i + (l >> 3).
// kMinBlocks caps the registers (65,536 / (128 x kMinBlocks)): 1 = uncapped, 9 = 56, what a
// producer could get next to two 224-register math warpgroups. The last tile of CTA 0 is
// copied to `check` ([9][64][128] bytes, unswizzled) to verify the layout and the values.
constexpr int kRowBytes = 656, kRopeOff = 528;
template <int kMinBlocks>
__global__ void __launch_bounds__(128, kMinBlocks)
    GatherConvertKernel(const uint8_t* pool, const int32_t* slots, int tiles, uint8_t* check) {
#ifdef PROBE_SM90A
  extern __shared__ __align__(1024) uint8_t smem[];
  const int lane = threadIdx.x & 31, pw = threadIdx.x >> 5;
  const int sub = lane >> 3, chunk = lane & 7;
  const int32_t* my_slots = slots + static_cast<int64_t>(blockIdx.x) * tiles * 64;
  for (int t = 0; t < tiles; ++t) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 16 * pw + sub + 4 * i;
      const uint8_t* row = pool + static_cast<int64_t>(__ldg(my_slots + t * 64 + r)) * kRowBytes;
      uint2 codes[8];
#pragma unroll
      for (int a = 0; a < 8; ++a)
        codes[a] = __ldg(reinterpret_cast<const uint2*>(row + a * 64 + chunk * 8));
      const float4 sc = __ldg(reinterpret_cast<const float4*>(row + 512));
      const uint4 rope = __ldg(reinterpret_cast<const uint4*>(row + kRopeOff + chunk * 16));
      const float scales[4] = {sc.x, sc.y, sc.z, sc.w};
      const uint32_t swz = ((chunk ^ (r & 7)) << 4) + r * 128;
#pragma unroll
      for (int a = 0; a < 8; ++a) {
        const __half2 s2 = __float2half2_rn(scales[a / 2]);
        uint32_t h[4];
        const uint32_t w[2] = {codes[a].x, codes[a].y};
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          uint32_t lo, hi;
          E4m3x4ToF16x2x2(w[k], lo, hi);
          __half2 x = __hmul2(*reinterpret_cast<__half2*>(&lo), s2);
          __half2 y = __hmul2(*reinterpret_cast<__half2*>(&hi), s2);
          h[2 * k] = *reinterpret_cast<uint32_t*>(&x);
          h[2 * k + 1] = *reinterpret_cast<uint32_t*>(&y);
        }
        *reinterpret_cast<uint4*>(smem + a * kAtomBytes + swz) = make_uint4(h[0], h[1], h[2], h[3]);
      }
      *reinterpret_cast<uint4*>(smem + 8 * kAtomBytes + swz) = rope;
    }
    __syncthreads();  // the tile is complete (a real producer arrives on a full barrier here)
  }
  if (blockIdx.x == 0) {
    for (int b = threadIdx.x; b < 9 * 64 * 8; b += 128) {  // 16-byte chunks, unswizzled
      const int atom = b / 512, r = (b / 8) % 64, c = b % 8;
      *reinterpret_cast<uint4*>(check + atom * 8192 + r * 128 + c * 16) =
          *reinterpret_cast<const uint4*>(smem + atom * kAtomBytes + r * 128 +
                                          ((c ^ (r & 7)) << 4));
    }
  }
#endif
}

// Fills a pool of stored rows: codes random but finite (no e4m3 NaN), scales 2^-4 .. 2^3
// (random), rope random bf16 in +-4.
__global__ void FillPoolKernel(uint8_t* pool, int64_t rows) {
  const int64_t n = rows * kRowBytes;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32) * 40503u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const int64_t col = i % kRowBytes;
    if (col < 512) {
      uint8_t c = static_cast<uint8_t>(h);
      if ((c & 0x7f) == 0x7f) c &= 0xfe;  // 0x7f / 0xff are NaN in e4m3fn
      pool[i] = c;
    } else if (col < kRopeOff) {
      if ((col - 512) % 4 == 0) {
        const float s = ldexpf(1.0f, static_cast<int>(h % 8) - 4);
        memcpy(pool + i, &s, 4);
      }
    } else if ((col - kRopeOff) % 2 == 0) {
      const __nv_bfloat16 b = __float2bfloat16((static_cast<int>(h % 2001) - 1000) * 0.004f);
      memcpy(pool + i, &b, 2);
    }
  }
}

// Random e4m3 values (codes of N(0, 64) samples: the full exponent range of a stored tile).
std::vector<uint8_t> RandomCodes(int n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 64.f);
  std::vector<uint8_t> v(n);
  for (auto& c : v) c = verifyd::kernels::Fp8E4m3FromFloat(nd(rng));
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int dev = 0, major = 0, minor = 0, sms = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaFuncAttributes attr{};
  BENCH_CUDA(cudaFuncGetAttributes(&attr, PrecisionKernel));
  if (major != 9 || attr.numRegs < 32) {
    std::fprintf(stderr, "fp8_wgmma_probe: needs an sm_90a device and an sm_90a build\n");
    return 2;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, dev));
  nlohmann::json results = nlohmann::json::array();
  std::mt19937 rng(7);
  std::printf("precision: D[64 x 64] = A[64 x K] B[64 x K]^T, random e4m3 values\n");
  std::printf("| K | mode | max |D - exact| / sum|a b| | rel-L2 |\n|---|---|---|---|\n");
  const char* names[] = {"e4m3 in place", "e4m3 promoted per 128", "bf16 in place"};
  constexpr int K = 512;  // one tile pair: 64 KB (e4m3) / 128 KB (bf16) of shared memory
  for (const int repeats : {1, 4, 16}) {
    const std::vector<uint8_t> ca = RandomCodes(kRows * K, rng), cb = RandomCodes(kRows * K, rng);
    std::vector<double> exact(kRows * kRows), absum(kRows * kRows);
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < kRows; ++c) {
        double s = 0, t = 0;
        for (int k = 0; k < K; ++k) {
          const double p = static_cast<double>(verifyd::kernels::Fp8E4m3ToFloat(ca[r * K + k])) *
                           verifyd::kernels::Fp8E4m3ToFloat(cb[c * K + k]);
          s += p;
          t += std::fabs(p);
        }
        exact[r * kRows + c] = s * repeats;
        absum[r * kRows + c] = t * repeats;
      }
    }
    for (const int mode : {kInPlace, kPromoted, kBf16}) {
      const int elem = mode == kBf16 ? 2 : 1;
      const int k_bytes = K * elem;
      const size_t bytes = static_cast<size_t>(k_bytes / 128) * kAtomBytes;
      std::vector<uint8_t> ha(bytes), hb(bytes);
      for (int r = 0; r < kRows; ++r) {
        for (int k = 0; k < K; ++k) {
          for (int which = 0; which < 2; ++which) {
            const uint8_t code = which == 0 ? ca[r * K + k] : cb[r * K + k];
            std::vector<uint8_t>& h = which == 0 ? ha : hb;
            if (mode == kBf16) {
              const verifyd::kernels::bf16_bits v =
                  verifyd::kernels::FloatToBf16(verifyd::kernels::Fp8E4m3ToFloat(code));
              std::memcpy(&h[SwizzledOffset(r, 2 * k)], &v, 2);
            } else {
              h[SwizzledOffset(r, k)] = code;
            }
          }
        }
      }
      uint8_t *da = nullptr, *db = nullptr;
      float* dout = nullptr;
      BENCH_CUDA(cudaMalloc(&da, bytes));
      BENCH_CUDA(cudaMalloc(&db, bytes));
      BENCH_CUDA(cudaMalloc(&dout, kRows * kRows * sizeof(float)));
      BENCH_CUDA(cudaMemcpy(da, ha.data(), bytes, cudaMemcpyHostToDevice));
      BENCH_CUDA(cudaMemcpy(db, hb.data(), bytes, cudaMemcpyHostToDevice));
      BENCH_CUDA(cudaMemset(dout, 0xff, kRows * kRows * sizeof(float)));  // NaN: unwritten
      const int smem = static_cast<int>(2 * bytes);
      BENCH_CUDA(
          cudaFuncSetAttribute(PrecisionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      PrecisionKernel<<<1, 128, smem>>>(da, db, k_bytes, repeats, mode, dout);
      BENCH_CUDA(cudaGetLastError());
      std::vector<float> d(kRows * kRows);
      BENCH_CUDA(cudaMemcpy(d.data(), dout, d.size() * sizeof(float), cudaMemcpyDeviceToHost));
      double worst = 0, num = 0, den = 0;
      for (int i = 0; i < kRows * kRows; ++i) {
        const double e = std::fabs(d[i] - exact[i]);
        worst = std::max(worst, std::isfinite(d[i]) ? e / std::max(absum[i], 1e-30) : INFINITY);
        num += e * e;
        den += exact[i] * exact[i];
      }
      const double rel = std::sqrt(num / den);
      std::printf("| %d | %s | %.3e | %.3e |\n", K * repeats, names[mode], worst, rel);
      results.push_back({{"test", "precision"},
                         {"K", K * repeats},
                         {"mode", names[mode]},
                         {"max_err_over_abs_sum", worst},
                         {"rel_l2", rel}});
      BENCH_CUDA(cudaFree(da));
      BENCH_CUDA(cudaFree(db));
      BENCH_CUDA(cudaFree(dout));
    }
  }

  const int iters = absl::GetFlag(FLAGS_rate_iters);
  float* sink = nullptr;
  BENCH_CUDA(cudaMalloc(&sink, 256 * sizeof(float)));
  BENCH_CUDA(cudaFuncSetAttribute(RateKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  5 * kAtomBytes));
  BENCH_CUDA(cudaFuncSetAttribute(RateKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  5 * kAtomBytes));
  std::printf("\nrate: %d CTAs x 2 warpgroups, %d groups of 4 m64n256 wgmmas each\n", sms, iters);
  std::printf("| operands | ms | TFLOP/s |\n|---|---|---|\n");
  for (const int fp8 : {0, 1}) {
    cudaEvent_t e0, e1;
    BENCH_CUDA(cudaEventCreate(&e0));
    BENCH_CUDA(cudaEventCreate(&e1));
    auto* kernel = fp8 ? RateKernel<true> : RateKernel<false>;
    kernel<<<sms, 256, 5 * kAtomBytes>>>(iters / 10, sink);  // warm-up
    BENCH_CUDA(cudaEventRecord(e0));
    kernel<<<sms, 256, 5 * kAtomBytes>>>(iters, sink);
    BENCH_CUDA(cudaEventRecord(e1));
    BENCH_CUDA(cudaEventSynchronize(e1));
    BENCH_CUDA(cudaGetLastError());
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    const double k = fp8 ? 32 : 16;
    const double flops = 2.0 * 64 * 256 * k * 4 * iters * 2 * sms;
    const double tflops = flops / (ms * 1e-3) / 1e12;
    std::printf("| %s | %.3f | %.0f |\n", fp8 ? "e4m3 m64n256k32" : "bf16 m64n256k16", ms, tflops);
    results.push_back(
        {{"test", "rate"}, {"operands", fp8 ? "e4m3" : "bf16"}, {"ms", ms}, {"tflops", tflops}});
    BENCH_CUDA(cudaEventDestroy(e0));
    BENCH_CUDA(cudaEventDestroy(e1));
  }
  // Conversion rate: one CTA per SM of 128 / 256 / 384 threads.
  BENCH_CUDA(
      cudaFuncSetAttribute(ConvertKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 98304));
  int clock_khz = 0;
  BENCH_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  const int conv_iters = std::max(1, iters / 20);
  std::printf(
      "\nconversion: e4m3 codes -> f16 x scale -> shared memory, one CTA per SM, %d "
      "passes over a 64-key tile\n",
      conv_iters);
  std::printf(
      "| threads | ms | keys per us per SM | SM cycles per key at %d MHz |\n"
      "|---|---|---|---|\n",
      clock_khz / 1000);
  for (const int threads : {128, 256, 384}) {
    cudaEvent_t e0, e1;
    BENCH_CUDA(cudaEventCreate(&e0));
    BENCH_CUDA(cudaEventCreate(&e1));
    ConvertKernel<<<sms, threads, 98304>>>(1, sink);  // warm-up
    BENCH_CUDA(cudaEventRecord(e0));
    ConvertKernel<<<sms, threads, 98304>>>(conv_iters, sink);
    BENCH_CUDA(cudaEventRecord(e1));
    BENCH_CUDA(cudaEventSynchronize(e1));
    BENCH_CUDA(cudaGetLastError());
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    const double keys = 64.0 * conv_iters;  // per SM
    const double keys_per_us = keys / (ms * 1e3);
    const double cycles = (clock_khz * 1e3) * (ms * 1e-3) / keys;
    std::printf("| %d | %.3f | %.1f | %.1f |\n", threads, ms, keys_per_us, cycles);
    results.push_back({{"test", "convert"},
                       {"threads", threads},
                       {"ms", ms},
                       {"keys_per_us_per_sm", keys_per_us},
                       {"cycles_per_key", cycles},
                       {"clock_mhz", clock_khz / 1000}});
    BENCH_CUDA(cudaEventDestroy(e0));
    BENCH_CUDA(cudaEventDestroy(e1));
  }
  BENCH_CUDA(cudaFree(sink));

  // Gather + convert from a pool larger than L2 (1M rows, 656 MB), random slots.
  {
    const int64_t pool_rows = 1 << 20;
    const int tiles = 256;
    uint8_t *pool = nullptr, *check = nullptr;
    int32_t* slots = nullptr;
    BENCH_CUDA(cudaMalloc(&pool, pool_rows * kRowBytes));
    BENCH_CUDA(cudaMalloc(&check, 9 * 8192));
    const int64_t n_slots = static_cast<int64_t>(sms) * tiles * 64;
    BENCH_CUDA(cudaMalloc(&slots, n_slots * sizeof(int32_t)));
    FillPoolKernel<<<4 * sms, 256>>>(pool, pool_rows);
    BENCH_CUDA(cudaGetLastError());
    std::vector<int32_t> hs(n_slots);
    std::mt19937 srng(11);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(pool_rows - 1));
    for (auto& x : hs) x = pick(srng);
    BENCH_CUDA(cudaMemcpy(slots, hs.data(), n_slots * sizeof(int32_t), cudaMemcpyHostToDevice));
    const int smem_bytes = 9 * kAtomBytes;
    BENCH_CUDA(cudaFuncSetAttribute(GatherConvertKernel<1>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    BENCH_CUDA(cudaFuncSetAttribute(GatherConvertKernel<9>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    std::printf(
        "\ngather + convert: %d CTAs x 128 threads, %d tiles of 64 random rows each "
        "(pool 656 MB)\n",
        sms, tiles);
    std::printf(
        "| registers | regs used | ms | FP8 GB/s | SM cycles per key at %d MHz | layout "
        "check |\n|---|---|---|---|---|---|\n",
        clock_khz / 1000);
    for (const int capped : {0, 1}) {
      auto* kernel = capped ? GatherConvertKernel<9> : GatherConvertKernel<1>;
      cudaFuncAttributes fa{};
      BENCH_CUDA(cudaFuncGetAttributes(&fa, kernel));
      kernel<<<sms, 128, smem_bytes>>>(pool, slots, 8, check);  // warm-up
      cudaEvent_t e0, e1;
      BENCH_CUDA(cudaEventCreate(&e0));
      BENCH_CUDA(cudaEventCreate(&e1));
      BENCH_CUDA(cudaEventRecord(e0));
      kernel<<<sms, 128, smem_bytes>>>(pool, slots, tiles, check);
      BENCH_CUDA(cudaEventRecord(e1));
      BENCH_CUDA(cudaEventSynchronize(e1));
      BENCH_CUDA(cudaGetLastError());
      float ms = 0;
      BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      // The last tile of CTA 0 against the host's conversion of the same bytes.
      std::vector<uint8_t> got(9 * 8192), rowb(kRowBytes);
      BENCH_CUDA(cudaMemcpy(got.data(), check, got.size(), cudaMemcpyDeviceToHost));
      int64_t bad = 0;
      for (int r = 0; r < 64; ++r) {
        const int32_t slot = hs[static_cast<int64_t>(tiles - 1) * 64 + r];
        BENCH_CUDA(cudaMemcpy(rowb.data(), pool + static_cast<int64_t>(slot) * kRowBytes, kRowBytes,
                              cudaMemcpyDeviceToHost));
        for (int j = 0; j < 512; ++j) {
          float sc = 0;
          std::memcpy(&sc, rowb.data() + 512 + 4 * (j / 128), 4);
          const float want = static_cast<float>(
              __half(__float2half_rn(verifyd::kernels::Fp8E4m3ToFloat(rowb[j]) *
                                     static_cast<float>(__half(__float2half_rn(sc))))));
          __half gh;
          std::memcpy(&gh, got.data() + (j / 64) * 8192 + r * 128 + (j % 64) * 2, 2);
          bad += static_cast<float>(gh) != want &&
                 !(std::isnan(want) && std::isnan(static_cast<float>(gh)));
        }
        bad += std::memcmp(got.data() + 8 * 8192 + r * 128, rowb.data() + kRopeOff, 128) != 0;
      }
      const double keys = 64.0 * tiles;  // per SM
      const double cycles = (clock_khz * 1e3) * (ms * 1e-3) / keys;
      const double gbps = static_cast<double>(sms) * keys * kRowBytes / (ms * 1e-3) / 1e9;
      std::printf("| %s | %d | %.3f | %.0f | %.1f | %s |\n", capped ? "capped at 56" : "uncapped",
                  fa.numRegs, ms, gbps, cycles, bad == 0 ? "exact" : "MISMATCH");
      results.push_back({{"test", "gather_convert"},
                         {"capped", capped != 0},
                         {"regs", fa.numRegs},
                         {"ms", ms},
                         {"fp8_gbps", gbps},
                         {"cycles_per_key", cycles},
                         {"mismatches", bad}});
      BENCH_CUDA(cudaEventDestroy(e0));
      BENCH_CUDA(cudaEventDestroy(e1));
    }
    BENCH_CUDA(cudaFree(pool));
    BENCH_CUDA(cudaFree(check));
    BENCH_CUDA(cudaFree(slots));
  }
  const std::string path = absl::GetFlag(FLAGS_json);
  if (!path.empty()) {
    nlohmann::json j;
    j["bench"] = "fp8_wgmma_probe";
    j["meta"] = {{"device", prop.name},
                 {"sms", sms},
                 {"cc", std::to_string(major) + "." + std::to_string(minor)}};
    j["results"] = results;
    std::ofstream(path) << j.dump(1) << "\n";
    std::printf("wrote %s\n", path.c_str());
  }
  return 0;
}
