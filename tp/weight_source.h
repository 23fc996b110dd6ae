// Where a model's weights come from, read block by block: the interface the engines fill
// their (sharded) weights through, an in-memory implementation over ModelWeights (presets,
// tests), and helpers over any source (validation against the model's tensor list, reading a
// whole tensor, materialising a small model as float32 ModelWeights).
//
// A source answers the *logical* tensor: its dequantized shape and float32 values, whatever
// the stored dtype (the checkpoint implementation, tp/checkpoint_reader.h, decodes F32 / BF16
// / F16 and block-scaled FP8). Reads are by block of rows x columns so that a rank reads only
// its slice (head rows of q_b / kv_b, head columns of o_proj, vocabulary rows of the LM head,
// intermediate rows / columns of the MLP): nothing ever materialises a whole tensor unless the
// caller asks for it.
//
// Thread-safety: every const method of a WeightSource may be called concurrently from any
// number of threads (the rank threads fill their weights in parallel); the source must
// outlive the readers. The free functions only call const methods.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "tp/model_config.h"
#include "tp/safetensors.h"
#include "tp/weights.h"

namespace verifyd::tp {

// Weights of one model, read by block. One per model; see the thread-safety note above.
class WeightSource {
 public:
  virtual ~WeightSource() = default;

  virtual const ModelConfig& config() const = 0;

  // Logical (dequantized) shape of a tensor; NotFound naming it when absent, or the reason
  // it cannot be served (an unsupported dtype, an FP8 weight without a valid scale, ...).
  virtual absl::StatusOr<std::vector<int64_t>> Shape(const std::string& name) const = 0;

  // Rows [row0, row0 + rows) and columns [col0, col0 + cols) of a tensor as float32,
  // row-major into dst[rows * cols]. A 1-D tensor of n elements is the matrix [1, n] (row0 =
  // 0, rows = 1); a tensor of three or more dimensions is [shape[0], product of the rest].
  // A block outside the shape is InvalidArgument naming the tensor; an empty block is a no-op.
  virtual absl::Status ReadBlock(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                                 int64_t cols, float* dst) const = 0;

  // The same block as bf16 bits (what the CUDA engine uploads): the float32 value rounded
  // to nearest even (BF16-stored tensors are copied bit for bit).
  virtual absl::Status ReadBlockBf16(const std::string& name, int64_t row0, int64_t rows,
                                     int64_t col0, int64_t cols, uint16_t* dst) const = 0;

  // FP8 block-scaled tensors as stored, for engines that keep them in FP8 (the CUDA engine's
  // routed experts): the e4m3 bytes of block [row0, +rows) x [col0, +cols) into dst[rows *
  // cols] and the float32 value of its `_scale_inv` entries, [ceil(rows / 128)][cols / 128]
  // into scale_dst. row0, col0 and cols must be multiples of 128, rows too unless the block
  // ends at the tensor's last row (a partial last block, as kv_a_proj_with_mqa's 576 rows),
  // and the tensor's scale blocks 128 x 128. Unimplemented when the tensor is not stored as F8_E4M3
  // (or the source keeps no FP8 bytes); InvalidArgument naming the tensor for a misaligned block
  // or naming the element for a NaN code (0x7f / 0xff) in it.
  virtual bool StoredAsFp8(const std::string& name) const {
    (void)name;
    return false;
  }
  virtual absl::Status ReadBlockFp8(const std::string& name, int64_t row0, int64_t rows,
                                    int64_t col0, int64_t cols, uint8_t* dst,
                                    float* scale_dst) const {
    (void)row0, (void)rows, (void)col0, (void)cols, (void)dst, (void)scale_dst;
    return absl::UnimplementedError(absl::StrCat("tensor '", name, "' is not stored as FP8"));
  }

  // Where the tensor is stored, for error messages ("path/model-00001.safetensors"); empty
  // when the source has no files.
  virtual std::string Location(const std::string& name) const {
    (void)name;
    return "";
  }
};

// The [rows, cols] matrix view of a shape used by ReadBlock: [] -> [1, 1], [n] -> [1, n],
// [r, c] -> [r, c], [d0, d1, ...] -> [d0, d1 * ...].
struct MatrixView {
  int64_t rows = 0;
  int64_t cols = 0;
};
MatrixView MatrixViewOf(const std::vector<int64_t>& shape);

// OK when the block [row0, +rows) x [col0, +cols) lies inside `shape` (empty blocks included);
// else InvalidArgument naming `what` (e.g. "file: tensor 'x'"), the block and the shape.
absl::Status CheckBlock(const std::string& what, const std::vector<int64_t>& shape, int64_t row0,
                        int64_t rows, int64_t col0, int64_t cols);

// A WeightSource over float32 host tensors (a preset, or a model loaded whole).
class InMemoryWeightSource final : public WeightSource {
 public:
  // Not owned: *weights must outlive this source and not change while it is read.
  explicit InMemoryWeightSource(const ModelWeights* weights);
  // Owned.
  explicit InMemoryWeightSource(ModelWeights weights);
  InMemoryWeightSource(const InMemoryWeightSource&) = delete;
  InMemoryWeightSource& operator=(const InMemoryWeightSource&) = delete;

  const ModelConfig& config() const override { return w_->config; }
  absl::StatusOr<std::vector<int64_t>> Shape(const std::string& name) const override;
  absl::Status ReadBlock(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                         int64_t cols, float* dst) const override;
  absl::Status ReadBlockBf16(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                             int64_t cols, uint16_t* dst) const override;

 private:
  absl::StatusOr<const HostTensor*> Find(const std::string& name) const;

  ModelWeights owned_;
  const ModelWeights* w_;
};

// Every tensor of `specs` present in the source with its exact logical shape and servable
// (Shape() OK). NotFound / InvalidArgument naming the tensor and, where the source has files,
// the file. Reads no tensor data.
absl::Status ValidateWeightSource(const WeightSource& source, const std::vector<TensorSpec>& specs);

// ReadBlock into dst[rows * cols], then every value finite: else InvalidArgument naming the
// tensor (with its location) and the element. What the CPU engine shards through.
absl::Status ReadFiniteBlock(const WeightSource& source, const std::string& name, int64_t row0,
                             int64_t rows, int64_t col0, int64_t cols, float* dst);

// ReadFiniteBlock appended to *out (grown by rows * cols).
absl::Status AppendFiniteBlock(const WeightSource& source, const std::string& name, int64_t row0,
                               int64_t rows, int64_t col0, int64_t cols, std::vector<float>* out);

// A whole tensor as float32 (allocates its full size: for small tensors, tests and tools).
absl::StatusOr<HostTensor> ReadTensor(const WeightSource& source, const std::string& name);

// Every tensor of ModelTensorSpecs(source.config()) as float32, checked with
// ValidateModelWeights (shapes, finite values). Host memory: the whole model in float32, so
// only for small models and tests; the engines read their slices with ReadBlock instead.
absl::StatusOr<ModelWeights> LoadModelWeights(const WeightSource& source);

}  // namespace verifyd::tp
