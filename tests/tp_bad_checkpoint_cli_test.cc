// verifyd --model DIR with a bad checkpoint (a truncated file, a missing tensor) exits non-zero
// before serving, with a message naming the file and the tensor; a good one logs the files and
// mapped bytes of the checkpoint it opened.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/process_util.h"
#include "tests/temp_dir_util.h"
#include "tp/presets.h"
#include "tp/safetensors.h"
#include "tp/weights.h"

#ifndef VERIFYD_BINARY
#error "VERIFYD_BINARY must name the verifyd executable"
#endif

namespace verifyd::tp {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempDir(const std::string& tag) { return test_util::MakeTempDir("verifyd_cli_", tag); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs verifyd on `model` (cpu backend) until it exits (or 60 s); returns (exit code, log).
std::pair<int, std::string> RunVerifyd(const std::string& model, const std::string& log) {
  const pid_t pid =
      test::Spawn({VERIFYD_BINARY, "--backend=cpu", "--model=" + model, "--tp=2", "--kv_slots=64",
                   absl::StrCat("--listen=127.0.0.1:", test::FreePort()), "--metrics_listen="},
                  log);
  EXPECT_GT(pid, 0);
  const int code = test::WaitExit(pid, absl::Seconds(60));
  return {code, ReadFile(log)};
}

TEST(VerifydBadCheckpoint, FailsBeforeServingNamingFileAndTensor) {
  const std::string root = TempDir("bad");
  const std::string dir = root + "/tiny-ckpt";
  ASSERT_TRUE(WritePresetToDirectory("tiny", 3, dir).ok());
  const std::string file = dir + "/model.safetensors";

  // Truncated: the last tensor of the file does not fit any more.
  fs::resize_file(file, fs::file_size(file) - 64);
  auto [code, out] = RunVerifyd(dir, root + "/truncated.log");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(code, -1) << "verifyd did not exit: " << out;
  EXPECT_THAT(out, AllOf(HasSubstr(file), HasSubstr("truncated"), HasSubstr("tensor '")));

  // A missing tensor.
  const std::string victim = "model.layers.0.self_attn.kv_b_proj.weight";
  TensorMap tensors = MakePresetWeights("tiny", 3)->tensors;
  tensors.erase(victim);
  fs::remove(file);
  ASSERT_TRUE(WriteSafetensorsDirectory(dir, tensors, SafetensorsDType::kBF16).ok());
  std::tie(code, out) = RunVerifyd(dir, root + "/missing.log");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(code, -1) << "verifyd did not exit: " << out;
  EXPECT_THAT(out, AllOf(HasSubstr("--model"), HasSubstr("'" + victim + "'"), HasSubstr(dir)));
  fs::remove_all(root);
}

}  // namespace
}  // namespace verifyd::tp
