// main() of every GPU test binary (label gpu): on a machine without a visible CUDA device it
// runs nothing and exits with kSkipReturnCode, which CTest reports as Skipped (the tests'
// SKIP_RETURN_CODE), so a CPU-only CI never counts a GPU suite as Passed. Tests that need no
// GPU belong in a cpu-labelled binary. A GPU suite runs alone on its machine, and the C++
// reference it compares against (long contexts, many heads) is most of its run time: unless
// VERIFYD_REF_THREADS is set, the reference may use every core (kernels/reference/parallel.h
// caps it at 4 otherwise, for the CPU suites that CTest runs side by side).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0) {
    const std::string threads = std::to_string(std::min(cores, 1024u));
    setenv("VERIFYD_REF_THREADS", threads.c_str(), /*overwrite=*/0);  // a set value wins
  }
  if (verifyd::test_util::CudaDeviceCount() == 0) {
    std::printf("no CUDA device visible: every test of this GPU suite skipped\n");
    return verifyd::test_util::kSkipReturnCode;
  }
  return RUN_ALL_TESTS();
}
