// WeightSource / CheckpointWeightSource: every stored dtype decodes exactly (FP8: all 256 codes
// against the format definition; BF16 / F16: all 65536), FP8 block dequantization with partial
// edge blocks, slices equal the full read, sharded directories with an index, the in-memory
// source equals the checkpoint source on presets, every error names its file and tensor, and
// reading a rank's slice allocates no whole tensor (heap counted through operator new).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <tuple>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/common.h"
#include "tests/heap_counter.h"
#include "tests/temp_dir_util.h"
#include "tp/checkpoint_reader.h"
#include "tp/presets.h"
#include "tp/safetensors.h"
#include "tp/weight_source.h"
#include "tp/weights.h"

namespace verifyd::tp {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Directories made by TempDir, removed when the test binary finishes.
class TempDirs : public ::testing::Environment {
 public:
  static std::vector<std::string>& List() {
    static std::vector<std::string>* dirs = new std::vector<std::string>();
    return *dirs;
  }
  void TearDown() override {
    std::error_code ec;
    for (const std::string& d : List()) fs::remove_all(d, ec);
  }
};
const ::testing::Environment* const kTempDirs = ::testing::AddGlobalTestEnvironment(new TempDirs());

std::string TempDir(const std::string& tag) {
  std::string dir = test_util::MakeTempDir("verifyd_ws_", tag);
  TempDirs::List().push_back(dir);
  return dir;
}

// ---- Writing safetensors files by hand ----------------------------------------------------

struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Writes the tensors in order; `edit` may change the header, `drop_tail` cuts the file short.
void WriteRaw(const std::string& path, const std::vector<RawTensor>& tensors,
              const std::function<void(json&)>& edit = nullptr, size_t drop_tail = 0) {
  json header = json::object();
  std::string data;
  for (const RawTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  if (edit) edit(header);
  const std::string h = header.dump();
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  file += h + data;
  file.resize(file.size() - drop_tail);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << file;
}

RawTensor F32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
  return {name, "F32", std::move(shape), Bytes(v)};
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

// ---- Reference decoders, from the format definitions ----------------------------------------

// float8_e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 NaN.
float RefFp8(uint8_t b) {
  const int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return static_cast<float>(sign ? -mag : mag);
}

// IEEE binary16.
float RefF16(uint16_t h) {
  const int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double mag;
  if (e == 31) {
    if (m != 0) return NAN;
    mag = INFINITY;
  } else {
    mag = e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1.0 + m / 1024.0, e - 15);
  }
  return static_cast<float>(sign ? -mag : mag);
}

// bfloat16: the high half of a float32.
float RefBf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Same value and sign bit; any NaN equals any NaN.
::testing::AssertionResult SameFloat(float want, float got) {
  if (std::isnan(want) && std::isnan(got)) return ::testing::AssertionSuccess();
  uint32_t a, b;
  std::memcpy(&a, &want, 4);
  std::memcpy(&b, &got, 4);
  if (a == b) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "want " << want << " got " << got;
}

// Options for hand-written files: no config.json, no model validation, 128 x 128 blocks.
CheckpointOpenOptions RawOptions(int64_t block_rows = 128, int64_t block_cols = 128) {
  CheckpointOpenOptions o;
  ModelConfig c;
  c.name = "raw";
  c.quant.block_rows = block_rows;
  c.quant.block_cols = block_cols;
  o.config = c;
  o.validate_model_tensors = false;
  return o;
}

std::unique_ptr<CheckpointWeightSource> OpenOk(const std::string& dir,
                                               const CheckpointOpenOptions& o) {
  absl::StatusOr<std::unique_ptr<CheckpointWeightSource>> s = CheckpointWeightSource::Open(dir, o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

std::vector<float> ReadAll(const WeightSource& s, const std::string& name) {
  absl::StatusOr<HostTensor> t = ReadTensor(s, name);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? t->data : std::vector<float>{};
}

// ---- Decoding --------------------------------------------------------------------------------

TEST(CheckpointDecode, Fp8AllCodesExactly) {
  const std::string dir = TempDir("fp8codes");
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  WriteRaw(dir + "/m.safetensors", {{"w", "F8_E4M3", {2, 128}, Bytes(codes)},
                                    F32("w_scale_inv", {1, 1}, {1.0f}),
                                    {"q", "F8_E4M3", {2, 128}, Bytes(codes)},
                                    F32("q_scale_inv", {1, 1}, {0.25f})});
  auto src = OpenOk(dir, RawOptions());
  ASSERT_NE(src, nullptr);
  EXPECT_EQ(*src->StoredDType("w"), "F8_E4M3");
  const std::vector<float> w = ReadAll(*src, "w"), q = ReadAll(*src, "q");
  ASSERT_EQ(w.size(), 256u);
  int nans = 0;
  for (int i = 0; i < 256; ++i) {
    const float want = RefFp8(static_cast<uint8_t>(i));
    nans += std::isnan(want);
    ASSERT_TRUE(SameFloat(want, w[i])) << "code " << i;
    ASSERT_TRUE(SameFloat(want * 0.25f, q[i])) << "code " << i << " x 0.25";
  }
  EXPECT_EQ(nans, 2);  // 0x7f and 0xff
  EXPECT_EQ(RefFp8(0x7e), 448.0f);
  EXPECT_EQ(RefFp8(0x01), std::ldexp(1.0f, -9));
}

TEST(CheckpointDecode, Bf16F16F32AllCodesExactly) {
  const std::string dir = TempDir("codes16");
  std::vector<uint16_t> codes(65536);
  for (int i = 0; i < 65536; ++i) codes[i] = static_cast<uint16_t>(i);
  const std::vector<float> f32 = {0.0f, -0.0f, 1.5f, -2.25e-40f, INFINITY, -INFINITY, NAN, 3e38f};
  WriteRaw(dir + "/m.safetensors", {{"b", "BF16", {256, 256}, Bytes(codes)},
                                    {"h", "F16", {256, 256}, Bytes(codes)},
                                    F32("f", {8}, f32)});
  auto src = OpenOk(dir, RawOptions());
  ASSERT_NE(src, nullptr);
  const std::vector<float> b = ReadAll(*src, "b"), h = ReadAll(*src, "h"), f = ReadAll(*src, "f");
  ASSERT_EQ(b.size(), 65536u);
  ASSERT_EQ(h.size(), 65536u);
  for (int i = 0; i < 65536; ++i) {
    ASSERT_TRUE(SameFloat(RefBf16(static_cast<uint16_t>(i)), b[i])) << "bf16 " << i;
    ASSERT_TRUE(SameFloat(RefF16(static_cast<uint16_t>(i)), h[i])) << "f16 " << i;
  }
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_TRUE(SameFloat(f32[i], f[i])) << i;
  // bf16 reads: BF16 bits unchanged (NaN payloads included), others rounded to nearest even.
  std::vector<uint16_t> bits(65536);
  ASSERT_TRUE(src->ReadBlockBf16("b", 0, 256, 0, 256, bits.data()).ok());
  EXPECT_EQ(bits, codes);
  ASSERT_TRUE(src->ReadBlockBf16("h", 0, 256, 0, 256, bits.data()).ok());
  for (int i = 0; i < 65536; ++i) {
    if (!std::isnan(h[i])) {
      ASSERT_EQ(bits[i], kernels::FloatToBf16(h[i])) << i;
    }
  }
}

// A random FP8 weight [rows, cols] (no NaN codes) with its scale for br x bc blocks.
struct Fp8Weight {
  std::vector<uint8_t> codes;
  std::vector<float> scale;
  int64_t rows, cols, br, bc, srows, scols;
  float Expected(int64_t r, int64_t c) const {
    return RefFp8(codes[r * cols + c]) * scale[(r / br) * scols + c / bc];
  }
};

Fp8Weight MakeFp8(int64_t rows, int64_t cols, int64_t br, int64_t bc, uint32_t seed) {
  Fp8Weight w{{}, {}, rows, cols, br, bc, (rows + br - 1) / br, (cols + bc - 1) / bc};
  std::mt19937 rng(seed);
  w.codes.resize(rows * cols);
  for (uint8_t& c : w.codes) {
    do {
      c = static_cast<uint8_t>(rng());
    } while ((c & 0x7f) == 0x7f);
  }
  w.scale.resize(w.srows * w.scols);
  for (size_t i = 0; i < w.scale.size(); ++i) w.scale[i] = 0.37f * static_cast<float>(i + 1);
  return w;
}

TEST(CheckpointDecode, Fp8BlockDequantWithPartialEdgeBlocks) {
  for (auto [br, bc] : {std::pair<int64_t, int64_t>{128, 128}, {64, 32}}) {
    const std::string dir = TempDir("fp8blocks");
    const Fp8Weight w = MakeFp8(200, 300, br, bc, 7);
    WriteRaw(dir + "/m.safetensors", {{"w", "F8_E4M3", {200, 300}, Bytes(w.codes)},
                                      F32("w_scale_inv", {w.srows, w.scols}, w.scale)});
    auto src = OpenOk(dir, RawOptions(br, bc));
    ASSERT_NE(src, nullptr);
    EXPECT_EQ(*src->Shape("w"), (std::vector<int64_t>{200, 300}));
    EXPECT_EQ(*src->Shape("w_scale_inv"), (std::vector<int64_t>{w.srows, w.scols}));
    const std::vector<float> got = ReadAll(*src, "w");
    std::vector<uint16_t> bits(200 * 300);
    ASSERT_TRUE(src->ReadBlockBf16("w", 0, 200, 0, 300, bits.data()).ok());
    for (int64_t r = 0; r < 200; ++r) {
      for (int64_t c = 0; c < 300; ++c) {
        ASSERT_TRUE(SameFloat(w.Expected(r, c), got[r * 300 + c])) << r << ", " << c;
        ASSERT_EQ(bits[r * 300 + c], kernels::FloatToBf16(w.Expected(r, c)));
      }
    }
  }
}

// The raw FP8 read (engines that keep FP8 on the device): bytes and scales as stored; a block
// may end in a partial row block only at the tensor's last row (kv_a_proj_with_mqa: 576 rows).
TEST(CheckpointDecode, Fp8RawBlocksWithPartialLastRowBlock) {
  const std::string dir = TempDir("fp8raw");
  const Fp8Weight w = MakeFp8(200, 256, 128, 128, 9);
  WriteRaw(dir + "/m.safetensors", {{"w", "F8_E4M3", {200, 256}, Bytes(w.codes)},
                                    F32("w_scale_inv", {w.srows, w.scols}, w.scale)});
  auto src = OpenOk(dir, RawOptions());
  ASSERT_NE(src, nullptr);
  ASSERT_TRUE(src->StoredAsFp8("w"));
  for (auto [r0, nr] : {std::pair<int64_t, int64_t>{0, 200}, {128, 72}, {0, 128}}) {
    std::vector<uint8_t> bytes(nr * 128, 0);
    std::vector<float> scale((nr + 127) / 128, -1.f);
    ASSERT_TRUE(src->ReadBlockFp8("w", r0, nr, 128, 128, bytes.data(), scale.data()).ok())
        << r0 << "+" << nr;
    for (int64_t r = 0; r < nr; ++r) {
      for (int64_t c = 0; c < 128; ++c) {
        ASSERT_EQ(bytes[r * 128 + c], w.codes[(r0 + r) * 256 + 128 + c]) << r << ", " << c;
      }
    }
    for (int64_t b = 0; b < (nr + 127) / 128; ++b) {
      EXPECT_EQ(scale[b], w.scale[(r0 / 128 + b) * w.scols + 1]) << r0 << " block " << b;
    }
  }
  // A partial row block anywhere else, or misaligned columns: InvalidArgument naming the tensor.
  std::vector<uint8_t> bytes(200 * 256);
  std::vector<float> scale(4);
  for (auto [r0, nr, c0, nc] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{0, 72, 0, 128},
                                {64, 136, 0, 128},
                                {0, 200, 0, 100}}) {
    const absl::Status st = src->ReadBlockFp8("w", r0, nr, c0, nc, bytes.data(), scale.data());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << r0 << "+" << nr;
    EXPECT_THAT(st.message(), HasSubstr("'w'"));
  }
}

// Whole-row blocks of 4 MB and more are read with pread by several threads (CopyBytes), not
// from the mapping: the bytes must be the same, at any row offset, for FP8 and BF16 tensors.
TEST(CheckpointDecode, LargeWholeRowBlocksReadByPreadAreExact) {
  const std::string dir = TempDir("pread");
  const Fp8Weight w = MakeFp8(5120, 1024, 128, 128, 31);  // 5 MB of codes
  std::mt19937 rng(32);
  std::vector<uint16_t> b16(2560 * 1024);  // 5 MB of bf16
  for (uint16_t& x : b16) {
    do {
      x = static_cast<uint16_t>(rng());
    } while ((x & 0x7f80) == 0x7f80);
  }
  WriteRaw(dir + "/m.safetensors", {{"pad", "F32", {3}, Bytes(std::vector<float>{1, 2, 3})},
                                    {"w", "F8_E4M3", {5120, 1024}, Bytes(w.codes)},
                                    F32("w_scale_inv", {w.srows, w.scols}, w.scale),
                                    {"b", "BF16", {2560, 1024}, Bytes(b16)}});
  auto src = OpenOk(dir, RawOptions());
  ASSERT_NE(src, nullptr);
  for (auto [r0, nr] : {std::pair<int64_t, int64_t>{0, 5120}, {128, 4992}, {1024, 4096}}) {
    std::vector<uint8_t> bytes(nr * 1024, 0xAA);
    std::vector<float> scale((nr + 127) / 128 * 8, -1.f);
    ASSERT_TRUE(src->ReadBlockFp8("w", r0, nr, 0, 1024, bytes.data(), scale.data()).ok());
    EXPECT_EQ(0, std::memcmp(bytes.data(), w.codes.data() + r0 * 1024, bytes.size())) << r0;
    EXPECT_EQ(scale.back(), w.scale[(r0 / 128 + (nr + 127) / 128 - 1) * w.scols + 7]);
  }
  // Dequantized to bf16 by several threads (a large block): each value as defined.
  {
    std::vector<uint16_t> got(4992 * 1024, 0);
    ASSERT_TRUE(src->ReadBlockBf16("w", 128, 4992, 0, 1024, got.data()).ok());
    int64_t wrong = 0;
    for (int64_t r = 0; r < 4992; ++r) {
      for (int64_t c = 0; c < 1024; ++c) {
        wrong += got[r * 1024 + c] != kernels::FloatToBf16(w.Expected(128 + r, c));
      }
    }
    EXPECT_EQ(wrong, 0);
  }
  // A NaN code is refused naming the element, in a pread block and in a mapped one.
  {
    std::vector<uint8_t> codes = w.codes;
    codes[4000 * 1024 + 17] = 0xff;
    const std::string dir2 = TempDir("preadnan");
    WriteRaw(dir2 + "/m.safetensors", {{"w", "F8_E4M3", {5120, 1024}, Bytes(codes)},
                                       F32("w_scale_inv", {w.srows, w.scols}, w.scale)});
    auto bad = OpenOk(dir2, RawOptions());
    ASSERT_NE(bad, nullptr);
    std::vector<uint8_t> bytes(5120 * 1024);
    std::vector<float> scale(40 * 8);
    for (auto [r0, nr, c0, nc] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t>{0, 5120, 0, 1024}, {3968, 128, 0, 128}}) {
      const absl::Status st = bad->ReadBlockFp8("w", r0, nr, c0, nc, bytes.data(), scale.data());
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << r0;
      EXPECT_THAT(st.message(), AllOf(HasSubstr("'w'"), HasSubstr("[4000, 17]"), HasSubstr("NaN")));
    }
  }
  for (auto [r0, nr] : {std::pair<int64_t, int64_t>{0, 2560}, {7, 2553}, {300, 2100}}) {
    std::vector<uint16_t> got(nr * 1024, 0);
    ASSERT_TRUE(src->ReadBlockBf16("b", r0, nr, 0, 1024, got.data()).ok());
    EXPECT_EQ(0, std::memcmp(got.data(), b16.data() + r0 * 1024, got.size() * 2)) << r0;
  }
}

// ---- Slices ----------------------------------------------------------------------------------

TEST(CheckpointSlices, EqualTheFullRead) {
  const std::string dir = TempDir("slices");
  std::mt19937 rng(11);
  std::vector<float> f(37 * 53);
  for (float& x : f) x = std::uniform_real_distribution<float>(-2, 2)(rng);
  std::vector<uint16_t> h(37 * 53);
  for (uint16_t& x : h) x = static_cast<uint16_t>(rng() & 0x7bff);  // finite
  const Fp8Weight w8 = MakeFp8(200, 300, 128, 128, 3);
  WriteRaw(dir + "/m.safetensors", {F32("f32", {37, 53}, f),
                                    {"bf16", "BF16", {37, 53}, Bytes(h)},
                                    {"f16", "F16", {37, 53}, Bytes(h)},
                                    F32("vec", {77}, std::vector<float>(77, 0.5f)),
                                    {"fp8", "F8_E4M3", {200, 300}, Bytes(w8.codes)},
                                    F32("fp8_scale_inv", {2, 3}, w8.scale)});
  auto src = OpenOk(dir, RawOptions());
  ASSERT_NE(src, nullptr);
  for (const std::string name : {"f32", "bf16", "f16", "vec", "fp8"}) {
    const std::vector<int64_t> shape = *src->Shape(name);
    const MatrixView m = MatrixViewOf(shape);
    const std::vector<float> full = ReadAll(*src, name);
    std::vector<uint16_t> full16(full.size());
    ASSERT_TRUE(src->ReadBlockBf16(name, 0, m.rows, 0, m.cols, full16.data()).ok());
    for (int t = 0; t < 60; ++t) {
      const int64_t r0 = rng() % (m.rows + 1), c0 = rng() % (m.cols + 1);
      const int64_t nr = rng() % (m.rows - r0 + 1), nc = rng() % (m.cols - c0 + 1);
      std::vector<float> blk(nr * nc);
      std::vector<uint16_t> blk16(nr * nc);
      ASSERT_TRUE(src->ReadBlock(name, r0, nr, c0, nc, blk.data()).ok());
      ASSERT_TRUE(src->ReadBlockBf16(name, r0, nr, c0, nc, blk16.data()).ok());
      for (int64_t r = 0; r < nr; ++r) {
        for (int64_t c = 0; c < nc; ++c) {
          ASSERT_EQ(blk[r * nc + c], full[(r0 + r) * m.cols + c0 + c]) << name;
          ASSERT_EQ(blk16[r * nc + c], full16[(r0 + r) * m.cols + c0 + c]) << name;
        }
      }
    }
    // Outside the shape: InvalidArgument naming the file and the tensor.
    std::vector<float> one(m.cols + 1);
    absl::Status s = src->ReadBlock(name, m.rows - 1, 2, 0, 1, one.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("m.safetensors"), HasSubstr("'" + name + "'")));
    s = src->ReadBlock(name, 0, 1, 1, m.cols, one.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  }
  // Concurrent readers see the same values.
  const std::vector<float> full = ReadAll(*src, "fp8");
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> rows(50 * 300);
      for (int k = 0; k < 20; ++k) {
        if (!src->ReadBlock("fp8", t * 50, 50, 0, 300, rows.data()).ok()) ++mismatches;
        for (int64_t i = 0; i < 50 * 300; ++i) mismatches += rows[i] != full[t * 50 * 300 + i];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// ---- Model checkpoints: in-memory source == checkpoint source --------------------------------

void ExpectSameSources(const WeightSource& a, const WeightSource& b) {
  for (const TensorSpec& spec : ModelTensorSpecs(a.config())) {
    ASSERT_EQ(*a.Shape(spec.name), *b.Shape(spec.name)) << spec.name;
    EXPECT_EQ(ReadAll(a, spec.name), ReadAll(b, spec.name)) << spec.name;
    const MatrixView m = MatrixViewOf(spec.shape);
    std::vector<uint16_t> x(m.rows * m.cols), y(m.rows * m.cols);
    ASSERT_TRUE(a.ReadBlockBf16(spec.name, 0, m.rows, 0, m.cols, x.data()).ok());
    ASSERT_TRUE(b.ReadBlockBf16(spec.name, 0, m.rows, 0, m.cols, y.data()).ok());
    EXPECT_EQ(x, y) << spec.name;
  }
}

TEST(CheckpointModel, PresetOnDiskEqualsInMemory) {
  for (const char* preset : {"tiny", "tiny-moe"}) {
    absl::StatusOr<ModelWeights> w = MakePresetWeights(preset, 5);
    ASSERT_TRUE(w.ok()) << w.status();
    const InMemoryWeightSource mem(&*w);
    ASSERT_TRUE(ValidateWeightSource(mem, ModelTensorSpecs(w->config)).ok());
    for (auto [dtype, shard_bytes] : {std::pair{SafetensorsDType::kBF16, int64_t{64 << 10}},
                                      std::pair{SafetensorsDType::kF32, int64_t{0}}}) {
      const std::string dir = TempDir(preset);
      ASSERT_TRUE(WriteModelToDirectory(*w, dir, dtype, shard_bytes).ok());
      EXPECT_EQ(fs::exists(dir + "/model.safetensors.index.json"), shard_bytes > 0);
      absl::StatusOr<std::unique_ptr<CheckpointWeightSource>> ck =
          CheckpointWeightSource::Open(dir);
      ASSERT_TRUE(ck.ok()) << ck.status();
      if (shard_bytes > 0) {
        EXPECT_GT((*ck)->num_files(), 2);
      }
      EXPECT_EQ((*ck)->config().name, fs::path(dir).filename().string());
      EXPECT_EQ((*ck)->config().num_hidden_layers, w->config.num_hidden_layers);
      ExpectSameSources(mem, **ck);
      absl::StatusOr<ModelWeights> loaded = LoadModelWeights(**ck);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      EXPECT_EQ(loaded->tensors.size(), ModelTensorSpecs(w->config).size());
      for (const auto& [name, t] : loaded->tensors) EXPECT_EQ(t.data, w->Find(name)->data);
    }
  }
}

// The tiny preset as raw F32 tensors (to edit before writing).
std::vector<RawTensor> TinyRaw(ModelConfig* config) {
  absl::StatusOr<ModelWeights> w = MakePresetWeights("tiny", 1);
  EXPECT_TRUE(w.ok());
  *config = w->config;
  std::vector<RawTensor> out;
  for (const TensorSpec& s : ModelTensorSpecs(w->config)) {
    out.push_back(F32(s.name, s.shape, w->Find(s.name)->data));
  }
  return out;
}

std::string WriteTinyRaw(const std::string& tag,
                         const std::function<void(std::vector<RawTensor>&)>& change) {
  const std::string dir = TempDir(tag);
  ModelConfig c;
  std::vector<RawTensor> ts = TinyRaw(&c);
  change(ts);
  WriteText(dir + "/config.json", ModelConfigToJson(c));
  WriteRaw(dir + "/model.safetensors", ts);
  return dir;
}

absl::Status OpenStatus(const std::string& dir, const CheckpointOpenOptions& o = {}) {
  return CheckpointWeightSource::Open(dir, o).status();
}

TEST(CheckpointModel, Fp8WeightsAndExtraTensorsAtOpen) {
  const std::string qb = "model.layers.1.self_attn.q_b_proj.weight";  // [8 * 48, 64]
  auto to_fp8 = [&](std::vector<RawTensor>& ts, bool with_scale) {
    for (RawTensor& t : ts) {
      if (t.name != qb) continue;
      const int64_t n = t.shape[0] * t.shape[1];
      t = {qb, "F8_E4M3", t.shape, std::string(n, static_cast<char>(0x38))};  // 1.0
    }
    if (with_scale) ts.push_back(F32(qb + "_scale_inv", {3, 1}, {0.5f, 0.25f, 2.0f}));
    // Extras the model does not use: an MTP layer, an integer tensor.
    ts.push_back(F32("model.layers.2.self_attn.q_a_proj.weight", {2, 2}, {1, 2, 3, 4}));
    ts.push_back({"model.extra_ids", "I64", {2}, std::string(16, '\0')});
  };
  const std::string good = WriteTinyRaw("fp8ok", [&](auto& ts) { to_fp8(ts, true); });
  absl::StatusOr<std::unique_ptr<CheckpointWeightSource>> src = CheckpointWeightSource::Open(good);
  ASSERT_TRUE(src.ok()) << src.status();
  const std::vector<float> v = ReadAll(**src, qb);
  ASSERT_EQ(v.size(), 384u * 64u);
  EXPECT_EQ(v[0], 0.5f);
  EXPECT_EQ(v[200 * 64], 0.25f);
  EXPECT_EQ(v[383 * 64 + 63], 2.0f);
  EXPECT_TRUE(LoadModelWeights(**src).ok());
  EXPECT_EQ((*src)->Shape("model.extra_ids").status().code(), absl::StatusCode::kInvalidArgument);

  const std::string bad = WriteTinyRaw("fp8noscale", [&](auto& ts) { to_fp8(ts, false); });
  const absl::Status s = OpenStatus(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              AllOf(HasSubstr("model.safetensors"), HasSubstr(qb + "'"), HasSubstr("_scale_inv")));
}

// An FP8 checkpoint of tiny-moe (every 2-D projection of the decoder layers F8_E4M3 with 64 x 32
// blocks): the streaming source and LoadModelFromDirectory (built on it) both give the
// format definition's values, w = fp8(code) * scale_inv, the other tensors unchanged.
TEST(CheckpointModel, Fp8CheckpointDequantizedAsDefined) {
  absl::StatusOr<ModelWeights> w = MakePresetWeights("tiny-moe", 9);
  ASSERT_TRUE(w.ok()) << w.status();
  ModelConfig c = w->config;
  c.quant.method = "fp8";
  c.quant.block_rows = 64;
  c.quant.block_cols = 32;
  std::vector<RawTensor> ts;
  std::map<std::string, Fp8Weight> fp8;
  uint32_t seed = 0;
  for (const TensorSpec& s : ModelTensorSpecs(c)) {
    const bool proj = s.shape.size() == 2 && s.name.rfind("model.layers.", 0) == 0 &&
                      s.name.find("proj.weight") != std::string::npos;
    if (!proj) {
      ts.push_back(F32(s.name, s.shape, w->Find(s.name)->data));
      continue;
    }
    const Fp8Weight q = MakeFp8(s.shape[0], s.shape[1], 64, 32, ++seed);
    ts.push_back({s.name, "F8_E4M3", s.shape, Bytes(q.codes)});
    ts.push_back(F32(s.name + "_scale_inv", {q.srows, q.scols}, q.scale));
    fp8.emplace(s.name, q);
  }
  EXPECT_GT(fp8.size(), 10u);
  const std::string dir = TempDir("fp8model");
  WriteText(dir + "/config.json", ModelConfigToJson(c));
  WriteRaw(dir + "/model.safetensors", ts);
  absl::StatusOr<std::unique_ptr<CheckpointWeightSource>> src = CheckpointWeightSource::Open(dir);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->config().quant.block_rows, 64);
  absl::StatusOr<ModelWeights> streamed = LoadModelWeights(**src);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  absl::StatusOr<ModelWeights> whole = LoadModelFromDirectory(dir);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const TensorSpec& s : ModelTensorSpecs(c)) {
    std::vector<float> want = w->Find(s.name)->data;
    if (auto it = fp8.find(s.name); it != fp8.end()) {
      for (int64_t r = 0; r < it->second.rows; ++r) {
        for (int64_t k = 0; k < it->second.cols; ++k) {
          want[r * it->second.cols + k] = it->second.Expected(r, k);
        }
      }
    }
    ASSERT_NE(whole->Find(s.name), nullptr) << s.name;
    EXPECT_EQ(streamed->Find(s.name)->data, want) << s.name;
    EXPECT_EQ(whole->Find(s.name)->data, want) << s.name;
  }
}

// ---- Errors ----------------------------------------------------------------------------------

void ExpectError(const absl::Status& s, absl::StatusCode code,
                 const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), code) << s;
  for (const std::string& p : parts) EXPECT_THAT(s.message(), HasSubstr(p)) << s;
}

