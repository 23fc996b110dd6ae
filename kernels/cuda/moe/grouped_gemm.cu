// Grouped expert GEMMs on sm_90a through CUTLASS 3 ptr-array grouped kernels with device-side
// problem shapes (see grouped_gemm.h).
//
// Configurations (one kernel each, chosen once; the tile shapes are CUTLASS's Hopper
// defaults for these types, measured in bench/moe_layer_bench):
//   bf16: cooperative warp-specialized, 128 x 128 x 64 tiles, TMA epilogue, fp32 D.
//   fp8:  cooperative warp-specialized with blockwise scaling (scale granularity 1 x 128 on
//         A, 128 x 128 on B, both scale tensors K-major), 128 x 128 x 128 tiles, fp32 D;
//         tile_m 64: the ping-pong schedule with 64 x 128 x 128 tiles.
// The per-call arguments (problem sizes, pointers, strides, scale layouts) live in device
// arrays that a setup kernel rewrites from the offsets before every launch; the CUTLASS
// arguments point at those arrays and never change, so the kernel is initialized once.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/thread/linear_combination.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/moe/grouped_gemm.h"
#include "kernels/status.h"

namespace verifyd::kernels::cuda {

std::string GroupedGemmKindName(GroupedGemmKind kind) {
  return kind == GroupedGemmKind::kBf16 ? "bf16" : "fp8-block128";
}

namespace {

using namespace cute;  // NOLINT: CUTLASS's type vocabulary

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
using UnderlyingShape = ProblemShape::UnderlyingProblemShape;

// The epilogue and mainloop of one configuration. ElementC = void: D = accumulator.
template <class ElementAB, class TileShape, class KernelSchedule, class MainloopLayoutA,
          class MainloopLayoutB,
          class EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>
struct GemmTypes {
  using ElementD = float;
  using LayoutA = cutlass::layout::RowMajor;     // a[rows, k]
  using LayoutB = cutlass::layout::ColumnMajor;  // b_g[n, k] row-major = k x n column-major
  using LayoutD = cutlass::layout::RowMajor;     // d[rows, n]
  static constexpr int kAlignAB = 128 / cutlass::sizeof_bits<ElementAB>::value;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using ClusterShape = Shape<_1, _1, _1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, kAlignD,
      ElementD, LayoutD*, kAlignD, EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, MainloopLayoutA, kAlignAB,
      ElementAB, MainloopLayoutB, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
};

using Bf16Types = GemmTypes<cutlass::bfloat16_t, Shape<_128, _128, _64>,
                            cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                            cutlass::layout::RowMajor*, cutlass::layout::ColumnMajor*>;

using Fp8ScaleConfig =
    cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128, GMMA::Major::K, GMMA::Major::K>;
using LayoutSFA = decltype(Fp8ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(Fp8ScaleConfig::deduce_layoutSFB());
using Fp8Types = GemmTypes<cutlass::float_e4m3_t, Shape<_128, _128, _128>,
                           cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise,
                           cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>,
                           cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>>;

// 64-row tiles (two consumer warp groups on alternating tiles): less MMA work wasted when the
// experts get few rows each (decode and small verify batches).
using Fp8M64Types = GemmTypes<cutlass::float_e4m3_t, Shape<_64, _128, _128>,
                              cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise,
                              cute::tuple<cutlass::layout::RowMajor*, LayoutSFA*>,
                              cute::tuple<cutlass::layout::ColumnMajor*, LayoutSFB*>,
                              cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;

// The device arrays one launch reads, rewritten by the setup kernel.
template <class T>
struct DeviceArgs {
  UnderlyingShape* shapes;
  const typename T::Mainloop::ElementA** ptr_a;  // NOLINT
  const typename T::Mainloop::ElementB** ptr_b;
  float** ptr_d;
  typename T::StrideA* stride_a;
  typename T::StrideB* stride_b;
  typename T::StrideD* stride_d;
  // fp8 only
  const float** ptr_sfa;
  const float** ptr_sfb;
  LayoutSFA* layout_sfa;
  LayoutSFB* layout_sfb;
};

template <class T, bool kFp8>
__global__ void SetupKernel(DeviceArgs<T> out, int groups, int n, int k, const int32_t* offsets,
                            const uint8_t* a, const float* a_scale, const uint8_t* b,
                            const float* b_scale, float* d) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const int64_t o = offsets[g];
  const int m = offsets[g + 1] - offsets[g];
  constexpr int64_t kElemBytes = sizeof(typename T::Mainloop::ElementA);
  out.shapes[g] = UnderlyingShape(m, n, k);
  out.ptr_a[g] = reinterpret_cast<const typename T::Mainloop::ElementA*>(a + o * k * kElemBytes);
  out.ptr_b[g] = reinterpret_cast<const typename T::Mainloop::ElementB*>(
      b + static_cast<int64_t>(g) * n * k * kElemBytes);
  out.ptr_d[g] = d + o * n;
  typename T::StrideA sa{};
  get<0>(sa) = k;
  out.stride_a[g] = sa;
  typename T::StrideB sb{};
  get<0>(sb) = k;
  out.stride_b[g] = sb;
  typename T::StrideD sd{};
  get<0>(sd) = n;
  out.stride_d[g] = sd;
  if constexpr (kFp8) {
    out.ptr_sfa[g] = a_scale + o * (k / 128);
    out.ptr_sfb[g] = b_scale + static_cast<int64_t>(g) * (n / 128) * (k / 128);
    out.layout_sfa[g] = Fp8ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
    out.layout_sfb[g] = Fp8ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
  }
}

template <class T, bool kFp8>
class GroupedGemmImpl final : public GroupedGemm {
 public:
  explicit GroupedGemmImpl(const GroupedGemmShape& shape) : shape_(shape) {}
  ~GroupedGemmImpl() override {
    if (arena_ != nullptr) cudaFree(arena_);
  }

