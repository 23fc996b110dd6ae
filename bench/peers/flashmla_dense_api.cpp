// Python binding of FlashMLA's dense decode alone, for the same-run peer bench
// (bench/peers/flashmla_mla.py, built by bench/peers/build_flashmla.sh from a FlashMLA
// checkout). FlashMLA's own binding also registers its sparse and sm100 kernels, which that
// bench does not use; this one registers the dense decode entry point under the name that
// FlashMLA's Python interface (flash_mla_interface.py) calls.
#include <pybind11/pybind11.h>

#include "dense_decode.h"  // FlashMLA: csrc/api/dense_decode.h

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "FlashMLA dense decode (sm_90a, bf16)";
  m.def("dense_decode_fwd", &dense_attn_decode_interface);
}
