// Reading and writing safetensors files (https://github.com/huggingface/safetensors format:
// 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
// then the raw little-endian tensor bytes).
//
// The reader converts F32 / BF16 / F16 / F8_E4M3 (float8_e4m3fn, exactly) to float32 host
// tensors, remembering the stored dtype; the writer stores F32 or BF16. The reader reads whole
// files and knows no model: F8_E4M3 values come back as the raw codes' values, their
// `_scale_inv` as a separate tensor (tools, tests, reference logits). Models are loaded through
// the streaming reader (tp/checkpoint_reader.h), which applies the FP8 block scales.
// A checkpoint directory holds one or several shard files: model.safetensors.index.json
// ("weight_map": name -> file) when present, else every *.safetensors file in the directory.
// Thread-safety: free functions over caller-owned values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace verifyd::tp {

// A host tensor in float32, row-major.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  std::string dtype;  // the safetensors dtype it was read from ("F8_E4M3", ...); "" in memory
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

using TensorMap = std::map<std::string, HostTensor>;

enum class SafetensorsDType { kF32, kBF16 };

// Reads every tensor of one file (converted to float32). Errors name the file and tensor.
absl::StatusOr<TensorMap> ReadSafetensorsFile(const std::string& path);

// The safetensors files of a checkpoint directory. With model.safetensors.index.json: the
// files its weight_map names (each spelled once, normalised; a name outside the directory is
// InvalidArgument, a missing file NotFound) and weight_map itself (tensor -> file name);
// without: every *.safetensors file in name order. No file at all is NotFound.
struct SafetensorsFiles {
  std::vector<std::string> paths;                 // dir / file
  std::map<std::string, std::string> weight_map;  // the index's (empty without one)
  std::string index_path;                         // dir / the index file ("" without one)
};
absl::StatusOr<SafetensorsFiles> ListSafetensorsFiles(const std::string& dir);

// The index file's name in a checkpoint directory.
inline constexpr char kSafetensorsIndexName[] = "model.safetensors.index.json";

// Reads all tensors of a checkpoint directory (ListSafetensorsFiles); a tensor present in two
// files is InvalidArgument.
absl::StatusOr<TensorMap> ReadSafetensorsDirectory(const std::string& dir);

// Writes tensors into one file (names in map order). BF16 rounds to nearest even.
absl::Status WriteSafetensorsFile(const std::string& path, const TensorMap& tensors,
                                  SafetensorsDType dtype);

// Writes tensors into dir as model-0000i-of-0000n.safetensors shards of at most
// max_shard_bytes each (at least one tensor per shard) plus model.safetensors.index.json;
// max_shard_bytes <= 0 writes a single model.safetensors and no index.
absl::Status WriteSafetensorsDirectory(const std::string& dir, const TensorMap& tensors,
                                       SafetensorsDType dtype, int64_t max_shard_bytes = 0);

// IEEE half -> float (for F16 checkpoints).
float HalfToFloat(uint16_t h);

}  // namespace verifyd::tp
