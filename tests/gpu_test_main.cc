// main() of every GPU test binary (label gpu): on a machine without a visible CUDA device it
// runs nothing and exits with kSkipReturnCode, which CTest reports as Skipped (the tests'
// SKIP_RETURN_CODE), so a CPU-only CI never counts a GPU suite as Passed. Tests that need no
// GPU belong in a cpu-labelled binary.
#include <cstdio>

#include "gtest/gtest.h"
#include "tests/gpu_test_util.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (verifyd::test_util::CudaDeviceCount() == 0) {
    std::printf("no CUDA device visible: every test of this GPU suite skipped\n");
    return verifyd::test_util::kSkipReturnCode;
  }
  return RUN_ALL_TESTS();
}
