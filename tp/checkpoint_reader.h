// CheckpointWeightSource: a streaming WeightSource over a Hugging Face checkpoint directory
// (config.json + one or several safetensors files), sized for DeepSeek-V3 / Kimi-K2
// checkpoints (~700 GB in FP8, ~1 TB in BF16).
//
// Open(dir):
//   * parses dir/config.json (ParseModelConfigJson; config.name = the directory's base name);
//   * lists the files: model.safetensors.index.json ("weight_map": tensor -> file) when
//     present, else every *.safetensors file of the directory;
//   * maps each file once, read-only (mmap), and parses its JSON header. Nothing else of the
//     file is read: Open touches only the header pages, so opening and validating a 700 GB
//     checkpoint takes seconds;
//   * checks the structure from the headers alone: every entry well-formed, its data_offsets
//     inside the file and equal to shape x dtype size (a file shorter than its header says is
//     DataLoss naming the file and the first tensor that does not fit), no tensor in two files,
//     the index naming only existing files that hold the tensors it maps;
//   * then (unless disabled) ValidateWeightSource against ModelTensorSpecs(config): every
//     tensor of the model present with its exact logical shape, stored as F32, BF16, F16 or
//     F8_E4M3 (FP8 with a valid scale). Extra tensors (MTP layers model.layers.{L + k}.*,
//     tensors of other dtypes that the model does not use) are ignored.
//
// Stored dtypes: F32, BF16, F16, F8_E4M3 (float8_e4m3fn); another dtype makes the tensor
// unservable (InvalidArgument naming file, tensor and dtype, from Shape / ReadBlock and from
// validation when the model needs it). An F8_E4M3 tensor is a 2-D weight [rows, cols] with a
// companion `<name>_scale_inv` (F32, BF16 or F16) of shape [ceil(rows / br), ceil(cols / bc)],
// (br, bc) = config.quant.block_rows / block_cols (128 x 128 by default); it is served
// dequantized: w[r][c] = fp8(r, c) * scale_inv[r / br][c / bc], computed in float32 (and
// rounded to bf16 once, after the multiply, by ReadBlockBf16). The `_scale_inv` tensors stay
// readable as plain F32 tensors but are not model tensors.
//
// The FP8 rule, one for every loader (LoadModelFromDirectory, both engines): the stored dtype
// decides. A tensor stored as F8_E4M3 is dequantized with its `_scale_inv`, which is required
// (without it the tensor is unservable, naming both); a tensor stored otherwise is read as
// stored, whatever config.json's quantization_config says. quantization_config only gives the
// block size (weight_block_size; 128 x 128 when absent).
//
// Errors: InvalidArgument for a malformed header / index / entry, an unsupported dtype, an
// FP8 weight without its scale or with a wrong-shaped one, a tensor in two files, a shape
// other than the model's; NotFound for a missing directory, config.json, file named by the
// index or model tensor; DataLoss for a truncated file. Every message names the file and the
// tensor (or, for a missing tensor, the directory).
//
// Host memory: the mappings are virtual address space (the sum of the file sizes), not
// allocations; the resident memory they cost is page cache, shared with other processes,
// clean and reclaimable by the kernel. A read touches only the file pages of the requested
// block (a row slice reads rows x cols x dtype bytes, a column slice the pages those columns
// of each row fall in) plus, for FP8, the scale rows of those blocks. The heap a reader uses is
// the caller's dst buffer plus O(cols) float32 scratch per ReadBlockBf16 call, and the table of
// tensors: ~400 bytes per tensor, i.e. ~60 MB for DeepSeek-V3's ~150k tensors and scales (plus,
// during Open, one file's parsed JSON header at a time). So loading a rank needs its own slice
// of the weights (the upload buffer the caller chooses) and no host copy of the whole model.
// No madvise hints are given (not measured to help; the kernel's readahead serves row slices).
// A file truncated or rewritten while mapped makes reads of the lost pages fault (SIGBUS):
// checkpoints must not change while a source is open.
//
// Load progress: SetProgressCallback() (before the engine reads) makes the reads report
// LoadProgress: a tensor counts as read, with all its stored bytes (and its FP8 scale's), from
// the first read of any block of it; a shard (file) is done once every model tensor in it has
// been read (a file without model tensors, e.g. MTP layers only, is done from the start).
//
// Thread-safety: immutable after Open but for the progress counters (under their own mutex);
// every const method may be called concurrently. SetProgressCallback() must not race with
// reads. The mappings live as long as the object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tp/model_config.h"
#include "tp/weight_source.h"