  absl::Status Init() {
    const int G = shape_.groups;
    // One arena for the argument arrays (each 256-byte aligned) then CUTLASS's workspace.
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t at = off;
      off += (bytes + 255) / 256 * 256;
      return at;
    };
    const size_t o_shapes = take(G * sizeof(UnderlyingShape));
    const size_t o_pa = take(G * sizeof(void*)), o_pb = take(G * sizeof(void*));
    const size_t o_pd = take(G * sizeof(void*));
    const size_t o_sa = take(G * sizeof(typename T::StrideA));
    const size_t o_sb = take(G * sizeof(typename T::StrideB));
    const size_t o_sd = take(G * sizeof(typename T::StrideD));
    const size_t o_psfa = take(kFp8 ? G * sizeof(void*) : 0);
    const size_t o_psfb = take(kFp8 ? G * sizeof(void*) : 0);
    const size_t o_lsfa = take(kFp8 ? G * sizeof(LayoutSFA) : 0);
    const size_t o_lsfb = take(kFp8 ? G * sizeof(LayoutSFB) : 0);
    const size_t args_bytes = off;
    // Workspace size from arguments that point into the arena (sizes need no data).
    auto build = [&](char* base) {
      DeviceArgs<T> d{};
      d.shapes = reinterpret_cast<UnderlyingShape*>(base + o_shapes);
      d.ptr_a = reinterpret_cast<decltype(d.ptr_a)>(base + o_pa);
      d.ptr_b = reinterpret_cast<decltype(d.ptr_b)>(base + o_pb);
      d.ptr_d = reinterpret_cast<float**>(base + o_pd);
      d.stride_a = reinterpret_cast<typename T::StrideA*>(base + o_sa);
      d.stride_b = reinterpret_cast<typename T::StrideB*>(base + o_sb);
      d.stride_d = reinterpret_cast<typename T::StrideD*>(base + o_sd);
      d.ptr_sfa = reinterpret_cast<const float**>(base + o_psfa);
      d.ptr_sfb = reinterpret_cast<const float**>(base + o_psfb);
      d.layout_sfa = reinterpret_cast<LayoutSFA*>(base + o_lsfa);
      d.layout_sfb = reinterpret_cast<LayoutSFB*>(base + o_lsfb);
      return d;
    };
    cutlass::KernelHardwareInfo hw;
    hw.device_id = shape_.device;
    hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(shape_.device);
    auto make_args = [&](const DeviceArgs<T>& d) {
      typename T::Gemm::Arguments args;
      args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
      args.problem_shape = {G, d.shapes, nullptr};  // device-side shapes only
      if constexpr (kFp8) {
        args.mainloop = {d.ptr_a,   d.stride_a,   d.ptr_b,   d.stride_b,
                         d.ptr_sfa, d.layout_sfa, d.ptr_sfb, d.layout_sfb};
      } else {
        args.mainloop = {d.ptr_a, d.stride_a, d.ptr_b, d.stride_b};
      }
      args.epilogue.thread.alpha = 1.f;
      args.epilogue.thread.beta = 0.f;
      args.epilogue.ptr_C = nullptr;
      args.epilogue.dC = d.stride_d;  // unused (no C)
      args.epilogue.ptr_D = d.ptr_d;
      args.epilogue.dD = d.stride_d;
      args.hw_info = hw;
      return args;
    };
    // Size pass with a fake base (no dereference), then allocate and build for real.
    const size_t ws = T::Gemm::get_workspace_size(make_args(build(nullptr)));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMalloc(&arena_, args_bytes + ws + 256));
    bytes_ = args_bytes + ws + 256;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemset(arena_, 0, bytes_));
    dev_ = build(static_cast<char*>(arena_));
    args_ = make_args(dev_);
    workspace_ = static_cast<char*>(arena_) + args_bytes;
    const cutlass::Status st = gemm_.can_implement(args_);
    if (st != cutlass::Status::kSuccess) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grouped gemm ", GroupedGemmKindName(shape_.kind), " n=", shape_.n, " k=", shape_.k,
          ": CUTLASS cannot implement it (", cutlassGetStatusString(st), ")"));
    }
    const cutlass::Status init = gemm_.initialize(args_, workspace_, nullptr);
    if (init != cutlass::Status::kSuccess) {
      return absl::InternalError(
          absl::StrCat("grouped gemm initialize: ", cutlassGetStatusString(init)));
    }
    // initialize() and the memset ran on the legacy stream; Run() uses the caller's (possibly
    // non-blocking) stream: finish them here.
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return absl::OkStatus();
  }

  absl::Status Run(const GroupedGemmArgs& a) override {
    auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
    if (a.offsets == nullptr || a.a == nullptr || a.b == nullptr || a.d == nullptr) {
      return absl::InvalidArgumentError("grouped gemm: offsets, a, b and d are required");
    }
    if (misaligned(a.a) || misaligned(a.b) || misaligned(a.d)) {
      return absl::InvalidArgumentError("grouped gemm: a, b and d must be 16-byte aligned");
    }
    if (kFp8 && (a.a_scale == nullptr || a.b_scale == nullptr)) {
      return absl::InvalidArgumentError("grouped gemm fp8: a_scale and b_scale are required");
    }
    auto stream = static_cast<cudaStream_t>(a.stream);
    const int G = shape_.groups;
    SetupKernel<T, kFp8><<<(G + 127) / 128, 128, 0, stream>>>(
        dev_, G, static_cast<int>(shape_.n), static_cast<int>(shape_.k), a.offsets,
        static_cast<const uint8_t*>(a.a), a.a_scale, static_cast<const uint8_t*>(a.b), a.b_scale,
        a.d);
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    const cutlass::Status st = gemm_.run(stream);
    if (st != cutlass::Status::kSuccess) {
      return absl::InternalError(absl::StrCat("grouped gemm run: ", cutlassGetStatusString(st)));
    }
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return absl::OkStatus();
  }

  const GroupedGemmShape& shape() const override { return shape_; }
  size_t device_bytes() const override { return bytes_; }

 private:
  GroupedGemmShape shape_;
  void* arena_ = nullptr;
  size_t bytes_ = 0;
  void* workspace_ = nullptr;
  DeviceArgs<T> dev_{};
  typename T::Gemm::Arguments args_;
  typename T::Gemm gemm_;
};

}  // namespace

