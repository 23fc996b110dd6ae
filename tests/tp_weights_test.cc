// Preset weights (deterministic, counter-based, bf16-exact) and checkpoint I/O (safetensors
// write -> read, sharded directories, F16, errors naming the tensor, preset on disk gives the
// same logits).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "gtest/gtest.h"
#include "kernels/common.h"
#include "kernels/weight_init.h"
#include "tests/temp_dir_util.h"
#include "tp/cpu/cpu_engine.h"
#include "tp/presets.h"
#include "tp/safetensors.h"
#include "tp/weights.h"

namespace verifyd::tp {
namespace {

namespace fs = std::filesystem;
using kernels::WeightNameHash;
using kernels::WeightTensorKey;
using kernels::WeightUniform;
using kernels::WeightValue;

std::string TempDir(const std::string& tag) { return test_util::MakeTempDir("verifyd_tp_", tag); }

TEST(WeightInit, UniformInRangeAndCounterBased) {
  const uint64_t key = WeightTensorKey(5, WeightNameHash("x"));
  double sum = 0, sum2 = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    const float u = WeightUniform(key, i);
    ASSERT_GE(u, -1.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    sum2 += double{u} * u;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sum2 / n, 1.0 / 3.0, 0.01);  // variance of U[-1, 1)
  // Counter-based: element i is the same whatever order or subset is evaluated.
  std::mt19937_64 rng(3);
  for (int t = 0; t < 100; ++t) {
    const uint64_t i = rng() % 1000000;
    EXPECT_EQ(WeightValue(key, i, 0.5f, 0.0f), WeightValue(key, i, 0.5f, 0.0f));
    EXPECT_EQ(WeightValue(key, i, 0.5f, 0.0f), kernels::RoundToBf16(0.5f * WeightUniform(key, i)));
    // Two roundings (multiply, then add), never one fused multiply-add: the device code
    // (kernels/cuda/dense/weight_gen.cu) computes __fadd_rn(offset, __fmul_rn(scale, u)).
    volatile float prod = 0.1f * WeightUniform(key, i);
    EXPECT_EQ(WeightValue(key, i, 0.1f, 1.0f), kernels::RoundToBf16(1.0f + prod));
  }
  EXPECT_NE(WeightTensorKey(5, WeightNameHash("x")), WeightTensorKey(6, WeightNameHash("x")));
  EXPECT_NE(WeightNameHash("model.layers.0.mlp.up_proj.weight"),
            WeightNameHash("model.layers.0.mlp.gate_proj.weight"));
}

TEST(Presets, DeterministicBf16ExactAndSeeded) {
  ModelWeights a = *MakePresetWeights("tiny", 42);
  ModelWeights b = *MakePresetWeights("tiny", 42);
  ModelWeights c = *MakePresetWeights("tiny", 43);
  ASSERT_TRUE(ValidateModelWeights(a).ok());
  const std::vector<TensorSpec> specs = ModelTensorSpecs(a.config);
  ASSERT_EQ(a.tensors.size(), specs.size());
  for (const TensorSpec& spec : specs) {
    const HostTensor& ta = *a.Find(spec.name);
    const HostTensor& tb = *b.Find(spec.name);
    const HostTensor& tc = *c.Find(spec.name);
    ASSERT_EQ(ta.data, tb.data) << spec.name;
    ASSERT_NE(ta.data, tc.data) << spec.name;
    const uint64_t key = WeightTensorKey(42, WeightNameHash(spec.name));
    for (size_t i = 0; i < ta.data.size(); ++i) {
      const float x = ta.data[i];
      ASSERT_EQ(x, kernels::RoundToBf16(x)) << spec.name << "[" << i << "] not bf16-exact";
      // Within [offset - scale, offset + scale] after bf16 rounding (monotone).
      ASSERT_GE(x, kernels::RoundToBf16(spec.init_offset - spec.init_scale)) << spec.name;
      ASSERT_LE(x, kernels::RoundToBf16(spec.init_offset + spec.init_scale)) << spec.name;
      if (i % 97 == 0) ASSERT_EQ(x, WeightValue(key, i, spec.init_scale, spec.init_offset));
    }
  }
  // Tensors differ from each other (the name enters the key).
  EXPECT_NE(a.Find("model.layers.0.mlp.up_proj.weight")->data,
            a.Find("model.layers.0.mlp.gate_proj.weight")->data);
}

TEST(Safetensors, F32AndBf16RoundTripAndShards) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-3, 3);
  TensorMap m;
  for (int t = 0; t < 5; ++t) {
    HostTensor x;
    x.shape = {static_cast<int64_t>(1 + rng() % 7), static_cast<int64_t>(1 + rng() % 9)};
    x.data.resize(x.numel());
    for (float& v : x.data) v = u(rng);
    m["t" + std::to_string(t)] = x;
  }
  HostTensor scalar_vec;
  scalar_vec.shape = {3};
  scalar_vec.data = {1.5f, -2.25f, 7.0f};
  m["vec"] = scalar_vec;
  const std::string dir = TempDir("st");
  ASSERT_TRUE(WriteSafetensorsFile(dir + "/a.safetensors", m, SafetensorsDType::kF32).ok());
  absl::StatusOr<TensorMap> back = ReadSafetensorsFile(dir + "/a.safetensors");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), m.size());
  for (const auto& [name, t] : m) {
    EXPECT_EQ(back->at(name).shape, t.shape) << name;
    EXPECT_EQ(back->at(name).data, t.data) << name;
  }
  // BF16, sharded with an index: values come back rounded to bf16.
  const std::string sdir = dir + "/sharded";
  ASSERT_TRUE(WriteSafetensorsDirectory(sdir, m, SafetensorsDType::kBF16, 64).ok());
  EXPECT_TRUE(fs::exists(sdir + "/model.safetensors.index.json"));
  int files = 0;
  for (const auto& e : fs::directory_iterator(sdir))
    files += e.path().extension() == ".safetensors";
  EXPECT_GT(files, 1);
  absl::StatusOr<TensorMap> sb = ReadSafetensorsDirectory(sdir);
  ASSERT_TRUE(sb.ok()) << sb.status();
  ASSERT_EQ(sb->size(), m.size());
  for (const auto& [name, t] : m) {
    for (size_t i = 0; i < t.data.size(); ++i) {
      ASSERT_EQ(sb->at(name).data[i], kernels::RoundToBf16(t.data[i])) << name;
    }
  }
  // Without the index, every *.safetensors file of the directory is read.
  fs::remove(sdir + "/model.safetensors.index.json");
  absl::StatusOr<TensorMap> sc = ReadSafetensorsDirectory(sdir);
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_EQ(sc->size(), m.size());
  fs::remove_all(dir);
}