TEST(CheckpointErrors, ModelTensorsMissingMisshapedOrOfUnsupportedDtype) {
  const std::string norm = "model.layers.0.input_layernorm.weight";
  std::string dir = WriteTinyRaw("missing", [&](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [&](auto& t) { return t.name == norm; }),
             ts.end());
  });
  ExpectError(OpenStatus(dir), absl::StatusCode::kNotFound, {dir, "'" + norm + "'"});

  dir = WriteTinyRaw("shape", [&](auto& ts) {
    for (auto& t : ts) {
      if (t.name == norm) t = F32(norm, {127}, std::vector<float>(127, 1.0f));
    }
  });
  ExpectError(OpenStatus(dir), absl::StatusCode::kInvalidArgument,
              {"model.safetensors", "'" + norm + "'", "[127]", "[128]"});

  dir = WriteTinyRaw("dtype", [&](auto& ts) {
    for (auto& t : ts) {
      if (t.name == norm) t.dtype = "I32";
    }
  });
  ExpectError(OpenStatus(dir), absl::StatusCode::kInvalidArgument,
              {"model.safetensors", "'" + norm + "'", "I32"});

  ExpectError(OpenStatus(TempDir("empty")), absl::StatusCode::kNotFound, {"config.json"});
  ExpectError(OpenStatus("/nonexistent/verifyd"), absl::StatusCode::kNotFound, {"verifyd"});
}

