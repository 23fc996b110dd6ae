// The one home of the inline-PTX helpers of the verify attention kernels: cp.async (16-byte
// gathers), ldmatrix / mma.sync (sm_80+), mbarriers, named barriers, register reallocation,
// programmatic dependent launch, wgmma (sm_90a) and bulk (TMA engine) copies. Each wrapper is
// one instruction (or a fixed short sequence); a helper is compiled only where a kernel uses
// it, so the sm_90a-only ones cost nothing in the sm_80 / sm_120 builds.
// Internal device header. Thread-safety: per-thread / per-warpgroup instructions as noted.
#pragma once

#include <cstdint>

namespace verifyd::kernels::cuda::detail {

// ---- addresses, cp.async, ldmatrix, mma.sync (sm_80+) ------------------------------------

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                           uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX2(uint32_t addr, uint32_t& r0, uint32_t& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// C[16x8] += A[16x16] * B[16x8], bf16 in, fp32 accumulate.
__device__ __forceinline__ void Mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
      "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- dependent launch, register reallocation (sm_90) -------------------------------------

// Lets the next kernel of the stream (launched with programmatic stream serialization) start
// its prologue; it waits in GridDepWait() until this grid has finished.
__device__ __forceinline__ void GridDepLaunchDependents() {
  asm volatile("griddepcontrol.launch_dependents;\n");
}
__device__ __forceinline__ void GridDepWait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
// Warpgroup-wide register reallocation (setmaxnreg): the producer gives registers up, the
// math warpgroups take them.
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- mbarriers, named barriers (sm_90) ---------------------------------------------------

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
               : "memory");
}
// Blocks until the phase of `bar` with this parity has completed.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "VERIFYD_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra VERIFYD_MBAR_WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Arrives on `bar` once all of this thread's earlier cp.async copies have landed (the
// arrival is one of the barrier's expected count: .noinc).
__device__ __forceinline__ void CpAsyncMbarArrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void NamedBarSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma (sm_90a) ----------------------------------------------------------------------

// Shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63). Addresses
// and byte offsets are encoded >> 4. K-major operands: lbo unused (16), sbo = 1024 (the next
// 8 rows). MN-major operands: lbo = stride between 64-element MN groups, sbo = 1024 (the
// next 8 K rows).
__device__ __forceinline__ uint64_t WgmmaDesc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32;
  d |= 1ull << 62;
  return d;
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Orders this thread's generic-proxy shared-memory writes (cp.async, st.shared) before later
// async-proxy reads (wgmma operands).
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The wgmma wrappers below come in two input types each: bf16 (the plain name) and f16 (the
// name + F16; the FP8 seesaw variant's f16 tiles). One definition per shape, instantiated twice.

// D[64 x 64] (+)= A[64 x 16] * B[16 x 64] for one warpgroup; scale_d == 0 overwrites D.
#define VERIFYD_DEFINE_WGMMA_M64_N64_SMEM_A(NAME, TY)                                              \
  __device__ __forceinline__ void NAME(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {  \
    asm volatile(                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                               \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                    \
        " "                                                                                        \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%" \
        "24,%"                                                                                     \
        "25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n"                                  \
        "}\n"                                                                                      \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),      \
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),  \
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),            \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),            \
          "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])             \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));                                                 \
  }
VERIFYD_DEFINE_WGMMA_M64_N64_SMEM_A(WgmmaM64N64SmemA, "bf16")
VERIFYD_DEFINE_WGMMA_M64_N64_SMEM_A(WgmmaM64N64SmemAF16, "f16")

// D[64 x 64] = A[64 x 16] * B[16 x 64] (D write-only: the first k step of a product).
#define VERIFYD_DEFINE_WGMMA_M64_N64_SMEM_A_FIRST(NAME, TY)                                        \
  __device__ __forceinline__ void NAME(float* d, uint64_t desc_a, uint64_t desc_b) {               \
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                           \
                 " "                                                                               \
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21," \
                 "%22,%23,%24,%"                                                                   \
                 "25,%26,%27,%28,%29,%30,%31}, %32, %33, 0, 1, 1, 0, 0;\n"                         \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]),         \
                   "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]),       \
                   "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]),   \
                   "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]),   \
                   "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]),   \
                   "=f"(d[30]), "=f"(d[31])                                                        \
                 : "l"(desc_a), "l"(desc_b));                                                      \
  }