bool GroupedGemmAvailable(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major == 9 && minor == 0;
}

absl::StatusOr<std::unique_ptr<GroupedGemm>> GroupedGemm::Create(const GroupedGemmShape& s) {
  if (!GroupedGemmAvailable(s.device)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "grouped gemm: device ", s.device, " is not an sm_90 GPU (CUTLASS grouped kernels)"));
  }
  if (s.groups <= 0) return absl::InvalidArgumentError("grouped gemm: groups must be > 0");
  if (s.n <= 0 || s.n % 16 != 0 || s.n > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grouped gemm: n must be a positive multiple of 16, got ", s.n));
  }
  if (s.k <= 0 || s.k % 16 != 0 || s.k > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grouped gemm: k must be a positive multiple of 16, got ", s.k));
  }
  if (s.kind == GroupedGemmKind::kFp8Block128 && (s.n % 128 != 0 || s.k % 128 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "grouped gemm fp8: n and k must be multiples of 128, got n=", s.n, " k=", s.k));
  }
  if (s.tile_m != 128 && !(s.tile_m == 64 && s.kind == GroupedGemmKind::kFp8Block128)) {
    return absl::InvalidArgumentError(
        absl::StrCat("grouped gemm: tile_m must be 128 (or 64 for fp8), got ", s.tile_m));
  }
  std::unique_ptr<GroupedGemm> out;
  if (s.kind == GroupedGemmKind::kBf16) {
    auto impl = std::make_unique<GroupedGemmImpl<Bf16Types, false>>(s);
    VERIFYD_RETURN_IF_ERROR(impl->Init());
    out = std::move(impl);
  } else if (s.tile_m == 64) {
    auto impl = std::make_unique<GroupedGemmImpl<Fp8M64Types, true>>(s);
    VERIFYD_RETURN_IF_ERROR(impl->Init());
    out = std::move(impl);
  } else {
    auto impl = std::make_unique<GroupedGemmImpl<Fp8Types, true>>(s);
    VERIFYD_RETURN_IF_ERROR(impl->Init());
    out = std::move(impl);
  }
  return out;
}

}  // namespace verifyd::kernels::cuda