TEST(CheckpointErrors, MalformedAndTruncatedFiles) {
  const std::vector<RawTensor> ts = {F32("a", {4}, {1, 2, 3, 4}),
                                     F32("b", {2, 3}, {1, 2, 3, 4, 5, 6}),
                                     F32("c", {5}, {1, 2, 3, 4, 5})};
  auto open_with = [&](const std::function<void(json&)>& edit, size_t drop) {
    const std::string dir = TempDir("bad");
    WriteRaw(dir + "/shard.safetensors", ts, edit, drop);
    return OpenStatus(dir, RawOptions());
  };
  ASSERT_TRUE(open_with(nullptr, 0).ok());
  // Short by 4 bytes: the last tensor does not fit; by 30 (more than c's 20): b is the first.
  ExpectError(open_with(nullptr, 4), absl::StatusCode::kDataLoss,
              {"shard.safetensors", "truncated", "'c'"});
  ExpectError(open_with(nullptr, 30), absl::StatusCode::kDataLoss,
              {"shard.safetensors", "truncated", "'b'"});
  // data_offsets that do not match shape x dtype size.
  ExpectError(open_with(
                  [](json& h) {
                    h["b"]["data_offsets"] = {16, 36};
                  },
                  0),
              absl::StatusCode::kInvalidArgument, {"shard.safetensors", "'b'", "data_offsets"});
  ExpectError(open_with([](json& h) { h["a"]["dtype"] = "BF16"; }, 0),
              absl::StatusCode::kInvalidArgument, {"shard.safetensors", "'a'"});
  ExpectError(open_with([](json& h) { h["c"].erase("dtype"); }, 0),
              absl::StatusCode::kInvalidArgument, {"shard.safetensors", "'c'"});
  ExpectError(open_with([](json& h) { h["c"]["shape"] = {-1}; }, 0),
              absl::StatusCode::kInvalidArgument, {"shard.safetensors", "'c'"});
  ExpectError(open_with([](json& h) { h = json::array(); }, 0), absl::StatusCode::kInvalidArgument,
              {"shard.safetensors", "JSON object"});
  // An unknown dtype is an error only for the tensor that has it.
  {
    const std::string dir = TempDir("unknown");
    WriteRaw(dir + "/shard.safetensors", ts, [](json& h) { h["a"]["dtype"] = "Q4_K"; });
    auto src = OpenOk(dir, RawOptions());
    ASSERT_NE(src, nullptr);
    ExpectError(src->Shape("a").status(), absl::StatusCode::kInvalidArgument,
                {"shard.safetensors", "'a'", "Q4_K"});
    std::vector<float> x(1);
    ExpectError(src->ReadBlock("a", 0, 1, 0, 1, x.data()), absl::StatusCode::kInvalidArgument,
                {"'a'", "Q4_K"});
    EXPECT_EQ(ReadAll(*src, "c"), (std::vector<float>{1, 2, 3, 4, 5}));
    ExpectError(src->Shape("zz").status(), absl::StatusCode::kNotFound, {"'zz'", dir});
  }
  // Header length past the end; a file shorter than 8 bytes.
  {
    const std::string dir = TempDir("header");
    std::string f(8, '\0');
    f[0] = 100;
    std::ofstream(dir + "/x.safetensors", std::ios::binary) << f << "{}";
    ExpectError(OpenStatus(dir, RawOptions()), absl::StatusCode::kInvalidArgument,
                {"x.safetensors", "header length"});
    std::ofstream(dir + "/x.safetensors", std::ios::binary | std::ios::trunc) << "abc";
    ExpectError(OpenStatus(dir, RawOptions()), absl::StatusCode::kInvalidArgument,
                {"x.safetensors", "8 bytes"});
  }
}