VERIFYD_DEFINE_WGMMA_M64_N64_SMEM_A_FIRST(WgmmaM64N64SmemAFirst, "bf16")
VERIFYD_DEFINE_WGMMA_M64_N64_SMEM_A_FIRST(WgmmaM64N64SmemAFirstF16, "f16")

// D[64 x 128] (+)= A[64 x 16] * B[16 x 128] for one warpgroup; scale_d == 0 overwrites D.
#define VERIFYD_DEFINE_WGMMA_M64_N128_REG_A(NAME, TY)                                              \
  __device__ __forceinline__ void NAME(float* d, const uint32_t* a, uint64_t desc_b,               \
                                       int scale_d) {                                              \
    asm volatile(                                                                                  \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                               \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                                   \
        " "                                                                                        \
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%" \
        "24,%"                                                                                     \
        "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%" \
        "47,%"                                                                                     \
        "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, "     \
        "%68, p, "                                                                                 \
        "1, 1, 1;\n"                                                                               \
        "}\n"                                                                                      \
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
          "+f"(d[62]), "+f"(d[63])                                                                 \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));                  \
  }
VERIFYD_DEFINE_WGMMA_M64_N128_REG_A(WgmmaM64N128RegA, "bf16")
VERIFYD_DEFINE_WGMMA_M64_N128_REG_A(WgmmaM64N128RegAF16, "f16")

// D[64 x 128] += A[64 x 16] (smem, K-major) * B[16 x 128] (smem, MN-major: V read
// transposed); always accumulates.
#define VERIFYD_DEFINE_WGMMA_M64_N128_SMEM_A_V_TRANS(NAME, TY)                                     \
  __device__ __forceinline__ void NAME(float* d, uint64_t desc_a, uint64_t desc_b) {               \
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY                          \
                 " "                                                                               \
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21," \
                 "%22,%23,%24,%"                                                                   \
                 "25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44," \
                 "%45,%46,%47,%"                                                                   \
                 "48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, 1, "  \
                 "1, 1, 0, 1;\n"                                                                   \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),         \
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),       \
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),   \
                   "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),   \
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),   \
                   "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),   \
                   "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),   \
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),   \
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),   \
                   "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),   \
                   "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])                              \
                 : "l"(desc_a), "l"(desc_b));                                                      \
  }
VERIFYD_DEFINE_WGMMA_M64_N128_SMEM_A_V_TRANS(WgmmaM64N128SmemAVTrans, "bf16")
VERIFYD_DEFINE_WGMMA_M64_N128_SMEM_A_V_TRANS(WgmmaM64N128SmemAVTransF16, "f16")

// D[64 x 16] += A[64 x 16] (registers: a[0..3] as for mma.sync's A) * B[16 x 16] (smem,
// K-major) for one warpgroup, f16 inputs.
__device__ __forceinline__ void WgmmaM64N16RegAF16(float* d, const uint32_t* a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
// Same with bf16 inputs.
__device__ __forceinline__ void WgmmaM64N16RegABf16(float* d, const uint32_t* a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, 1, 1, 1, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
// Keeps `r` live (and unmoved) up to this point: after a wgmma.wait_group, for the registers a
// register-A wgmma read asynchronously.
__device__ __forceinline__ void KeepLive(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// Four e4m3 codes (byte 0 first) to two f16x2: lo = bytes 0, 1; hi = bytes 2, 3 (exact).
__device__ __forceinline__ void E4m3x4ToF16x2x2(uint32_t codes, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\n"
      "cvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(codes));
}

// ---- math, loads, bulk copies ------------------------------------------------------------

// 2^e as a float, e in [-126, 127].
__device__ __forceinline__ float Pow2(int e) { return __int_as_float((127 + e) << 23); }

// 2^x on the MUFU unit without exp2f's denormal-range fix-up (results below 2^-126 flush
// to 0: a probability that small relative to the row max does not matter); 2^-inf = 0.
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A 32-bit global load the compiler cannot merge with an earlier one (so the value need not
// stay in a register until here).
__device__ __forceinline__ int LoadFresh(const int32_t* p) {
  int v;
  asm volatile("ld.global.nc.b32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

// Copies `bytes` (a multiple of 16) from shared memory to global memory with the bulk-copy
// (TMA) engine; completes asynchronously (commit_group / wait_group).
__device__ __forceinline__ void BulkStore(void* gdst, uint32_t ssrc, int bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(gdst),
               "r"(ssrc), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BulkCommit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Waits until every committed bulk copy of this thread has read its shared-memory source.
__device__ __forceinline__ void BulkWaitRead0() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

}  // namespace verifyd::kernels::cuda::detail
