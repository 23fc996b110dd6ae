// Streaming checkpoint reader (mmap, sharded safetensors, FP8 block scales); see
// checkpoint_reader.h.
#include "tp/checkpoint_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/common.h"
#include "kernels/status.h"
#include "tp/safetensors.h"
#include "tp/weights.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; the reader decodes it in place");

namespace verifyd::tp {
namespace {

// The index of the first e4m3 NaN code (0x7f / 0xff) in bytes[0, n), or n: eight bytes at a
// time (a byte of (w & 0x7f..) ^ 0x7f.. is zero exactly where w has a NaN code), so the check
// keeps up with the reads.
int64_t FirstFp8Nan(const uint8_t* bytes, int64_t n) {
  constexpr uint64_t k7f = 0x7f7f7f7f7f7f7f7full, k01 = 0x0101010101010101ull;
  constexpr uint64_t k80 = 0x8080808080808080ull;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    const uint64_t y = (w & k7f) ^ k7f;  // bytes <= 0x7f: the zero-byte test is exact
    if (((y - k01) & ~y & k80) != 0) break;
  }
  for (; i < n; ++i) {
    if ((bytes[i] & 0x7f) == 0x7f) return i;
  }
  return n;
}

using json = nlohmann::json;
namespace fs = std::filesystem;

enum class StoredType { kF32, kBF16, kF16, kF8E4M3, kOther };

// Element size of a safetensors dtype (0: unknown dtype).
size_t DTypeBytes(const std::string& d) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kSizes.find(d);
  return it == kSizes.end() ? 0 : it->second;
}

StoredType TypeOf(const std::string& d) {
  if (d == "F32") return StoredType::kF32;
  if (d == "BF16") return StoredType::kBF16;
  if (d == "F16") return StoredType::kF16;
  if (d == "F8_E4M3") return StoredType::kF8E4M3;
  return StoredType::kOther;
}

// float8_e4m3fn -> float for all 256 codes.
const std::array<float, 256>& Fp8Table() {
  static const std::array<float, 256> kTable = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = kernels::Fp8E4m3ToFloat(static_cast<uint8_t>(i));
    return t;
  }();
  return kTable;
}

inline uint16_t Le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return ss.str();
}

}  // namespace

absl::StatusOr<ModelConfig> ReadCheckpointConfig(const std::string& dir) {
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  VERIFYD_ASSIGN_OR_RETURN(std::string text, ReadTextFile(cfg_path));
  absl::StatusOr<ModelConfig> cfg = ParseModelConfigJson(text);
  if (!cfg.ok()) {
    return absl::Status(cfg.status().code(), absl::StrCat(cfg_path, ": ", cfg.status().message()));
  }
  fs::path p(dir);
  if (!p.has_filename()) p = p.parent_path();  // "dir/" -> "dir"
  cfg->name = p.filename().string();
  return cfg;
}

// One safetensors file, mapped read-only for the lifetime of the source.
struct CheckpointWeightSource::MappedFile {
  std::string path;
  const uint8_t* base = nullptr;  // the whole file
  uint64_t size = 0;
  uint64_t data_begin = 0;  // 8 + header length
  int fd = -1;              // kept open for large reads (CopyBytes)

  ~MappedFile() {
    if (base != nullptr) munmap(const_cast<uint8_t*>(base), size);
    if (fd >= 0) ::close(fd);
  }