// Hand-built file with F16 data (the writer does not produce F16).
TEST(Safetensors, ReadsF16) {
  const std::vector<float> vals = {
      0.0f, 1.0f, -2.5f, 65504.0f, 5.9604645e-08f /*min subnormal*/, 0.333251953125f};
  std::vector<uint16_t> half = {0x0000, 0x3c00, 0xc100, 0x7bff, 0x0001, 0x3555};
  nlohmann::json h;
  h["x"] = {{"dtype", "F16"}, {"shape", {2, 3}}, {"data_offsets", {0, 12}}};
  const std::string hs = h.dump();
  const std::string dir = TempDir("f16");
  {
    std::ofstream out(dir + "/m.safetensors", std::ios::binary);
    uint64_t n = hs.size();
    out.write(reinterpret_cast<const char*>(&n), 8);  // little-endian host
    out.write(hs.data(), hs.size());
    out.write(reinterpret_cast<const char*>(half.data()), 12);
  }
  absl::StatusOr<TensorMap> m = ReadSafetensorsFile(dir + "/m.safetensors");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->at("x").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(m->at("x").data, vals);
  fs::remove_all(dir);
}

TEST(Safetensors, CorruptFilesAreErrors) {
  const std::string dir = TempDir("bad");
  {
    std::ofstream out(dir + "/short.safetensors", std::ios::binary);
    out << "abc";
  }
  EXPECT_FALSE(ReadSafetensorsFile(dir + "/short.safetensors").ok());
  nlohmann::json h;
  h["w"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 12}}};  // 4 floats need 16
  const std::string hs = h.dump();
  {
    std::ofstream out(dir + "/mis.safetensors", std::ios::binary);
    uint64_t n = hs.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(hs.data(), hs.size());
    out.write("0123456789ab", 12);
  }
  absl::StatusOr<TensorMap> m = ReadSafetensorsFile(dir + "/mis.safetensors");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("'w'"), std::string::npos) << m.status();
  EXPECT_EQ(ReadSafetensorsFile(dir + "/none.safetensors").status().code(),
            absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

TEST(Checkpoint, MissingOrMisshapedTensorIsNamed) {
  const std::string dir = TempDir("ckpt_bad");
  ModelWeights w = *MakePresetWeights("tiny", 3, 1);
  const std::string victim = "model.layers.0.self_attn.kv_b_proj.weight";
  ASSERT_TRUE(WriteModelToDirectory(w, dir).ok());
  // Drop one tensor.
  TensorMap without = w.tensors;
  without.erase(victim);
  fs::remove(dir + "/model.safetensors");
  ASSERT_TRUE(WriteSafetensorsDirectory(dir, without, SafetensorsDType::kBF16).ok());
  absl::StatusOr<ModelWeights> l = LoadModelFromDirectory(dir);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(l.status().message().find(victim), std::string::npos) << l.status();
  // Wrong shape.
  TensorMap bad = w.tensors;
  bad[victim].shape = {bad[victim].shape[1], bad[victim].shape[0]};
  ASSERT_TRUE(WriteSafetensorsDirectory(dir, bad, SafetensorsDType::kBF16).ok());
  l = LoadModelFromDirectory(dir);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find(victim), std::string::npos) << l.status();
  fs::remove_all(dir);
}

