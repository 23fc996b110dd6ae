// The CUDA half of the verify attention's host API: device query, workspace allocation, plan
// upload, and VerifyAttentionCuda (argument checks, variant dispatch through the table in
// variants.h, the combine launch).
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/verify_attention/api.h"
#include "kernels/cuda/verify_attention/combine.cuh"
#include "kernels/cuda/verify_attention/kernel_args.cuh"
#include "kernels/cuda/verify_attention/plan.h"
#include "kernels/cuda/verify_attention/positional.cuh"
#include "kernels/cuda/verify_attention/staging.cuh"
#include "kernels/cuda/verify_attention/variants.h"
#include "kernels/status.h"

namespace verifyd::kernels::cuda {

absl::StatusOr<VerifyAttentionDeviceInfo> VerifyAttentionDeviceInfo::Query() {
  int dev = 0;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  VerifyAttentionDeviceInfo info;
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, dev));
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&info.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  VERIFYD_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&info.cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &info.max_smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &info.max_smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  return info;
}

absl::StatusOr<VerifyAttentionWorkspace> VerifyAttentionWorkspace::Allocate(
    int max_work_items, int max_combine_items, int64_t max_partial_rows, int max_index_tasks,
    int64_t max_index_entries, int64_t max_staged_keys) {
  if (max_work_items < 1 || max_combine_items < 0 || max_partial_rows < 0 || max_index_tasks < 0 ||
      max_index_entries < 0 || max_staged_keys < 0 || max_staged_keys > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        "workspace: capacities must be positive (max_staged_keys below 2^31)");
  }
  VerifyAttentionWorkspace ws;
  ws.bytes = BytesFor(max_work_items, max_combine_items, max_partial_rows, max_index_tasks,
                      max_index_entries, max_staged_keys);
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMalloc(&ws.device, ws.bytes));
  ws.max_work_items = max_work_items;
  ws.max_combine_items = max_combine_items;
  ws.max_partial_rows = max_partial_rows;
  ws.max_index_tasks = max_index_tasks;
  ws.max_index_entries = max_index_entries;
  ws.max_staged_keys = max_staged_keys;
  return ws;
}

absl::StatusOr<VerifyAttentionWorkspace> VerifyAttentionWorkspace::AllocateDefault(
    int64_t max_staged_keys) {
  return AllocateLike(DefaultCapacity(max_staged_keys));
}

absl::StatusOr<VerifyAttentionWorkspace> VerifyAttentionWorkspace::AllocateLike(
    const VerifyAttentionWorkspace& c) {
  return Allocate(c.max_work_items, c.max_combine_items, c.max_partial_rows, c.max_index_tasks,
                  c.max_index_entries, c.max_staged_keys);
}

absl::Status VerifyAttentionWorkspace::Free() {
  if (device != nullptr) VERIFYD_CUDA_RETURN_IF_ERROR(cudaFree(device));
  device = nullptr;
  bytes = 0;
  return absl::OkStatus();
}

absl::Status UploadVerifyAttentionPlan(const VerifyAttentionPlan& plan,
                                       const VerifyAttentionWorkspace& ws, void* stream) {
  if (!detail::PlanFitsWorkspace(plan, ws)) {
    return absl::InvalidArgumentError("verify plan: does not fit the workspace");
  }
  const detail::WorkspaceLayout l =
      detail::LayoutWorkspace(ws.max_work_items, ws.max_combine_items, ws.max_partial_rows,
                              ws.max_index_tasks, ws.max_index_entries, ws.max_staged_keys);
  auto* base = static_cast<unsigned char*>(ws.device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (!plan.work.empty()) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + l.work, plan.work.data(),
                                                 plan.work.size() * sizeof(VerifyWorkItem),
                                                 cudaMemcpyHostToDevice, s));
  }
  if (!plan.combine.empty()) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + l.combine, plan.combine.data(),
                                                 plan.combine.size() * sizeof(VerifyCombineItem),
                                                 cudaMemcpyHostToDevice, s));
  }
  if (!plan.index_tasks.empty()) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base + l.tasks, plan.index_tasks.data(),
                                                 plan.index_tasks.size() * sizeof(VerifyIndexTask),
                                                 cudaMemcpyHostToDevice, s));
  }
  return absl::OkStatus();
}

