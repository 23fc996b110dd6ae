// Host-side checks of the CUDA verify attention launcher (kernels/cuda/verify_attention/
// launch.cu) that run before any CUDA call, so they need the CUDA runtime library but no GPU
// (label cpu: CI runs them on machines without a device).
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/verify_attention/api.h"

namespace verifyd::kernels::cuda {
namespace {

// One request of 4 rows over 1000 keys with 8 heads, planned for a 132-SM device against a
// workspace that gives capacity only.
class VerifyAttentionLaunch : public ::testing::Test {
 protected:
  VerifyAttentionLaunch() {
    ws.max_work_items = 1024;
    ws.max_combine_items = 1024;
    ws.max_partial_rows = 65536;
    p.batch = 1;
    p.total_rows = 4;
    p.num_heads = 8;
  }
  absl::StatusOr<VerifyAttentionPlan> Plan(const VerifyAttentionParams& params) const {
    return PlanVerifyAttention(params, qi.data(), ki.data(), dev, ws);
  }

  const VerifyAttentionDeviceInfo dev{132, 9, 0, 232448, 233472};
  VerifyAttentionWorkspace ws;
  const std::vector<int32_t> qi = {0, 4}, ki = {0, 1000};
  VerifyAttentionParams p;
};

// Unaligned q / kv / out are refused before anything is launched (the kernels move rows with
// 16-byte and bulk copies), naming the field. The fake device pointers are never touched.
TEST_F(VerifyAttentionLaunch, RejectsUnalignedPointers) {
  p.kv_slots = 1000;
  auto plan = Plan(p);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->work.empty());
  alignas(16) static unsigned char fake[64];
  const std::vector<int32_t> slots(1000, 0);
  const std::vector<uint64_t> mask(8, ~0ull);
  p.kv_indices = slots.data();
  p.tree_mask = mask.data();
  for (const std::string field : {"q", "kv", "out"}) {
    p.q = fake;
    p.kv = fake;
    p.out = fake;
    if (field == "q") p.q = fake + 2;
    if (field == "kv") p.kv = fake + 8;
    if (field == "out") p.out = fake + 4;
    const absl::Status s = VerifyAttentionCuda(p, *plan, ws);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << ": " << s;
    EXPECT_NE(s.message().find(field + " must be 16-byte aligned"), std::string::npos) << s;
  }
}

// A plan for another batch shape or cache format, and unsupported params, are refused without
// a launch.
TEST_F(VerifyAttentionLaunch, RejectsMismatchedPlan) {
  auto plan = Plan(p);
  ASSERT_TRUE(plan.ok()) << plan.status();
  VerifyAttentionParams other = p;
  other.num_heads = 16;
  EXPECT_EQ(VerifyAttentionCuda(other, *plan, ws).code(), absl::StatusCode::kInvalidArgument);
  other = p;
  other.dtype = DType::kFloat32;
  EXPECT_EQ(VerifyAttentionCuda(other, *plan, ws).code(), absl::StatusCode::kUnimplemented);
  // A plan for the bf16 cache run on FP8 rows (and the other way round), naming the format.
  other = p;
  other.kv_fp8 = true;
  absl::Status s = VerifyAttentionCuda(other, *plan, ws);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bf16 latent cache"), std::string::npos) << s;
  auto fp8_plan = Plan(other);
  ASSERT_TRUE(fp8_plan.ok()) << fp8_plan.status();
  EXPECT_TRUE(fp8_plan->kv_fp8);
  s = VerifyAttentionCuda(p, *fp8_plan, ws);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("FP8 latent cache"), std::string::npos) << s;
}

}  // namespace
}  // namespace verifyd::kernels::cuda
