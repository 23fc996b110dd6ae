// Python binding of FlashMLA's dense decode and sm90 sparse FP8 decode alone, for the same-run
// peer bench (bench/peers/flashmla_mla.py, --kv-dtype bf16 / fp8; built by
// bench/peers/build_flashmla.sh from a FlashMLA checkout). FlashMLA's own binding also
// registers its sparse prefill and sm100 kernels, which that bench does not use; this one
// registers the two decode entry points under the names that FlashMLA's Python interface
// (flash_mla_interface.py) calls: dense_decode_fwd and sparse_decode_fwd.
//
// The sparse dispatcher (csrc/api/sparse_decode.h) names kernels that build_flashmla.sh does
// not compile: the sm100 ones (chosen only on sm_100 family GPUs) and the sm90 ones of the
// MODEL1 cache format (d_qk 512; the bench uses the V3.2 format, d_qk 576). They get explicit
// specializations here, declared before sparse_decode.h is included, that raise an error if
// ever reached, so the module links and loads without them.
#include <pybind11/pybind11.h>

#include "common.h"  // FlashMLA: csrc/api/common.h (torch, TORCH_CHECK)
#include "params.h"  // FlashMLA: csrc/params.h (SparseAttnDecodeParams, ModelType)
#include "sm100/decode/head64/kernel.h"
#include "sm100/prefill/sparse/fwd_for_small_topk/head128/phase1.h"
#include "sm90/decode/sparse_fp8/splitkv_mla.h"

namespace sm100::decode::head64 {
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::V32>(const SparseAttnDecodeParams&) {
  TORCH_CHECK(false, "flashmla peer build: sm100 sparse decode (head64, V32) is not built "
                     "(bench/peers/build_flashmla.sh builds sm_90a only)");
}
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1>(const SparseAttnDecodeParams&) {
  TORCH_CHECK(false, "flashmla peer build: sm100 sparse decode (head64, MODEL1) is not built "
                     "(bench/peers/build_flashmla.sh builds sm_90a only)");
}
}  // namespace sm100::decode::head64

namespace sm100::fwd_for_small_topk::head128 {
template <>
void run_fwd_for_small_topk_phase1_kernel<SparseAttnFwdMode::DecodeWithSplitKV, 512>(
    const SparseAttnDecodeParams&) {
  TORCH_CHECK(false, "flashmla peer build: sm100 sparse decode (head128, d_qk 512) is not "
                     "built (bench/peers/build_flashmla.sh builds sm_90a only)");
}
}  // namespace sm100::fwd_for_small_topk::head128

namespace sm90::decode::sparse_fp8 {
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1, 64>(const SparseAttnDecodeParams&) {
  TORCH_CHECK(false, "flashmla peer build: sm90 sparse decode of the MODEL1 cache format "
                     "(d_qk 512) is not built; only V3.2 (d_qk 576, 656 bytes a token)");
}
template <>
void run_flash_splitkv_mla_fp8_sparse_kernel<ModelType::MODEL1, 128>(const SparseAttnDecodeParams&) {
  TORCH_CHECK(false, "flashmla peer build: sm90 sparse decode of the MODEL1 cache format "
                     "(d_qk 512) is not built; only V3.2 (d_qk 576, 656 bytes a token)");
}
}  // namespace sm90::decode::sparse_fp8

#include "dense_decode.h"   // FlashMLA: csrc/api/dense_decode.h
#include "sparse_decode.h"  // FlashMLA: csrc/api/sparse_decode.h

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "FlashMLA dense decode (bf16) and sparse FP8 decode (V3.2 format), sm_90a";
  m.def("dense_decode_fwd", &dense_attn_decode_interface);
  m.def("sparse_decode_fwd", &sparse_attn_decode_interface);
}
