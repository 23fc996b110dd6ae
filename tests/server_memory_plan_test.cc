// `verifyd --print_memory_plan` through the binary: the per-GPU plan of a real-size preset and of
// a checkpoint directory's config.json (no weights read), exit 0 when it fits and 2 with the
// ResourceExhausted message when --kv_slots does not, bad --device_memory_gb / --model exit 2.
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/process_util.h"
#include "tp/memory_plan.h"
#include "tp/model_config.h"
#include "tp/presets.h"

namespace {

using ::testing::HasSubstr;

// Runs verifyd with `args`; (exit code, stdout + stderr).
std::pair<int, std::string> RunVerifyd(std::vector<std::string> args, const std::string& name) {
  const std::string log = verifyd::test::TempPath("verifyd_memory_plan_test", name + ".log");
  std::filesystem::remove(log);
  args.insert(args.begin(), VERIFYD_BINARY);
  const int code = verifyd::test::WaitExit(verifyd::test::Spawn(args, log), absl::Seconds(60));
  return {code, verifyd::test::ReadFile(log)};
}

TEST(VerifydMemoryPlan, KimiK2AtTp8PrintsThePlanAndExitsZero) {
  // The listen flags point at a port nothing may bind: the plan must not open listeners.
  // 16 requests a step (the plan's default device: an H200's 150.11 GB).
  auto [code, out] = RunVerifyd({"--print_memory_plan", "--model=kimi-k2", "--tp=8",
                                 "--max_batch=16", "--kv_slots=65536", "--listen=256.0.0.1:1"},
                                "kimi");
  EXPECT_EQ(code, 0) << out;
  for (const char* part :
       {"kimi-k2, rank 0 of tp 8", "embedding", "attention", "dense_mlp", "routed_experts",
        "48 a layer", "shared_experts", "router", "norms", "lm_head", "verify_attention_workspace",
        "total weights", "kv bytes a token", "70272 bytes", "fits"}) {
    EXPECT_THAT(out, HasSubstr(part)) << out;
  }
  // The total printed is the library's plan of the same options.
  verifyd::tp::MemoryPlanOptions o;
  o.tp = 8;
  o.max_batch = 16;
  o.kv_slots = 65536;
  absl::StatusOr<verifyd::tp::MemoryPlan> plan =
      verifyd::tp::PlanRankMemory(*verifyd::tp::PresetConfig("kimi-k2"), o);
  ASSERT_TRUE(plan.ok());
  EXPECT_THAT(out, HasSubstr(verifyd::tp::FormatMemoryPlan(*plan)));
  // The server's defaults (64 requests a step, 65,536 KV slots) fit an H200 (150.11 GB as
  // cudaMemGetInfo reports it), not a 141 GB device.
  auto [code64, out64] = RunVerifyd({"--print_memory_plan", "--model=kimi-k2", "--tp=8"}, "k64");
  EXPECT_EQ(code64, 0) << out64;
  EXPECT_THAT(out64, HasSubstr("device 150.1 GB"));
  auto [code141, out141] = RunVerifyd(
      {"--print_memory_plan", "--model=kimi-k2", "--tp=8", "--device_memory_gb=141"}, "k141");
  EXPECT_EQ(code141, 2) << out141;
  EXPECT_THAT(out141,
              HasSubstr("verifyd: memory plan for kimi-k2 at tp 8 (rank 0): weights 130.2 GB"));
}

TEST(VerifydMemoryPlan, KvThatDoesNotFitExitsTwoWithTheError) {
  auto [code, out] = RunVerifyd({"--print_memory_plan", "--model=deepseek-v3", "--tp=8",
                                 "--kv_slots=2000000000", "--device_memory_gb=141"},
                                "too_big");
  EXPECT_EQ(code, 2) << out;
  EXPECT_THAT(out, HasSubstr("verifyd: memory plan for deepseek-v3 at tp 8"));
  EXPECT_THAT(out, HasSubstr("exceed the device's 141.0 GB"));
  // FP8 KV: 656 bytes a layer.
  auto [fp8_code, fp8_out] = RunVerifyd(
      {"--print_memory_plan", "--model=deepseek-v3", "--tp=8", "--kv_dtype=fp8", "--kv_slots=1"},
      "fp8");
  EXPECT_EQ(fp8_code, 0) << fp8_out;
  EXPECT_THAT(fp8_out, HasSubstr("40016 bytes (61 layers x 656)"));
}

TEST(VerifydMemoryPlan, ReadsOnlyTheCheckpointConfig) {
  // A directory with a config.json and no weights at all: the plan needs nothing else.
  const std::string dir = verifyd::test::TempPath("verifyd_memory_plan_test", "ckpt");
  std::filesystem::create_directories(dir);
  verifyd::tp::ModelConfig c = *verifyd::tp::PresetConfig("deepseek-v3");
  std::ofstream(dir + "/config.json") << verifyd::tp::ModelConfigToJson(c);
  auto [code, out] =
      RunVerifyd({"--print_memory_plan", "--model=" + dir, "--tp=8", "--kv_slots=1"}, "ckpt");
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("rank 0 of tp 8, 16 heads"));
  EXPECT_THAT(out, HasSubstr("32 a layer"));
}

TEST(VerifydMemoryPlan, BadInputExitsTwo) {
  auto [code, out] = RunVerifyd(
      {"--print_memory_plan", "--model=kimi-k2", "--tp=8", "--device_memory_gb=0"}, "bad_mem");
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("--device_memory_gb"));
  auto [code2, out2] =
      RunVerifyd({"--print_memory_plan", "--model=/no/such/dir", "--tp=8"}, "bad_model");
  EXPECT_EQ(code2, 2);
  EXPECT_THAT(out2, HasSubstr("--model: model '/no/such/dir' is neither a preset"));
  auto [code3, out3] = RunVerifyd({"--print_memory_plan", "--model=kimi-k2", "--tp=3"}, "bad_tp");
  EXPECT_EQ(code3, 2);
  EXPECT_THAT(out3, HasSubstr("num_attention_heads"));
}

}  // namespace