  // Bytes [offset, offset + n) of the file into dst. Large ranges are read with pread by up
  // to kReadThreads threads (large sequential reads from the page cache or the disk, no page
  // faults on the mapping: several GB/s where faulting the mapping in gives ~1 GB/s); small
  // ones are copied from the mapping. *first_nan (when not null): the index of the first e4m3
  // NaN code in dst, or n, checked by each thread on its part while it is in cache.
  absl::Status CopyBytes(uint64_t offset, uint64_t n, uint8_t* dst,
                         uint64_t* first_nan = nullptr) const {
    constexpr uint64_t kPreadMin = uint64_t{4} << 20;
    constexpr int kReadThreads = 4;
    if (n < kPreadMin || fd < 0) {
      std::memcpy(dst, base + offset, n);
      if (first_nan != nullptr) {
        *first_nan = static_cast<uint64_t>(FirstFp8Nan(dst, static_cast<int64_t>(n)));
      }
      return absl::OkStatus();
    }
    auto read_range = [this](uint64_t off, uint64_t len, uint8_t* out) -> int {
      while (len > 0) {
        const ssize_t got = ::pread(fd, out, len, static_cast<off_t>(off));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return got < 0 ? errno : EIO;
        off += static_cast<uint64_t>(got);
        out += got;
        len -= static_cast<uint64_t>(got);
      }
      return 0;
    };
    const int threads = static_cast<int>(std::min<uint64_t>(kReadThreads, n / kPreadMin));
    const uint64_t part = (n + threads - 1) / threads;
    std::vector<int> errs(threads, 0);
    std::vector<uint64_t> nans(threads, n);
    auto work = [&](int t) {
      const uint64_t b = t * part, len = std::min(part, n - b);
      errs[t] = read_range(offset + b, len, dst + b);
      if (errs[t] == 0 && first_nan != nullptr) {
        const int64_t i = FirstFp8Nan(dst + b, static_cast<int64_t>(len));
        if (static_cast<uint64_t>(i) < len) nans[t] = b + static_cast<uint64_t>(i);
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (auto& th : pool) th.join();
    for (int e : errs) {
      if (e != 0) {
        return absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(e)));
      }
    }
    if (first_nan != nullptr) *first_nan = *std::min_element(nans.begin(), nans.end());
    return absl::OkStatus();
  }
};

// One tensor of one file.
struct CheckpointWeightSource::Entry {
  std::string name;
  std::string dtype;
  StoredType type = StoredType::kOther;
  size_t elem = 0;  // bytes per stored element
  int file = -1;
  std::vector<int64_t> shape;
  MatrixView view;
  uint64_t begin = 0, end = 0;             // data_offsets, relative to the data section
  int64_t scale = -1;                      // FP8: index of `<name>_scale_inv` in entries_
  int64_t block_rows = 0, block_cols = 0;  // FP8: rows / cols per scale
  absl::Status status;                     // why the tensor cannot be served (OK: servable)
};

struct CheckpointWeightSource::Progress {
  using Clock = std::chrono::steady_clock;
  LoadProgressCallback callback;
  Clock::time_point start;
  std::vector<uint8_t> model;              // per entry: a model tensor (or its scale)
  std::vector<uint64_t> file_model_bytes;  // per file
  std::mutex mu;                           // guards the members below
  std::vector<uint8_t> counted;            // per entry: read at least once
  std::vector<uint64_t> file_read_bytes;   // per file
  LoadProgress now;
  Clock::time_point last_report;
  bool reported = false;

  double Seconds(Clock::time_point t) const {
    return std::chrono::duration<double>(t - start).count();
  }
};

CheckpointWeightSource::CheckpointWeightSource() = default;
CheckpointWeightSource::~CheckpointWeightSource() = default;

absl::StatusOr<std::unique_ptr<CheckpointWeightSource>> CheckpointWeightSource::Open(
    const std::string& dir, const CheckpointOpenOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  }
  std::unique_ptr<CheckpointWeightSource> src(new CheckpointWeightSource());
  src->dir_ = dir;
  if (options.config.has_value()) {
    src->config_ = *options.config;
  } else {
    VERIFYD_ASSIGN_OR_RETURN(src->config_, ReadCheckpointConfig(dir));
  }

  // The files: the index's, or every *.safetensors.
  VERIFYD_ASSIGN_OR_RETURN(SafetensorsFiles listed, ListSafetensorsFiles(dir));
  for (const std::string& f : listed.paths) VERIFYD_RETURN_IF_ERROR(src->AddFile(f));

  // The index must agree with the headers.
  for (const auto& [name, file] : listed.weight_map) {
    const std::string path = (fs::path(dir) / file).string();
    auto it = src->by_name_.find(name);
    if (it == src->by_name_.end() || src->files_[src->entries_[it->second].file]->path != path) {
      return absl::InvalidArgumentError(absl::StrCat(listed.index_path, ": tensor '", name,
                                                     "' is mapped to ", path,
                                                     ", whose header does not list it"));
    }
  }
  src->ResolveFp8();
  if (options.validate_model_tensors) {
    if (absl::Status s = ValidateModelConfig(src->config_); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(dir, ": ", s.message()));
    }
    VERIFYD_RETURN_IF_ERROR(ValidateWeightSource(*src, ModelTensorSpecs(src->config_)));
  }
  return src;
}

