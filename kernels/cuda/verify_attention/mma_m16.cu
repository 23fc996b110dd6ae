// The 16-row mma.sync variants (variants.h: MmaM16Sm90, MmaM16Portable and their FP8-cache
// twins MmaM16Fp8Sm90, MmaM16Fp8Portable): their kernels are
// instantiated here, each with a body only in the builds for the architectures it runs on.
#include "kernels/cuda/verify_attention/mma.cuh"

namespace verifyd::kernels::cuda::detail {

absl::Status MmaM16Sm90::Launch(const VerifyKernelArgs& args, int grid, void* stream) {
  return LaunchMmaVariant<MmaM16Sm90>(args, grid, stream);
}

absl::Status MmaM16Portable::Launch(const VerifyKernelArgs& args, int grid, void* stream) {
  return LaunchMmaVariant<MmaM16Portable>(args, grid, stream);
}

absl::Status MmaM16Fp8Sm90::Launch(const VerifyKernelArgs& args, int grid, void* stream) {
  return LaunchMmaVariant<MmaM16Fp8Sm90>(args, grid, stream);
}

absl::Status MmaM16Fp8Portable::Launch(const VerifyKernelArgs& args, int grid, void* stream) {
  return LaunchMmaVariant<MmaM16Fp8Portable>(args, grid, stream);
}

}  // namespace verifyd::kernels::cuda::detail