TEST(Checkpoint, PresetWrittenAndLoadedGivesIdenticalWeightsAndLogits) {
  const std::string dir = TempDir("ckpt") + "/tiny-ckpt";
  ASSERT_TRUE(WritePresetToDirectory("tiny", 9, dir, /*max_shard_bytes=*/200000).ok());
  absl::StatusOr<ModelWeights> loaded = LoadModelFromDirectory(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.name, "tiny-ckpt");
  ModelWeights gen = *MakePresetWeights("tiny", 9);
  for (const TensorSpec& spec : ModelTensorSpecs(gen.config)) {
    ASSERT_EQ(loaded->Find(spec.name)->data, gen.Find(spec.name)->data) << spec.name;
  }
  // Same logits through the engine: preset by name vs checkpoint directory.
  EngineOptions a;
  a.model = "tiny";
  a.seed = 9;
  a.kv_slots = 64;
  EngineOptions b = a;
  b.model = dir;
  auto ea = CpuEngine::Create(a);
  auto eb = CpuEngine::Create(b);
  ASSERT_TRUE(ea.ok()) << ea.status();
  ASSERT_TRUE(eb.ok()) << eb.status();
  StepRequest q;
  q.tokens = {1, 100, 200, 300, 17, 511};
  q.parents = {-1, 0, 1, 2, 3, 4};
  q.tail_slots = {5, 6, 7, 8, 9, 10};
  q.accept = false;
  std::vector<float> la, lb;
  ASSERT_TRUE((*ea)->StepWithLogits({q}, &la).ok());
  ASSERT_TRUE((*eb)->StepWithLogits({q}, &lb).ok());
  ASSERT_EQ(la.size(), q.tokens.size() * 512);
  EXPECT_EQ(la, lb);
  fs::remove_all(fs::path(dir).parent_path());
}

TEST(Checkpoint, BadModelNameIsAnError) {
  EngineOptions o;
  o.model = "/nonexistent/verifyd/model";
  auto e = CpuEngine::Create(o);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("model"), std::string::npos);
}