absl::Status CheckpointWeightSource::AddFile(const std::string& path) {
  auto file = std::make_unique<MappedFile>();
  file->path = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(err)));
  }
  file->size = static_cast<uint64_t>(st.st_size);
  if (file->size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": shorter than 8 bytes"));
  }
  void* base = mmap(nullptr, file->size, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  file->fd = fd;  // kept for pread (CopyBytes); the destructor closes it
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot mmap ", path, ": ", std::strerror(err)));
  }
  file->base = static_cast<const uint8_t*>(base);
  const uint8_t* b = file->base;

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | b[i];
  if (header_len > file->size - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_len, " exceeds the file size ", file->size));
  }
  file->data_begin = 8 + header_len;
  const uint64_t data_size = file->size - file->data_begin;
  const json header = json::parse(reinterpret_cast<const char*>(b) + 8,
                                  reinterpret_cast<const char*>(b) + 8 + header_len, nullptr,
                                  /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  const int file_index = static_cast<int>(files_.size());
  files_.push_back(std::move(file));

  std::vector<size_t> added;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    Entry e;
    e.name = it.key();
    e.file = file_index;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", e.name, "': ", why));
    };
    const json& v = it.value();
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets") || !v["dtype"].is_string() || !v["shape"].is_array() ||
        !v["data_offsets"].is_array() || v["data_offsets"].size() != 2) {
      return bad("entry needs dtype (string), shape (array) and data_offsets ([begin, end])");
    }
    e.dtype = v["dtype"].get<std::string>();
    e.type = TypeOf(e.dtype);
    e.elem = DTypeBytes(e.dtype);
    // Every partial product must fit int64 (not only the total, which a zero dimension hides):
    // MatrixViewOf multiplies the trailing dimensions.
    int64_t numel = 1, trailing = 1;
    for (const json& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) return bad("shape has a bad dimension");
      const int64_t dim = d.get<int64_t>();
      if (!e.shape.empty() && __builtin_mul_overflow(trailing, dim, &trailing)) {
        return bad("shape overflows");
      }
      e.shape.push_back(dim);
      if (__builtin_mul_overflow(numel, dim, &numel)) return bad("shape overflows");
    }
    e.view = MatrixViewOf(e.shape);
    const json& offs = v["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
      return bad("data_offsets are not non-negative integers");
    }
    e.begin = offs[0].get<uint64_t>();
    e.end = offs[1].get<uint64_t>();
    uint64_t bytes = 0;
    if (e.end < e.begin) return bad("data_offsets end before they begin");
    if (e.elem != 0 &&
        (__builtin_mul_overflow(numel, e.elem, &bytes) || e.end - e.begin != bytes)) {
      return bad(absl::StrCat("data_offsets [", e.begin, ", ", e.end, ") hold ", e.end - e.begin,
                              " bytes, shape [", absl::StrJoin(e.shape, ", "), "] x ", e.dtype,
                              " needs ", numel, " x ", e.elem));
    }
    if (e.type == StoredType::kOther) {
      e.status =
          absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", e.name, "': dtype ", e.dtype,
                                                  " is not supported (F32, BF16, F16, F8_E4M3)"));
    }
    auto [pos, inserted] = by_name_.emplace(e.name, entries_.size());
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", e.name, "' is also in ",
                                                     files_[entries_[pos->second].file]->path,
                                                     " (a tensor in two files)"));
    }
    added.push_back(entries_.size());
    entries_.push_back(std::move(e));
  }
  // Truncation: the first tensor (in file order) whose data runs past the end of the file.
  std::sort(added.begin(), added.end(),
            [&](size_t a, size_t b) { return entries_[a].begin < entries_[b].begin; });
  for (size_t i : added) {
    const Entry& e = entries_[i];
    if (e.end > data_size) {
      return absl::DataLossError(absl::StrCat(
          path, ": truncated: tensor '", e.name, "' needs data bytes [", e.begin, ", ", e.end,
          ") but the file has ", data_size, " (", files_.back()->size, " bytes in all)"));
    }
  }
  return absl::OkStatus();
}

