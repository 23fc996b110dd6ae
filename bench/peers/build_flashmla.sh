#!/usr/bin/env bash
# Builds FlashMLA's dense bf16 decode kernel and its sparse FP8 decode kernel (both sm_90a) as
# a Python module for the same-run peer bench (bench/peers/flashmla_mla.py, --kv-dtype bf16 /
# fp8), from a FlashMLA source checkout that you provide (https://github.com/deepseek-ai/FlashMLA;
# nothing of it is kept in this repository).
#
#   bench/peers/build_flashmla.sh kernels SRC OUT   # nvcc only: needs no PyTorch, no GPU
#   bench/peers/build_flashmla.sh module  SRC OUT   # the binding; needs python3 with torch
#   bench/peers/build_flashmla.sh all     SRC OUT
#
# OUT becomes a folder to put on PYTHONPATH: OUT/flash_mla/{__init__.py,
# flash_mla_interface.py (FlashMLA's own), cuda.so}. Only the dense decode and the sm90 sparse
# FP8 decode in the V3.2 cache format (656 bytes a token: the instantiations
# v32_persistent_h64/h128) are built (its own setup.py also builds the sparse prefill, MODEL1
# and sm100 kernels, ~30 translation units the peer bench does not use; the binding,
# flashmla_dense_api.cpp, makes the ones the sparse dispatcher names but this build leaves out
# raise an error); fp16 is left out (FLASH_MLA_DISABLE_FP16). The kernels are compiled
# with FlashMLA's own nvcc flags for sm_90a. CUTLASS headers: CUTLASS_INCLUDE, default the
# ones scripts/fetch-cutlass.sh fetches (FlashMLA pins its own CUTLASS as a git submodule;
# its dense decode builds against the pinned nvidia-cutlass headers as well).
set -euo pipefail
step=${1:?kernels|module|all}; src=$(cd "${2:?FlashMLA source}" && pwd); out=${3:?output folder}
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$out/obj" "$out/flash_mla"
out=$(cd "$out" && pwd)
cutlass=${CUTLASS_INCLUDE:-$here/.deps/cutlass/include}
[ -d "$cutlass/cute" ] || { echo "build_flashmla: no CUTLASS headers at $cutlass (run scripts/fetch-cutlass.sh or set CUTLASS_INCLUDE)" >&2; exit 2; }
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
incs=(-I"$src/csrc" -I"$src/csrc/api" -I"$src/csrc/kerutils/include" -I"$src/csrc/sm90" -I"$cutlass")
defs=(-DNDEBUG -DFLASH_MLA_DISABLE_FP16 -D_USE_MATH_DEFINES)
kernels=(sm90/decode/dense/instantiations/bf16.cu smxx/decode/combine/combine.cu
         smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu
         sm90/decode/sparse_fp8/instantiations/v32_persistent_h64.cu
         sm90/decode/sparse_fp8/instantiations/v32_persistent_h128.cu)

if [ "$step" = kernels ] || [ "$step" = all ]; then
  pids=()
  for k in "${kernels[@]}"; do
    o=$out/obj/$(basename "${k%.cu}").o
    [ "$o" -nt "$src/csrc/$k" ] && continue
    "$nvcc" -c "$src/csrc/$k" -o "$o" -O3 -std=c++20 "${defs[@]}" "${incs[@]}" \
      -Xcompiler -fPIC -Wno-deprecated-declarations \
      -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__ \
      -U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__ \
      --expt-relaxed-constexpr --expt-extended-lambda --use_fast_math \
      --ptxas-options=--register-usage-level=10 -lineinfo \
      -gencode arch=compute_90a,code=sm_90a &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  echo "build_flashmla: kernels in $out/obj"
fi

if [ "$step" = module ] || [ "$step" = all ]; then
  objs=()
  for k in "${kernels[@]}"; do
    o=$out/obj/$(basename "${k%.cu}").o
    [ -f "$o" ] || { echo "build_flashmla: $o is missing: run step kernels first" >&2; exit 2; }
    objs+=("$o")
  done
  py=${PYTHON:-python3}
  read -r -a tflags < <("$py" - <<'PY'
import sysconfig, torch, torch.utils.cpp_extension as ce
inc = ce.include_paths(device_type="cuda") if "device_type" in ce.include_paths.__code__.co_varnames else ce.include_paths(cuda=True)
print(" ".join(["-I" + p for p in inc] + ["-I" + sysconfig.get_paths()["include"],
      "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)]))
PY
)
  tlib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  cuda_home=$(dirname "$(dirname "$nvcc")")
  cccl=()  # CUDA 13 keeps libcu++ (cuda/std/...) under include/cccl; nvcc adds it, g++ does not
  [ -d "$cuda_home/include/cccl" ] && cccl=(-I"$cuda_home/include/cccl")
  g++ -shared -fPIC -O2 -std=c++20 -DTORCH_EXTENSION_NAME=cuda -DTORCH_API_INCLUDE_EXTENSION_H \
    "${defs[@]}" "${incs[@]}" "${tflags[@]}" -I"$cuda_home/include" "${cccl[@]}" -Wno-deprecated-declarations \
    "$here/bench/peers/flashmla_dense_api.cpp" "${objs[@]}" -o "$out/flash_mla/cuda.so" \
    -L"$tlib" -Wl,-rpath,"$tlib" -lc10 -lc10_cuda -ltorch -ltorch_cpu -ltorch_cuda -ltorch_python \
    -L"$cuda_home/lib64" -lcudart
  cp "$src/flash_mla/flash_mla_interface.py" "$out/flash_mla/"
  printf 'from flash_mla.flash_mla_interface import get_mla_metadata, flash_mla_with_kvcache\n' \
    > "$out/flash_mla/__init__.py"
  echo "build_flashmla: module in $out/flash_mla"
fi