TEST(Checkpoint, MoeTensorNamesAndRoundTrip) {
  const ModelConfig c = *PresetConfig("tiny-moe");
  const std::vector<TensorSpec> specs = ModelTensorSpecs(c);
  std::map<std::string, std::vector<int64_t>> shape;
  for (const TensorSpec& s : specs) shape[s.name] = s.shape;
  // Layer 0 dense, layers 1-2 MoE (16 experts, moe_intermediate 64, 1 shared expert).
  EXPECT_EQ(shape["model.layers.0.mlp.gate_proj.weight"], (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(shape.count("model.layers.1.mlp.gate_proj.weight"), 0u);
  EXPECT_EQ(shape["model.layers.1.mlp.gate.weight"], (std::vector<int64_t>{16, 128}));
  EXPECT_EQ(shape["model.layers.1.mlp.gate.e_score_correction_bias"], (std::vector<int64_t>{16}));
  EXPECT_EQ(shape["model.layers.2.mlp.experts.15.up_proj.weight"], (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(shape["model.layers.2.mlp.experts.0.down_proj.weight"],
            (std::vector<int64_t>{128, 64}));
  EXPECT_EQ(shape["model.layers.1.mlp.shared_experts.gate_proj.weight"],
            (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(shape["model.layers.1.mlp.shared_experts.down_proj.weight"],
            (std::vector<int64_t>{128, 64}));
  // embed + norm + lm_head, 3 x (attention 8 + 2 norms), 3 dense MLP, 2 x (2 + 16 x 3 + 3).
  EXPECT_EQ(specs.size(), 3u + 3u * 9u + 3u + 2u * 53u);
  // Written and read back (the directory's config round-trips the MoE and YaRN keys).
  const std::string dir = TempDir("moe") + "/tiny-moe-ckpt";
  ASSERT_TRUE(WritePresetToDirectory("tiny-moe", 4, dir).ok());
  absl::StatusOr<ModelWeights> loaded = LoadModelFromDirectory(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config.moe.n_routed_experts, 16);
  EXPECT_EQ(loaded->config.rope_scaling.type, "yarn");
  const ModelWeights gen = *MakePresetWeights("tiny-moe", 4);
  for (const TensorSpec& spec : specs) {
    ASSERT_EQ(loaded->Find(spec.name)->data, gen.Find(spec.name)->data) << spec.name;
  }
  fs::remove_all(fs::path(dir).parent_path());
}

// Writes one safetensors file of raw little-endian tensors: name -> (dtype, shape, bytes).
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
void WriteRawSafetensors(const std::string& path, const std::map<std::string, RawTensor>& ts) {
  nlohmann::json h;
  uint64_t off = 0;
  for (const auto& [name, t] : ts) {
    h[name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  const std::string hs = h.dump();
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = hs.size();
  out.write(reinterpret_cast<const char*>(&n), 8);  // little-endian host
  out.write(hs.data(), hs.size());
  for (const auto& [name, t] : ts) out.write(t.bytes.data(), t.bytes.size());
}

// An FP8 checkpoint: one Linear weight stored as F8_E4M3 with blockwise float32 scale_inv
// (blocks 100 x 48 over [256, 128]: a [3, 3] scale with partial edge blocks).
class Fp8Checkpoint : public ::testing::Test {
 protected:
  const std::string kName = "model.layers.0.mlp.gate_proj.weight";
  void SetUp() override {
    dir_ = TempDir("fp8") + "/fp8-ckpt";
    fs::create_directories(dir_);
    config_ = *PresetConfig("tiny");
    config_.quant.method = "fp8";
    config_.quant.block_rows = 100;
    config_.quant.block_cols = 48;
    const ModelWeights w = *GenerateRandomWeights(config_, 3);
    TensorMap rest = w.tensors;
    rest.erase(kName);
    ASSERT_TRUE(
        WriteSafetensorsFile(dir_ + "/model.safetensors", rest, SafetensorsDType::kBF16).ok());
    WriteConfig(config_);
    std::mt19937 rng(5);
    codes_.resize(256 * 128);
    for (auto& c : codes_) {
      do {
        c = static_cast<uint8_t>(rng());
      } while ((c & 0x7f) == 0x7f);  // no NaN codes
    }
    scale_ = {0.5f, 1.25f, 3.0f, 0.001f, 2.0f, 7.5f, 0.03125f, 1.0f, 10.0f};
  }
  void TearDown() override { fs::remove_all(fs::path(dir_).parent_path()); }
  void WriteConfig(const ModelConfig& c) {
    std::ofstream(dir_ + "/config.json", std::ios::trunc) << ModelConfigToJson(c);
  }
  void WriteFp8(std::vector<int64_t> scale_shape, bool with_scale = true) {
    std::map<std::string, RawTensor> ts;
    ts[kName] = {"F8_E4M3", {256, 128}, std::string(codes_.begin(), codes_.end())};
    if (with_scale) {
      std::vector<float> sc(scale_shape[0] * scale_shape[1], 1.0f);
      std::copy_n(scale_.begin(), std::min(sc.size(), scale_.size()), sc.begin());
      ts[kName + "_scale_inv"] = {
          "F32", scale_shape,
          std::string(reinterpret_cast<const char*>(sc.data()), sc.size() * sizeof(float))};
    }
    WriteRawSafetensors(dir_ + "/fp8.safetensors", ts);
  }
  std::string dir_;
  ModelConfig config_;
  std::vector<uint8_t> codes_;
  std::vector<float> scale_;
};

TEST_F(Fp8Checkpoint, DequantizedBlockwise) {
  WriteFp8({3, 3});
  absl::StatusOr<ModelWeights> w = LoadModelFromDirectory(dir_);
  ASSERT_TRUE(w.ok()) << w.status();
  const HostTensor* t = w->Find(kName);
  ASSERT_NE(t, nullptr);
  for (int64_t r = 0; r < 256; ++r) {
    for (int64_t c = 0; c < 128; ++c) {
      const float want =
          kernels::Fp8E4m3ToFloat(codes_[r * 128 + c]) * scale_[(r / 100) * 3 + c / 48];
      ASSERT_EQ(t->data[r * 128 + c], want) << r << "," << c;
    }
  }
  EXPECT_EQ(w->Find(kName + "_scale_inv"), nullptr);  // consumed
  // It serves: the engine runs on the dequantized weights.
  EngineOptions o;
  o.weights = std::make_shared<const ModelWeights>(std::move(*w));
  o.kv_slots = 16;
  EXPECT_TRUE(CpuEngine::Create(o).ok());
}

TEST_F(Fp8Checkpoint, MissingOrMisshapedScaleIsNamed) {
  WriteFp8({3, 3}, /*with_scale=*/false);
  absl::StatusOr<ModelWeights> w = LoadModelFromDirectory(dir_);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find(kName), std::string::npos) << w.status();
  EXPECT_NE(w.status().message().find("_scale_inv"), std::string::npos) << w.status();
  WriteFp8({2, 3});  // floor instead of ceil of 256 / 100
  w = LoadModelFromDirectory(dir_);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find(kName), std::string::npos) << w.status();
  EXPECT_NE(w.status().message().find("[3, 3]"), std::string::npos) << w.status();
}

// The stored dtype decides, not config.json: without a quantization_config an F8_E4M3 tensor
// is still dequantized with its `_scale_inv`, in the default 128 x 128 blocks.
TEST_F(Fp8Checkpoint, StoredDtypeDecidesWithoutQuantizationConfig) {
  ModelConfig plain = config_;
  plain.quant = QuantConfig();
  WriteConfig(plain);
  WriteFp8({3, 3});  // 100 x 48 blocks: not the default's [2, 1]
  absl::StatusOr<ModelWeights> w = LoadModelFromDirectory(dir_);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find(kName), std::string::npos) << w.status();
  EXPECT_NE(w.status().message().find("[2, 1]"), std::string::npos) << w.status();
  WriteFp8({2, 1});
  w = LoadModelFromDirectory(dir_);
  ASSERT_TRUE(w.ok()) << w.status();
  const HostTensor* t = w->Find(kName);
  ASSERT_NE(t, nullptr);
  for (int64_t r = 0; r < 256; ++r) {
    for (int64_t c = 0; c < 128; ++c) {
      ASSERT_EQ(t->data[r * 128 + c],
                kernels::Fp8E4m3ToFloat(codes_[r * 128 + c]) * scale_[r / 128])
          << r << "," << c;
    }
  }
}

}  // namespace
}  // namespace verifyd::tp