TEST(CheckpointErrors, ShardsAndIndex) {
  const std::string dir = TempDir("shards");
  WriteRaw(dir + "/model-1.safetensors", {F32("a", {2}, {1, 2}), F32("b", {1}, {3})});
  WriteRaw(dir + "/model-2.safetensors", {F32("c", {3}, {4, 5, 6})});
  // No index: every *.safetensors.
  auto src = OpenOk(dir, RawOptions());
  ASSERT_NE(src, nullptr);
  EXPECT_EQ(src->num_files(), 2);
  EXPECT_EQ(ReadAll(*src, "c"), (std::vector<float>{4, 5, 6}));
  EXPECT_THAT(src->Location("c"), HasSubstr("model-2.safetensors"));
  EXPECT_EQ(src->TensorNames(), (std::vector<std::string>{"a", "b", "c"}));
  // With an index.
  json index = {
      {"metadata", json::object()},
      {"weight_map",
       {{"a", "model-1.safetensors"}, {"b", "model-1.safetensors"}, {"c", "model-2.safetensors"}}}};
  WriteText(dir + "/model.safetensors.index.json", index.dump());
  src = OpenOk(dir, RawOptions());
  ASSERT_NE(src, nullptr);
  EXPECT_EQ(ReadAll(*src, "a"), (std::vector<float>{1, 2}));
  // The index names a file that does not exist.
  index["weight_map"]["d"] = "model-3.safetensors";
  WriteText(dir + "/model.safetensors.index.json", index.dump());
  ExpectError(OpenStatus(dir, RawOptions()), absl::StatusCode::kNotFound,
              {"model.safetensors.index.json", "model-3.safetensors", "'d'"});
  // The index names a file outside the directory.
  index["weight_map"]["d"] = "../model-1.safetensors";
  WriteText(dir + "/model.safetensors.index.json", index.dump());
  ExpectError(OpenStatus(dir, RawOptions()), absl::StatusCode::kInvalidArgument,
              {"model.safetensors.index.json", "'d'", "../model-1.safetensors"});
  // The index maps a tensor to a file that does not hold it.
  index["weight_map"].erase("d");
  index["weight_map"]["c"] = "model-1.safetensors";
  WriteText(dir + "/model.safetensors.index.json", index.dump());
  ExpectError(OpenStatus(dir, RawOptions()), absl::StatusCode::kInvalidArgument,
              {"model-1.safetensors", "'c'"});
  // A tensor in two files.
  fs::remove(dir + "/model.safetensors.index.json");
  WriteRaw(dir + "/model-2.safetensors", {F32("c", {3}, {4, 5, 6}), F32("a", {2}, {7, 8})});
  ExpectError(OpenStatus(dir, RawOptions()), absl::StatusCode::kInvalidArgument,
              {"model-1.safetensors", "model-2.safetensors", "'a'"});
}

