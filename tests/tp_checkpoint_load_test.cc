// Loading checkpoints into the CPU engine through the streaming reader: the heap a TP 4 load
// of a ~20 MB bf16 checkpoint costs (counted through operator new) against the whole-file path
// (LoadModelFromDirectory + EngineOptions::weights), the same logits whichever way the weights
// come in (directory, explicit source, host weights), and bad checkpoints (truncated file,
// missing tensor, non-finite value) failing CpuEngine::Create with messages naming the file
// and the tensor.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/heap_counter.h"
#include "tests/model_dims_util.h"
#include "tests/temp_dir_util.h"
#include "tp/checkpoint_reader.h"
#include "tp/cpu/cpu_engine.h"
#include "tp/presets.h"
#include "tp/sharding.h"
#include "tp/weight_source.h"
#include "tp/weights.h"

namespace verifyd::tp {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr double kMiB = 1024.0 * 1024.0;

std::string TempDir(const std::string& tag) { return test_util::MakeTempDir("verifyd_load_", tag); }

// Heap in use now, and the high-water mark since the last reset.
struct HeapMark {
  int64_t start = 0;
  HeapMark() {
    start = g_heap_now.load();
    g_heap_peak.store(start);
  }
  int64_t peak_growth() const { return g_heap_peak.load() - start; }
  int64_t growth() const { return g_heap_now.load() - start; }
};

// A dense model of ~9.6M parameters: ~19 MB in bf16, ~38 MB in float32. Small vocabulary so
// the replicated tensors (embeddings, q_a, kv_a, norms) are a small part of it.
ModelConfig MediumConfig() {
  ModelConfig c = *PresetConfig("tiny");
  c.name = "medium";
  c.tie_word_embeddings = false;
  // vocab 512, hidden 512, 4 layers, 8 heads, q_lora 192, kv_lora 128, nope 64, rope 32, v 64,
  // intermediate 1024.
  return test_util::WithDims(c, {512, 512, 4, 8, 192, 128, 64, 32, 64, 1024});
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Float32 bytes of the model, and of its tensors every rank keeps whole.
struct ModelBytes {
  int64_t total = 0;
  int64_t replicated = 0;
};
ModelBytes BytesOf(const ModelConfig& c) {
  ModelBytes b;
  for (const TensorSpec& s : ModelTensorSpecs(c)) {
    const int64_t bytes = Numel(s.shape) * 4;
    b.total += bytes;
    const bool sharded = s.name.find("q_b_proj") != std::string::npos ||
                         s.name.find("q_proj") != std::string::npos ||
                         s.name.find("kv_b_proj") != std::string::npos ||
                         s.name.find("o_proj") != std::string::npos ||
                         s.name.find("mlp.") != std::string::npos || s.name == "lm_head.weight";
    if (!sharded) b.replicated += bytes;
  }
  return b;
}

// Writes a model as a bf16 checkpoint in two shards; the host weights are gone at return.
std::string WriteCheckpoint(const ModelConfig& c, const std::string& tag) {
  const std::string dir = TempDir(tag) + "/" + c.name;
  absl::StatusOr<ModelWeights> w = GenerateRandomWeights(c, 11);
  EXPECT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(
      WriteModelToDirectory(*w, dir, SafetensorsDType::kBF16, /*max_shard_bytes=*/12 << 20).ok());
  return dir;
}

int64_t DirBytes(const std::string& dir) {
  int64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") n += static_cast<int64_t>(e.file_size());
  }
  return n;
}

EngineOptions Options(int tp) {
  EngineOptions o;
  o.tp = tp;
  o.kv_slots = 32;
  return o;
}

StepRequest Prefill() {
  StepRequest q;
  q.tokens = {1, 100, 200, 300, 17, 511};
  q.parents = {-1, 0, 1, 2, 3, 4};
  q.tail_slots = {5, 6, 7, 8, 9, 10};
  q.accept = false;
  return q;
}

std::vector<float> Logits(CpuEngine& e) {
  std::vector<float> logits;
  absl::StatusOr<std::vector<StepResult>> r = e.StepWithLogits({Prefill()}, &logits);
  EXPECT_TRUE(r.ok()) << r.status();
  return logits;
}

// The TP 4 load of a ~19 MB bf16 checkpoint: streamed, the heap peak is what the engine keeps
// (every rank's float32 shard + KV pools) plus a little scratch; the whole-file path also holds
// the whole model in float32 while sharding it.
TEST(CheckpointLoad, Tp4LoadHeapStaysWithinTheShards) {
  const ModelConfig c = MediumConfig();
  const std::string dir = WriteCheckpoint(c, "heap");
  const ModelBytes mb = BytesOf(c);
  constexpr int kTp = 4;
  // What the engine keeps: the sharded tensors once, the replicated ones per rank (float32), the
  // KV pools (float32, every rank, every layer).
  const int64_t shards = (mb.total - mb.replicated) + kTp * mb.replicated;
  const int64_t kv = int64_t{kTp} * c.num_hidden_layers * 32 * c.latent_dim() * 4;

  int64_t streamed_peak = 0, streamed_kept = 0;
  {
    HeapMark mark;
    absl::StatusOr<std::unique_ptr<CpuEngine>> e = [&] {
      EngineOptions o = Options(kTp);
      o.model = dir;
      return CpuEngine::Create(o);
    }();
    ASSERT_TRUE(e.ok()) << e.status();
    streamed_peak = mark.peak_growth();
    streamed_kept = mark.growth();
  }
  int64_t whole_peak = 0;
  {
    HeapMark mark;
    absl::StatusOr<ModelWeights> w = LoadModelFromDirectory(dir);
    ASSERT_TRUE(w.ok()) << w.status();
    EngineOptions o = Options(kTp);
    o.weights = std::make_shared<const ModelWeights>(*std::move(w));
    absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status();
    whole_peak = mark.peak_growth();
  }
  std::printf(
      "checkpoint: %.1f MiB bf16 on disk, %.1f MiB as float32 (%.1f MiB replicated per rank)\n"
      "TP %d, engine keeps %.1f MiB of shards + %.2f MiB of KV pool\n"
      "streamed load:   heap peak +%.1f MiB, kept +%.1f MiB (transient %.2f MiB)\n"
      "whole-file load: heap peak +%.1f MiB\n",
      DirBytes(dir) / kMiB, mb.total / kMiB, mb.replicated / kMiB, kTp, shards / kMiB, kv / kMiB,
      streamed_peak / kMiB, streamed_kept / kMiB, (streamed_peak - streamed_kept) / kMiB,
      whole_peak / kMiB);
  // Streamed: nothing beyond what the engine keeps but a little scratch (no whole tensor,
  // let alone the model, is ever materialised): transient < 1/16 of the float32 model.
  EXPECT_GE(streamed_kept, shards + kv);
  EXPECT_LT(streamed_peak - streamed_kept, mb.total / 16);
  EXPECT_LT(streamed_peak, shards + kv + mb.total / 16);
  // The whole-file path holds the float32 model on top of the shards.
  EXPECT_GT(whole_peak, streamed_peak + mb.total * 9 / 10);
  fs::remove_all(fs::path(dir).parent_path());
}

// The tiny preset (seed 5) written to `dir` in shards of at most 200 kB, opened as a source.
absl::StatusOr<std::unique_ptr<CheckpointWeightSource>> WriteAndOpenTiny(const std::string& dir) {
  const absl::Status written = WritePresetToDirectory("tiny", 5, dir, /*max_shard_bytes=*/200000);
  if (!written.ok()) return written;
  return CheckpointWeightSource::Open(dir);
}

// The same logits (bit for bit) whether the weights come from the directory, from one source
// shared by several engines, or from host weights loaded whole; at TP 1 and 2.
TEST(CheckpointLoad, DirectorySourceAndHostWeightsGiveIdenticalLogits) {
  const std::string dir = TempDir("same") + "/tiny-ckpt";
  absl::StatusOr<std::unique_ptr<CheckpointWeightSource>> opened = WriteAndOpenTiny(dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::shared_ptr<const WeightSource> source = *std::move(opened);
  absl::StatusOr<ModelWeights> whole = LoadModelFromDirectory(dir);
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto weights = std::make_shared<const ModelWeights>(*std::move(whole));
  for (int tp : {1, 2}) {
    std::vector<float> want;  // TP 2 sums in another order than TP 1: compared per TP
    EngineOptions by_dir = Options(tp);
    by_dir.model = dir;
    EngineOptions by_source = Options(tp);
    by_source.source = source;
    by_source.model = "/nonexistent";  // the source comes first
    EngineOptions by_weights = Options(tp);
    by_weights.weights = weights;
    for (const EngineOptions* o : {&by_dir, &by_source, &by_weights}) {
      absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(*o);
      ASSERT_TRUE(e.ok()) << e.status();
      EXPECT_EQ((*e)->config().name, "tiny-ckpt");
      const std::vector<float> got = Logits(**e);
      if (want.empty()) want = got;
      ASSERT_EQ(got, want) << "tp " << tp;
    }
  }
  fs::remove_all(fs::path(dir).parent_path());
}

// Load progress: a TP 2 engine loading a 4-shard checkpoint through the source reports every
// shard done, in order, with the bytes of the model's tensors, ending at all of them.
TEST(CheckpointLoad, ProgressReportsEveryShardAndEveryModelByte) {
  const std::string dir = TempDir("progress") + "/tiny-ckpt";
  absl::StatusOr<std::unique_ptr<CheckpointWeightSource>> opened = WriteAndOpenTiny(dir);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::vector<LoadProgress> reports;
  (*opened)->SetProgressCallback([&](const LoadProgress& p) { reports.push_back(p); });
  const LoadProgress before = (*opened)->progress();
  EXPECT_EQ(before.files_total, (*opened)->num_files());
  EXPECT_GE(before.files_total, 2);
  EXPECT_EQ(before.bytes_read, 0u);
  uint64_t model_bytes = 0;
  for (const TensorSpec& spec : ModelTensorSpecs((*opened)->config())) {
    model_bytes += static_cast<uint64_t>(Numel(spec.shape)) * 2;  // bf16
  }
  EXPECT_EQ(before.bytes_total, model_bytes);
  std::shared_ptr<const WeightSource> source = *std::move(opened);
  EngineOptions o = Options(2);
  o.source = source;
  absl::StatusOr<std::unique_ptr<CpuEngine>> e = CpuEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_GE(reports.size(), static_cast<size_t>(before.files_total - before.files_done));
  for (size_t i = 1; i < reports.size(); ++i) {
    EXPECT_GE(reports[i].files_done, reports[i - 1].files_done);
    EXPECT_GT(reports[i].bytes_read, reports[i - 1].bytes_read);
  }
  const LoadProgress& last = reports.back();
  EXPECT_EQ(last.files_done, last.files_total);
  EXPECT_EQ(last.bytes_read, model_bytes);
  EXPECT_GE(last.elapsed_s, 0.0);
  fs::remove_all(fs::path(dir).parent_path());
}

// The tensor whose data ends last in a safetensors file (the one a truncation cuts).
std::string LastTensor(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  const nlohmann::json h = nlohmann::json::parse(header);
  std::string last;
  uint64_t end = 0;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const uint64_t e = it.value()["data_offsets"][1].get<uint64_t>();
    if (e >= end) end = e, last = it.key();
  }
  return last;
}

absl::Status CreateStatus(const std::string& dir, int tp = 2) {
  EngineOptions o = Options(tp);
  o.model = dir;
  return CpuEngine::Create(o).status();
}

TEST(CheckpointLoad, BadCheckpointsFailCreateNamingFileAndTensor) {
  const std::string dir = TempDir("bad") + "/tiny-ckpt";
  ASSERT_TRUE(WritePresetToDirectory("tiny", 5, dir).ok());
  const std::string file = dir + "/model.safetensors";
  const std::string last = LastTensor(file);
  ASSERT_FALSE(last.empty());
  ASSERT_TRUE(CreateStatus(dir).ok());

  // Truncated by 100 bytes: DataLoss naming the file and the tensor that no longer fits.
  const auto size = fs::file_size(file);
  fs::resize_file(file, size - 100);
  absl::Status s = CreateStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr(file), HasSubstr("truncated"), HasSubstr(last))) << s;

  // A tensor missing: NotFound naming it and the directory.
  const std::string victim = "model.layers.1.self_attn.o_proj.weight";
  ModelWeights w = *MakePresetWeights("tiny", 5);
  TensorMap without = w.tensors;
  without.erase(victim);
  fs::remove(file);
  ASSERT_TRUE(WriteSafetensorsDirectory(dir, without, SafetensorsDType::kBF16).ok());
  s = CreateStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr(dir), HasSubstr("'" + victim + "'"))) << s;

  // A non-finite value (read only when the rank that owns it loads its slice): InvalidArgument
  // naming the file, the tensor and the element.
  TensorMap nan = w.tensors;
  const std::string bad = "model.layers.0.mlp.down_proj.weight";
  HostTensor& t = nan[bad];
  t.data[3 * t.shape[1] + t.shape[1] - 1] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(WriteSafetensorsDirectory(dir, nan, SafetensorsDType::kF32).ok());
  s = CreateStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr(file), HasSubstr("'" + bad + "'"), HasSubstr("not finite")))
      << s;
  fs::remove_all(fs::path(dir).parent_path());
}

}  // namespace
}  // namespace verifyd::tp