void CheckpointWeightSource::ResolveFp8() {
  const int64_t br = config_.quant.block_rows > 0 ? config_.quant.block_rows : 128;
  const int64_t bc = config_.quant.block_cols > 0 ? config_.quant.block_cols : 128;
  for (Entry& e : entries_) {
    if (e.type != StoredType::kF8E4M3) continue;
    const std::string& path = files_[e.file]->path;
    const std::string what = absl::StrCat(path, ": FP8 tensor '", e.name, "'");
    if (e.shape.size() != 2) {
      e.status = absl::InvalidArgumentError(absl::StrCat(what, " has shape [",
                                                         absl::StrJoin(e.shape, ", "),
                                                         "]; block-scaled FP8 weights are 2-D"));
      continue;
    }
    const std::string scale_name = e.name + "_scale_inv";
    auto it = by_name_.find(scale_name);
    if (it == by_name_.end()) {
      e.status =
          absl::InvalidArgumentError(absl::StrCat(what, " has no scale tensor '", scale_name, "'"));
      continue;
    }
    const Entry& s = entries_[it->second];
    const std::vector<int64_t> want = {(e.shape[0] + br - 1) / br, (e.shape[1] + bc - 1) / bc};
    if (s.type != StoredType::kF32 && s.type != StoredType::kBF16 && s.type != StoredType::kF16) {
      e.status = absl::InvalidArgumentError(absl::StrCat(what, ": scale '", scale_name, "' (",
                                                         files_[s.file]->path, ") has dtype ",
                                                         s.dtype, " (expected F32, BF16 or F16)"));
    } else if (s.shape != want) {
      e.status = absl::InvalidArgumentError(absl::StrCat(
          what, " [", absl::StrJoin(e.shape, ", "), "]: scale '", scale_name, "' (",
          files_[s.file]->path, ") has shape [", absl::StrJoin(s.shape, ", "), "], expected [",
          absl::StrJoin(want, ", "), "] for ", br, " x ", bc, " blocks"));
    } else {
      e.scale = static_cast<int64_t>(it->second);
      e.block_rows = br;
      e.block_cols = bc;
    }
  }
}

absl::StatusOr<const CheckpointWeightSource::Entry*> CheckpointWeightSource::Find(
    const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": tensor '", name, "' is missing (in no safetensors file)"));
  }
  const Entry& e = entries_[it->second];
  if (!e.status.ok()) return e.status;
  return &e;
}

absl::StatusOr<std::vector<int64_t>> CheckpointWeightSource::Shape(const std::string& name) const {
  VERIFYD_ASSIGN_OR_RETURN(const Entry* e, Find(name));
  return e->shape;
}

std::string CheckpointWeightSource::Location(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? "" : files_[entries_[it->second].file]->path;
}

std::vector<std::string> CheckpointWeightSource::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const Entry& e : entries_) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<std::string> CheckpointWeightSource::StoredDType(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": tensor '", name, "' is missing"));
  }
  return entries_[it->second].dtype;
}

uint64_t CheckpointWeightSource::mapped_bytes() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f->size;
  return n;
}

void CheckpointWeightSource::SetProgressCallback(LoadProgressCallback callback) {
  auto p = std::make_unique<Progress>();
  p->callback = std::move(callback);
  p->start = Progress::Clock::now();
  p->model.assign(entries_.size(), 0);
  bool any = false;
  for (const TensorSpec& spec : ModelTensorSpecs(config_)) {
    auto it = by_name_.find(spec.name);
    if (it == by_name_.end()) continue;
    any = true;
    p->model[it->second] = 1;
    const Entry& e = entries_[it->second];
    if (e.scale >= 0) p->model[static_cast<size_t>(e.scale)] = 1;
  }
  if (!any) p->model.assign(entries_.size(), 1);
  p->file_model_bytes.assign(files_.size(), 0);
  uint64_t total = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (!p->model[i]) continue;
    const uint64_t bytes = entries_[i].end - entries_[i].begin;
    p->file_model_bytes[static_cast<size_t>(entries_[i].file)] += bytes;
    total += bytes;
  }
  std::lock_guard<std::mutex> lock(p->mu);
  p->counted.assign(entries_.size(), 0);
  p->file_read_bytes.assign(files_.size(), 0);
  p->now.files_total = static_cast<int>(files_.size());
  p->now.files_done = static_cast<int>(
      std::count(p->file_model_bytes.begin(), p->file_model_bytes.end(), uint64_t{0}));
  p->now.bytes_total = total;
  progress_ = std::move(p);
}

LoadProgress CheckpointWeightSource::progress() const {
  if (!progress_) return LoadProgress();
  std::lock_guard<std::mutex> lock(progress_->mu);
  LoadProgress now = progress_->now;
  now.elapsed_s = progress_->Seconds(Progress::Clock::now());
  return now;
}