namespace verifyd::tp {

// How far a load through a CheckpointWeightSource has come (see SetProgressCallback).
struct LoadProgress {
  int files_done = 0;        // shards whose model tensors have all been read
  int files_total = 0;       // shards (safetensors files) of the checkpoint
  uint64_t bytes_read = 0;   // stored bytes of the model tensors read so far
  uint64_t bytes_total = 0;  // stored bytes of the model's tensors (FP8 scales included)
  double elapsed_s = 0;      // seconds since SetProgressCallback
};
using LoadProgressCallback = std::function<void(const LoadProgress&)>;

// The config of checkpoint directory `dir`: dir/config.json parsed, named after the directory
// (what CheckpointWeightSource::Open serves; no weights read). NotFound without the file, the
// parser's error prefixed with the file's path for a bad one.
absl::StatusOr<ModelConfig> ReadCheckpointConfig(const std::string& dir);

struct CheckpointOpenOptions {
  // Use this config instead of parsing dir/config.json (tests; tools that read one file).
  std::optional<ModelConfig> config;
  // Validate the tensors of ModelTensorSpecs(config) at Open. Off: only the files' structure
  // is checked (tools that read arbitrary tensors).
  bool validate_model_tensors = true;
};

class CheckpointWeightSource final : public WeightSource {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointWeightSource>> Open(
      const std::string& dir, const CheckpointOpenOptions& options = {});

  ~CheckpointWeightSource() override;
  CheckpointWeightSource(const CheckpointWeightSource&) = delete;
  CheckpointWeightSource& operator=(const CheckpointWeightSource&) = delete;

  const ModelConfig& config() const override { return config_; }
  absl::StatusOr<std::vector<int64_t>> Shape(const std::string& name) const override;
  absl::Status ReadBlock(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                         int64_t cols, float* dst) const override;
  absl::Status ReadBlockBf16(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                             int64_t cols, uint16_t* dst) const override;
  bool StoredAsFp8(const std::string& name) const override;
  absl::Status ReadBlockFp8(const std::string& name, int64_t row0, int64_t rows, int64_t col0,
                            int64_t cols, uint8_t* dst, float* scale_dst) const override;
  // The path of the file that holds the tensor ("" when absent).
  std::string Location(const std::string& name) const override;

  // Every tensor name of every file (sorted), model tensors or not, `_scale_inv` included.
  std::vector<std::string> TensorNames() const;
  // The stored safetensors dtype of a tensor ("F8_E4M3", "BF16", ...); NotFound when absent.
  absl::StatusOr<std::string> StoredDType(const std::string& name) const;
  // Number of files mapped and the sum of their sizes (virtual, not resident, bytes).
  int num_files() const { return static_cast<int>(files_.size()); }
  uint64_t mapped_bytes() const;

  // Reports load progress to `callback` from the reading threads, one call at a time: when a
  // shard is done, and otherwise at most once a second while tensors are read. The model
  // tensors are those of ModelTensorSpecs(config()) (every tensor when none of them is
  // present). The clock starts here. Call before any read.
  void SetProgressCallback(LoadProgressCallback callback);
  LoadProgress progress() const;  // the counters now (zero without a callback)

 private:
  struct MappedFile;
  struct Entry;
  struct Progress;

  // Counts a first read of `e` (and of its FP8 scale) into the progress, and reports.
  void MarkRead(const Entry& e) const;

  CheckpointWeightSource();
  absl::Status AddFile(const std::string& path);
  void ResolveFp8();  // links each FP8 weight to its scale, or records why it cannot
  absl::StatusOr<const Entry*> Find(const std::string& name) const;
  // Decodes columns [col0, col0 + n) of stored row `row` of e into out[n] (float32).
  void DecodeRow(const Entry& e, int64_t row, int64_t col0, int64_t n, float* out) const;
  float ScaleAt(const Entry& scale, int64_t r, int64_t c) const;

  std::string dir_;
  ModelConfig config_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> by_name_;
  std::unique_ptr<Progress> progress_;  // null: no progress reporting
};

}  // namespace verifyd::tp