absl::Status VerifyAttentionCuda(const VerifyAttentionParams& p, const VerifyAttentionPlan& plan,
                                 const VerifyAttentionWorkspace& ws) {
  if (p.kv_fp8 != plan.kv_fp8) {
    return absl::InvalidArgumentError(absl::StrCat("verify attention: the plan was made for ",
                                                   plan.kv_fp8 ? "an FP8" : "a bf16",
                                                   " latent cache; params.kv_fp8 says otherwise"));
  }
  if (p.batch != plan.batch || p.num_heads != plan.num_heads || p.total_rows != plan.total_rows) {
    return absl::InvalidArgumentError(absl::StrCat("verify attention: plan was made for batch ",
                                                   plan.batch, ", heads ", plan.num_heads,
                                                   ", rows ", plan.total_rows, "; params have ",
                                                   p.batch, ", ", p.num_heads, ", ", p.total_rows));
  }
  if (p.dtype != DType::kBFloat16 || p.qk_dim != detail::kQkDim || p.v_dim != detail::kVDim ||
      p.mask_words < 1 || p.mask_words > kMaxTailRows / 64) {
    return absl::UnimplementedError(
        "verify attention (CUDA): unsupported params "
        "(see SupportsVerifyAttentionCuda)");
  }
  if (plan.work.empty()) return absl::OkStatus();
  if (p.q == nullptr) return absl::InvalidArgumentError("verify attention: q is null");
  if (p.kv == nullptr) return absl::InvalidArgumentError("verify attention: kv is null");
  if (p.kv_indices == nullptr)
    return absl::InvalidArgumentError("verify attention: kv_indices is null");
  if (p.tree_mask == nullptr)
    return absl::InvalidArgumentError("verify attention: tree_mask is null");
  if (p.out == nullptr) return absl::InvalidArgumentError("verify attention: out is null");
  // The kernels move q / kv rows with 16-byte copies and out rows with bulk copies (16-byte
  // granules): rows are 1152 (FP8 kv: 656) / 1024 bytes, so the base pointers must be 16-byte
  // aligned.
  for (const auto& [name, ptr] :
       {std::pair<const char*, const void*>{"q", p.q}, {"kv", p.kv}, {"out", p.out}}) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("verify attention: ", name, " must be 16-byte aligned"));
    }
  }
  if (ws.device == nullptr || !detail::PlanFitsWorkspace(plan, ws)) {
    return absl::InvalidArgumentError("verify attention: workspace too small for the plan");
  }
  const detail::WorkspaceLayout l =
      detail::LayoutWorkspace(ws.max_work_items, ws.max_combine_items, ws.max_partial_rows,
                              ws.max_index_tasks, ws.max_index_entries, ws.max_staged_keys);
  auto* base = static_cast<unsigned char*>(ws.device);

  detail::VerifyKernelArgs a{};
  a.q = static_cast<const __nv_bfloat16*>(p.q);
  a.kv = static_cast<const __nv_bfloat16*>(p.kv);
  a.kv_indices = p.kv_indices;
  a.tree_mask = p.tree_mask;
  a.mask_words = p.mask_words;
  a.num_heads = p.num_heads;
  a.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  a.out = static_cast<__nv_bfloat16*>(p.out);
  a.lse = p.lse;
  a.part_o = reinterpret_cast<float*>(base + l.part_o);
  a.part_lse = reinterpret_cast<float*>(base + l.lse);
  a.pos_indices = reinterpret_cast<const int32_t*>(base + l.pos);
  const auto* work = reinterpret_cast<const VerifyWorkItem*>(base + l.work);
  const auto* tasks = reinterpret_cast<const VerifyIndexTask*>(base + l.tasks);
  const auto* combine = reinterpret_cast<const VerifyCombineItem*>(base + l.combine);

  // The variant and device the planner resolved (no device query, no table search a layer).
  if (plan.variant < 0 || plan.variant >= static_cast<int>(detail::kVariantTable.size())) {
    return absl::FailedPreconditionError(
        "verify attention: the plan names no kernel variant (make it with PlanVerifyAttention)");
  }
  const detail::VariantInfo* variant = &detail::kVariantTable[plan.variant];
  const int major = plan.device_cc_major, sms = plan.device_sms;
  if (variant->config != plan.config || variant->kv_fp8 != plan.kv_fp8 ||
      variant->rows != plan.rows_per_cta || variant->keys != plan.keys_per_tile ||
      !variant->runs_on(major)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "verify attention: the plan's variant ", plan.variant, " does not match its configuration ",
        static_cast<int>(plan.config), " on sm_", major, "x"));
  }
  // Staged plans: the batch's keys dequantized once into the workspace's bf16 rows, which the
  // bf16 kernel then reads through identity slot lists (same kv_indptr offsets).
  if (variant->staged) {
    detail::StageFp8Args st{};
    st.kv = static_cast<const uint8_t*>(p.kv);
    st.kv_indices = p.kv_indices;
    st.num_keys = plan.staged_keys;
    st.rows = reinterpret_cast<uint16_t*>(base + l.staged_rows);
    st.identity = reinterpret_cast<int32_t*>(base + l.staged_ids);
    VERIFYD_RETURN_IF_ERROR(detail::LaunchStageFp8Rows(st, p.stream));
    a.kv = reinterpret_cast<const __nv_bfloat16*>(st.rows);
    a.kv_indices = st.identity;
  }
  // One pass: its index lists (positional plans), the attention over a range of the work
  // list, then the combine of its splits.
  auto run_pass = [&](const VerifyPass& pass) -> absl::Status {
    if (pass.task_count > 0) {
      detail::PositionalIndexArgs pa{};
      pa.tasks = tasks + pass.task_begin;
      pa.kv_indices = p.kv_indices;
      pa.tree_mask = p.tree_mask;
      pa.mask_words = p.mask_words;
      pa.out = reinterpret_cast<int32_t*>(base + l.pos);
      VERIFYD_RETURN_IF_ERROR(detail::LaunchPositionalIndices(pa, pass.task_count, p.stream));
    }
    a.work = work + pass.work_begin;
    VERIFYD_RETURN_IF_ERROR(detail::DispatchVariant(
        variant->index, [&](auto v) { return decltype(v)::Launch(a, pass.work_count, p.stream); }));
    if (pass.combine_count == 0) return absl::OkStatus();
    detail::VerifyCombineArgs c{};
    c.items = combine + pass.combine_begin;
    c.part_o = a.part_o;
    c.part_lse = a.part_lse;
    c.out = a.out;
    c.lse = p.lse;
    c.rows_per_cta = plan.rows_per_cta;
    // Positional plans merge by the left fold (whatever the batch), the others in the layout
    // that suits the number of rows.
    return detail::LaunchCombine(c, pass.combine_count, sms, /*dependent_launch=*/major >= 9,
                                 p.stream, /*fold=*/plan.positional);
  };
  if (plan.passes.empty()) {
    return run_pass({0, static_cast<int32_t>(plan.work.size()), 0,
                     static_cast<int32_t>(plan.combine.size()), 0,
                     static_cast<int32_t>(plan.index_tasks.size())});
  }
  for (const VerifyPass& pass : plan.passes) VERIFYD_RETURN_IF_ERROR(run_pass(pass));
  return absl::OkStatus();
}

}  // namespace verifyd::kernels::cuda
