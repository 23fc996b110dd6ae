// Exit-on-failure checks for the CUDA benchmark programs that have nothing to recover
// (moe_layer_bench, fp8_wgmma_probe; host only): a CUDA runtime call that fails, or an
// absl::Status that is not OK, prints where and what on stderr and exits with status 1.
// (verify_attention_bench returns from the failing shape instead: its own checks.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

#define BENCH_OK(expr)                                                                 \
  do {                                                                                 \
    const absl::Status st_ = (expr);                                                   \
    if (!st_.ok()) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, st_.ToString().c_str()); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)
#define BENCH_CUDA(expr)                                                                          \
  do {                                                                                            \
    const cudaError_t e_ = (expr);                                                                \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)