void CheckpointWeightSource::MarkRead(const Entry& e) const {
  if (!progress_) return;
  Progress& p = *progress_;
  std::lock_guard<std::mutex> lock(p.mu);
  bool shard_done = false;
  bool counted_any = false;
  auto count = [&](size_t i) {
    if (p.counted[i]) return;
    p.counted[i] = 1;
    if (!p.model[i]) return;
    counted_any = true;
    const Entry& x = entries_[i];
    const uint64_t bytes = x.end - x.begin;
    const size_t f = static_cast<size_t>(x.file);
    p.now.bytes_read += bytes;
    p.file_read_bytes[f] += bytes;
    if (p.file_read_bytes[f] == p.file_model_bytes[f]) {
      ++p.now.files_done;
      shard_done = true;
    }
  };
  count(static_cast<size_t>(&e - entries_.data()));
  if (e.scale >= 0) count(static_cast<size_t>(e.scale));
  if (!counted_any) return;
  const Progress::Clock::time_point now = Progress::Clock::now();
  if (!shard_done && p.reported && now - p.last_report < std::chrono::seconds(1)) return;
  p.reported = true;
  p.last_report = now;
  LoadProgress report = p.now;
  report.elapsed_s = p.Seconds(now);
  p.callback(report);
}

float CheckpointWeightSource::ScaleAt(const Entry& s, int64_t r, int64_t c) const {
  const MappedFile& f = *files_[s.file];
  const uint8_t* p = f.base + f.data_begin + s.begin + (r * s.view.cols + c) * s.elem;
  switch (s.type) {
    case StoredType::kF32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case StoredType::kBF16:
      return kernels::Bf16ToFloat(Le16(p));
    default:
      return HalfToFloat(Le16(p));
  }
}

void CheckpointWeightSource::DecodeRow(const Entry& e, int64_t row, int64_t col0, int64_t n,
                                       float* out) const {
  const MappedFile& f = *files_[e.file];
  const uint8_t* p = f.base + f.data_begin + e.begin + (row * e.view.cols + col0) * e.elem;
  switch (e.type) {
    case StoredType::kF32:
      std::memcpy(out, p, static_cast<size_t>(n) * sizeof(float));
      return;
    case StoredType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = kernels::Bf16ToFloat(Le16(p + 2 * i));
      return;
    case StoredType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(Le16(p + 2 * i));
      return;
    case StoredType::kF8E4M3: {
      const std::array<float, 256>& lut = Fp8Table();
      const Entry& s = entries_[static_cast<size_t>(e.scale)];
      const int64_t bc = e.block_cols;
      const int64_t srow = row / e.block_rows;
      for (int64_t c = col0; c < col0 + n;) {
        const int64_t block = c / bc;
        const int64_t seg_end = std::min(col0 + n, (block + 1) * bc);
        const float scale = ScaleAt(s, srow, block);
        for (; c < seg_end; ++c) out[c - col0] = lut[p[c - col0]] * scale;
      }
      return;
    }
    case StoredType::kOther:
      return;  // unreachable: Find() refuses unservable tensors
  }
}

absl::Status CheckpointWeightSource::ReadBlock(const std::string& name, int64_t row0, int64_t rows,
                                               int64_t col0, int64_t cols, float* dst) const {
  VERIFYD_ASSIGN_OR_RETURN(const Entry* e, Find(name));
  VERIFYD_RETURN_IF_ERROR(CheckBlock(absl::StrCat(files_[e->file]->path, ": tensor '", name, "'"),
                                     e->shape, row0, rows, col0, cols));
  MarkRead(*e);
  if (rows == 0 || cols == 0) return absl::OkStatus();
  for (int64_t r = 0; r < rows; ++r) DecodeRow(*e, row0 + r, col0, cols, dst + r * cols);
  return absl::OkStatus();
}

