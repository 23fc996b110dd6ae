// safetensors reader/writer; see safetensors.h.
#include "tp/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/common.h"

namespace verifyd::tp {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("error reading ", path));
  return data;
}

uint64_t ReadLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: value = mant * 2^-24
      const float f = static_cast<float>(mant) * (1.0f / 16777216.0f);
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

absl::StatusOr<TensorMap> ReadSafetensorsFile(const std::string& path) {
  absl::StatusOr<std::string> file = ReadWholeFile(path);
  if (!file.ok()) return file.status();
  const std::string& d = *file;
  if (d.size() < 8) return absl::InvalidArgumentError(absl::StrCat(path, ": shorter than 8 bytes"));
  const uint64_t header_len = ReadLe64(d.data());
  if (header_len > d.size() - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_len, " exceeds the file size"));
  }
  json header = json::parse(d.begin() + 8, d.begin() + 8 + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  const size_t data_begin = 8 + header_len;
  const size_t data_size = d.size() - data_begin;
  TensorMap out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const json& e = it.value();
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", name, "': ", why));
    };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets")) {
      return bad("entry needs dtype, shape and data_offsets");
    }
    if (!e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() ||
        e["data_offsets"].size() != 2) {
      return bad("malformed entry");
    }
    const std::string dtype = e["dtype"].get<std::string>();
    size_t elem = 0;
    if (dtype == "F32") {
      elem = 4;
    } else if (dtype == "BF16" || dtype == "F16") {
      elem = 2;
    } else if (dtype == "F8_E4M3") {
      elem = 1;
    } else {
      return absl::UnimplementedError(absl::StrCat(path, ": tensor '", name, "': dtype ", dtype,
                                                   " (supported: F32, BF16, F16, F8_E4M3)"));
    }
    HostTensor t;
    t.dtype = dtype;
    for (const json& s : e["shape"]) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0) return bad("bad shape");
      t.shape.push_back(s.get<int64_t>());
    }
    const json& offs = e["data_offsets"];
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      return bad("bad data_offsets");
    const uint64_t b = offs[0].get<uint64_t>(), en = offs[1].get<uint64_t>();
    const uint64_t n = static_cast<uint64_t>(t.numel());
    if (en < b || en > data_size || en - b != n * elem) {
      return bad(absl::StrCat("data_offsets [", b, ", ", en, ") do not match shape x ", elem,
                              " bytes within ", data_size, " data bytes"));
    }
    t.data.resize(n);
    const char* src = d.data() + data_begin + b;
    if (dtype == "F32") {
      std::memcpy(t.data.data(), src, n * 4);
    } else if (dtype == "F8_E4M3") {
      for (uint64_t i = 0; i < n; ++i) {
        t.data[i] = kernels::Fp8E4m3ToFloat(static_cast<uint8_t>(src[i]));
      }
    } else {
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t v = static_cast<uint16_t>(static_cast<unsigned char>(src[2 * i]) |
                                                 (static_cast<unsigned char>(src[2 * i + 1]) << 8));
        t.data[i] = dtype == "BF16" ? kernels::Bf16ToFloat(v) : HalfToFloat(v);
      }
    }
    out.emplace(name, std::move(t));
  }
  return out;
}

absl::StatusOr<SafetensorsFiles> ListSafetensorsFiles(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory"));
  SafetensorsFiles out;
  const fs::path index_path = fs::path(dir) / kSafetensorsIndexName;
  if (fs::exists(index_path, ec)) {
    absl::StatusOr<std::string> text = ReadWholeFile(index_path.string());
    if (!text.ok()) return text.status();
    json j = json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": not JSON with a 'weight_map' object"));
    }
    std::set<std::string> unique;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path.string(), ": weight_map['", it.key(), "'] is not a file name"));
      }
      // One spelling per file ("a.safetensors" and "./a.safetensors" are the same file).
      const std::string file = fs::path(it.value().get<std::string>()).lexically_normal().string();
      const fs::path rel(file);
      if (file.empty() || rel.is_absolute() ||
          std::any_of(rel.begin(), rel.end(), [](const fs::path& c) { return c == ".."; })) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": tensor '", it.key(),
                                                       "' is mapped to '", file,
                                                       "', not a file of the directory"));
      }
      if (unique.insert(file).second && !fs::is_regular_file(fs::path(dir) / file, ec)) {
        return absl::NotFoundError(
            absl::StrCat(index_path.string(), ": tensor '", it.key(), "' is mapped to file ",
                         (fs::path(dir) / file).string(), ", which does not exist"));
      }
      out.weight_map[it.key()] = file;
    }
    for (const std::string& f : unique) out.paths.push_back((fs::path(dir) / f).string());
    out.index_path = index_path.string();
  } else {
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".safetensors") out.paths.push_back(entry.path().string());
    }
    std::sort(out.paths.begin(), out.paths.end());
  }
  if (out.paths.empty()) return absl::NotFoundError(absl::StrCat(dir, ": no *.safetensors files"));
  return out;
}