TEST(CheckpointErrors, Fp8ScaleMissingMisshapedOrNot2d) {
  const std::string dir = TempDir("fp8bad");
  const Fp8Weight w = MakeFp8(200, 300, 128, 128, 1);
  WriteRaw(dir + "/m.safetensors", {{"noscale", "F8_E4M3", {200, 300}, Bytes(w.codes)},
                                    {"wrong", "F8_E4M3", {200, 300}, Bytes(w.codes)},
                                    F32("wrong_scale_inv", {2, 2}, {1, 1, 1, 1}),
                                    {"vec", "F8_E4M3", {16}, std::string(16, '\x38')},
                                    F32("vec_scale_inv", {1}, {1})});
  auto src = OpenOk(dir, RawOptions());  // errors are per tensor, found by validation
  ASSERT_NE(src, nullptr);
  ExpectError(ValidateWeightSource(*src, {{"noscale", {200, 300}}}),
              absl::StatusCode::kInvalidArgument,
              {"m.safetensors", "'noscale'", "noscale_scale_inv"});
  ExpectError(ValidateWeightSource(*src, {{"wrong", {200, 300}}}),
              absl::StatusCode::kInvalidArgument, {"m.safetensors", "'wrong'", "[2, 2]", "[2, 3]"});
  ExpectError(src->Shape("vec").status(), absl::StatusCode::kInvalidArgument, {"'vec'", "2-D"});
  std::vector<float> x(300);
  ExpectError(src->ReadBlock("wrong", 0, 1, 0, 300, x.data()), absl::StatusCode::kInvalidArgument,
              {"'wrong'"});
  EXPECT_EQ(*src->Shape("wrong_scale_inv"), (std::vector<int64_t>{2, 2}));
}