absl::Status CheckpointWeightSource::ReadBlockBf16(const std::string& name, int64_t row0,
                                                   int64_t rows, int64_t col0, int64_t cols,
                                                   uint16_t* dst) const {
  VERIFYD_ASSIGN_OR_RETURN(const Entry* e, Find(name));
  VERIFYD_RETURN_IF_ERROR(CheckBlock(absl::StrCat(files_[e->file]->path, ": tensor '", name, "'"),
                                     e->shape, row0, rows, col0, cols));
  MarkRead(*e);
  if (rows == 0 || cols == 0) return absl::OkStatus();
  if (e->type == StoredType::kBF16) {  // the stored bits, unchanged
    const MappedFile& f = *files_[e->file];
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (col0 == 0 && cols == e->view.cols) {  // whole rows: one contiguous range
      return f.CopyBytes(f.data_begin + e->begin + row0 * cols * 2,
                         static_cast<uint64_t>(rows * cols) * 2, reinterpret_cast<uint8_t*>(dst));
    }
#endif
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* p = f.base + f.data_begin + e->begin + ((row0 + r) * e->view.cols + col0) * 2;
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = Le16(p + 2 * c);
    }
    return absl::OkStatus();
  }
  // Decoded row by row; a large block by up to 4 threads, each its own rows.
  auto decode = [&](int64_t r_begin, int64_t r_end) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = r_begin; r < r_end; ++r) {
      DecodeRow(*e, row0 + r, col0, cols, row.data());
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = kernels::FloatToBf16(row[c]);
    }
  };
  const int threads = static_cast<int>(std::clamp<int64_t>(rows * cols / (int64_t{1} << 20), 1, 4));
  const int64_t per = (rows + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    pool.emplace_back(decode, std::min(rows, t * per), std::min(rows, (t + 1) * per));
  }
  decode(0, std::min(rows, per));
  for (auto& th : pool) th.join();
  return absl::OkStatus();
}

bool CheckpointWeightSource::StoredAsFp8(const std::string& name) const {
  auto found = Find(name);
  return found.ok() && (*found)->type == StoredType::kF8E4M3;
}

absl::Status CheckpointWeightSource::ReadBlockFp8(const std::string& name, int64_t row0,
                                                  int64_t rows, int64_t col0, int64_t cols,
                                                  uint8_t* dst, float* scale_dst) const {
  VERIFYD_ASSIGN_OR_RETURN(const Entry* e, Find(name));
  const std::string where = absl::StrCat(files_[e->file]->path, ": tensor '", name, "'");
  if (e->type != StoredType::kF8E4M3) {
    return absl::UnimplementedError(absl::StrCat(where, " is stored as ", e->dtype, ", not FP8"));
  }
  VERIFYD_RETURN_IF_ERROR(CheckBlock(where, e->shape, row0, rows, col0, cols));
  MarkRead(*e);
  // rows may end in a partial block only at the tensor's last row (kv_a_proj_with_mqa's 576).
  const bool rows_ok = rows % 128 == 0 || row0 + rows == e->shape[0];
  if (e->block_rows != 128 || e->block_cols != 128 || row0 % 128 != 0 || !rows_ok ||
      col0 % 128 != 0 || cols % 128 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": raw FP8 blocks need 128 x 128 scale blocks and a 128-aligned block (scale "
                     "blocks ",
                     e->block_rows, " x ", e->block_cols, ", block rows ", row0, "+", rows,
                     " cols ", col0, "+", cols, ")"));
  }
  const MappedFile& f = *files_[e->file];
  uint64_t nan = static_cast<uint64_t>(rows * cols);
  if (col0 == 0 && cols == e->view.cols) {  // whole rows: one contiguous range
    VERIFYD_RETURN_IF_ERROR(f.CopyBytes(f.data_begin + e->begin + row0 * cols,
                                        static_cast<uint64_t>(rows * cols), dst, &nan));
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* p = f.base + f.data_begin + e->begin + (row0 + r) * e->view.cols + col0;
      std::memcpy(dst + r * cols, p, static_cast<size_t>(cols));
    }
    nan = static_cast<uint64_t>(FirstFp8Nan(dst, rows * cols));
  }
  if (nan < static_cast<uint64_t>(rows * cols)) {
    const int64_t i = static_cast<int64_t>(nan);
    return absl::InvalidArgumentError(absl::StrCat(where, " element [", row0 + i / cols, ", ",
                                                   col0 + i % cols, "] is an FP8 NaN"));
  }
  const Entry& sc = entries_[e->scale];
  for (int64_t br = 0; br < (rows + 127) / 128; ++br) {
    for (int64_t bc = 0; bc < cols / 128; ++bc) {
      scale_dst[br * (cols / 128) + bc] = ScaleAt(sc, row0 / 128 + br, col0 / 128 + bc);
    }
  }
  return absl::OkStatus();
}

}  // namespace verifyd::tp