absl::StatusOr<TensorMap> ReadSafetensorsDirectory(const std::string& dir) {
  absl::StatusOr<SafetensorsFiles> listed = ListSafetensorsFiles(dir);
  if (!listed.ok()) return listed.status();
  const std::vector<std::string>& files = listed->paths;
  TensorMap all;
  for (const std::string& f : files) {
    absl::StatusOr<TensorMap> part = ReadSafetensorsFile(f);
    if (!part.ok()) return part.status();
    for (auto& [name, t] : *part) {
      if (all.count(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, ": tensor '", name, "' appears in more than one file (", f, ")"));
      }
      all.emplace(name, std::move(t));
    }
  }
  return all;
}

absl::Status WriteSafetensorsFile(const std::string& path, const TensorMap& tensors,
                                  SafetensorsDType dtype) {
  const size_t elem = dtype == SafetensorsDType::kF32 ? 4 : 2;
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (static_cast<int64_t>(t.data.size()) != t.numel()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': data size ", t.data.size(), " != shape product ", t.numel()));
    }
    const uint64_t bytes = t.data.size() * elem;
    header[name] = {{"dtype", dtype == SafetensorsDType::kF32 ? "F32" : "BF16"},
                    {"shape", t.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string h = header.dump();
  while ((8 + h.size()) % 8 != 0) h.push_back(' ');  // align the data section
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path));
  char len[8];
  uint64_t hl = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((hl >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  std::vector<char> buf;
  for (const auto& [name, t] : tensors) {
    buf.resize(t.data.size() * elem);
    if (dtype == SafetensorsDType::kF32) {
      std::memcpy(buf.data(), t.data.data(), buf.size());
    } else {
      for (size_t i = 0; i < t.data.size(); ++i) {
        const uint16_t v = kernels::FloatToBf16(t.data[i]);
        buf[2 * i] = static_cast<char>(v & 0xff);
        buf[2 * i + 1] = static_cast<char>(v >> 8);
      }
    }
    out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

absl::Status WriteSafetensorsDirectory(const std::string& dir, const TensorMap& tensors,
                                       SafetensorsDType dtype, int64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  if (max_shard_bytes <= 0) {
    return WriteSafetensorsFile((fs::path(dir) / "model.safetensors").string(), tensors, dtype);
  }
  const int64_t elem = dtype == SafetensorsDType::kF32 ? 4 : 2;
  std::vector<TensorMap> shards(1);
  int64_t cur = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t bytes = t.numel() * elem;
    if (!shards.back().empty() && cur + bytes > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().emplace(name, t);
    cur += bytes;
  }
  json weight_map = json::object();
  const size_t n = shards.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string file = absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
    if (absl::Status s = WriteSafetensorsFile((fs::path(dir) / file).string(), shards[i], dtype);
        !s.ok()) {
      return s;
    }
    for (const auto& kv : shards[i]) weight_map[kv.first] = file;
  }
  json index = {{"metadata", json::object()}, {"weight_map", weight_map}};
  std::ofstream out((fs::path(dir) / kSafetensorsIndexName).string(), std::ios::trunc);
  out << index.dump(2);
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing the index in ", dir));
  return absl::OkStatus();
}

}  // namespace verifyd::tp