// ---- Bounded memory --------------------------------------------------------------------------

TEST(CheckpointMemory, RankSliceAllocatesOnlyItsDestination) {
  const std::string dir = TempDir("memory");
  const int64_t rows = 4096, cols = 1024, world = 8, rank = 3;
  {
    std::vector<uint16_t> big(rows * cols);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint16_t>(0x3f80 + (i & 0x7f));
    const Fp8Weight w8 = MakeFp8(rows, cols, 128, 128, 2);
    WriteRaw(dir + "/m.safetensors", {{"bf16", "BF16", {rows, cols}, Bytes(big)},
                                      {"fp8", "F8_E4M3", {rows, cols}, Bytes(w8.codes)},
                                      F32("fp8_scale_inv", {w8.srows, w8.scols}, w8.scale)});
  }
  const int64_t whole_f32 = rows * cols * 4;  // 16 MiB per tensor as float32
  // Open parses headers only: no file-sized allocation.
  int64_t base = g_heap_now.load();
  g_heap_peak.store(base);
  auto src = OpenOk(dir, RawOptions());
  ASSERT_NE(src, nullptr);
  EXPECT_LT(g_heap_peak.load() - base, 256 << 10);
  EXPECT_GT(src->mapped_bytes(), static_cast<uint64_t>(rows * cols * 3));

  const int64_t slice = rows / world;      // row slice (q_b heads, vocabulary rows)
  const int64_t col_slice = cols / world;  // column slice (o_proj, down_proj)
  std::vector<float> dst(slice * cols);    // the only buffers a rank allocates
  std::vector<uint16_t> dst16(rows * col_slice);
  for (const std::string name : {"bf16", "fp8"}) {
    base = g_heap_now.load();
    g_heap_peak.store(base);
    ASSERT_TRUE(src->ReadBlock(name, rank * slice, slice, 0, cols, dst.data()).ok());
    ASSERT_TRUE(src->ReadBlockBf16(name, 0, rows, rank * col_slice, col_slice, dst16.data()).ok());
    const int64_t extra = g_heap_peak.load() - base;
    EXPECT_LT(extra, 64 << 10) << name;  // O(cols) scratch at most
    EXPECT_LT(extra, whole_f32 / 64) << name;
    if (name == "bf16") {  // the slice's first element is element (rank * slice, 0)
      EXPECT_EQ(dst[0], RefBf16(static_cast<uint16_t>(0x3f80 + ((rank * slice * cols) & 0x7f))));
    }
  }
}

}  // namespace
}  // namespace verifyd::tp
