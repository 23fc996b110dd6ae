// WeightSource helpers and the in-memory source; see weight_source.h.
#include "tp/weight_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/common.h"
#include "kernels/status.h"

namespace verifyd::tp {
namespace {

// "path: tensor 'x'" or "tensor 'x'".
std::string Describe(const WeightSource& source, const std::string& name) {
  const std::string where = source.Location(name);
  return where.empty() ? absl::StrCat("tensor '", name, "'")
                       : absl::StrCat(where, ": tensor '", name, "'");
}

// Checks the block rows [row0, +rows) x cols [col0, +cols) of in-memory tensor `name`, then
// calls row(r, src) for each of its rows, src pointing at that row's first float in `t`.
template <typename Row>
absl::Status ForEachBlockRow(const std::string& name, const HostTensor& t, int64_t row0,
                             int64_t rows, int64_t col0, int64_t cols, Row row) {
  VERIFYD_RETURN_IF_ERROR(
      CheckBlock(absl::StrCat("tensor '", name, "'"), t.shape, row0, rows, col0, cols));
  if (rows == 0 || cols == 0) return absl::OkStatus();
  const int64_t full_cols = MatrixViewOf(t.shape).cols;
  for (int64_t r = 0; r < rows; ++r) row(r, t.data.data() + (row0 + r) * full_cols + col0);
  return absl::OkStatus();
}

}  // namespace

MatrixView MatrixViewOf(const std::vector<int64_t>& shape) {
  if (shape.empty()) return {1, 1};
  if (shape.size() == 1) return {1, shape[0]};
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  return {shape[0], cols};
}

absl::Status CheckBlock(const std::string& what, const std::vector<int64_t>& shape, int64_t row0,
                        int64_t rows, int64_t col0, int64_t cols) {
  const MatrixView m = MatrixViewOf(shape);
  if (row0 < 0 || rows < 0 || col0 < 0 || cols < 0 || row0 > m.rows || rows > m.rows - row0 ||
      col0 > m.cols || cols > m.cols - col0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": block rows [", row0, ", +", rows, ") x cols [", col0, ", +", cols,
                     ") is outside shape [", absl::StrJoin(shape, ", "), "] (read as [", m.rows,
                     ", ", m.cols, "])"));
  }
  return absl::OkStatus();
}

InMemoryWeightSource::InMemoryWeightSource(const ModelWeights* weights) : w_(weights) {}

InMemoryWeightSource::InMemoryWeightSource(ModelWeights weights)
    : owned_(std::move(weights)), w_(&owned_) {}

absl::StatusOr<const HostTensor*> InMemoryWeightSource::Find(const std::string& name) const {
  const HostTensor* t = w_->Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("weights: tensor '", name, "' is missing"));
  }
  if (static_cast<int64_t>(t->data.size()) != t->numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: tensor '", name, "' data size does not match its shape"));
  }
  return t;
}

absl::StatusOr<std::vector<int64_t>> InMemoryWeightSource::Shape(const std::string& name) const {
  VERIFYD_ASSIGN_OR_RETURN(const HostTensor* t, Find(name));
  return t->shape;
}

absl::Status InMemoryWeightSource::ReadBlock(const std::string& name, int64_t row0, int64_t rows,
                                             int64_t col0, int64_t cols, float* dst) const {
  VERIFYD_ASSIGN_OR_RETURN(const HostTensor* t, Find(name));
  return ForEachBlockRow(name, *t, row0, rows, col0, cols, [&](int64_t r, const float* src) {
    std::memcpy(dst + r * cols, src, static_cast<size_t>(cols) * sizeof(float));
  });
}

absl::Status InMemoryWeightSource::ReadBlockBf16(const std::string& name, int64_t row0,
                                                 int64_t rows, int64_t col0, int64_t cols,
                                                 uint16_t* dst) const {
  VERIFYD_ASSIGN_OR_RETURN(const HostTensor* t, Find(name));
  return ForEachBlockRow(name, *t, row0, rows, col0, cols, [&](int64_t r, const float* src) {
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = kernels::FloatToBf16(src[c]);
  });
}

absl::Status ValidateWeightSource(const WeightSource& source,
                                  const std::vector<TensorSpec>& specs) {
  for (const TensorSpec& spec : specs) {
    absl::StatusOr<std::vector<int64_t>> shape = source.Shape(spec.name);
    if (!shape.ok()) return shape.status();
    if (*shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(Describe(source, spec.name), " has shape [",
                                                     absl::StrJoin(*shape, ", "), "], expected [",
                                                     absl::StrJoin(spec.shape, ", "), "]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadFiniteBlock(const WeightSource& source, const std::string& name, int64_t row0,
                             int64_t rows, int64_t col0, int64_t cols, float* dst) {
  VERIFYD_RETURN_IF_ERROR(source.ReadBlock(name, row0, rows, col0, cols, dst));
  const int64_t n = rows * cols;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(dst[i])) {
      return absl::InvalidArgumentError(absl::StrCat(Describe(source, name), " element [",
                                                     row0 + i / cols, ", ", col0 + i % cols,
                                                     "] is not finite (", dst[i], ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status AppendFiniteBlock(const WeightSource& source, const std::string& name, int64_t row0,
                               int64_t rows, int64_t col0, int64_t cols, std::vector<float>* out) {
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(std::max<int64_t>(rows * cols, 0)));
  return ReadFiniteBlock(source, name, row0, rows, col0, cols, out->data() + at);
}

absl::StatusOr<HostTensor> ReadTensor(const WeightSource& source, const std::string& name) {
  HostTensor t;
  VERIFYD_ASSIGN_OR_RETURN(t.shape, source.Shape(name));
  const MatrixView m = MatrixViewOf(t.shape);
  t.data.resize(static_cast<size_t>(m.rows * m.cols));
  VERIFYD_RETURN_IF_ERROR(source.ReadBlock(name, 0, m.rows, 0, m.cols, t.data.data()));
  return t;
}

absl::StatusOr<ModelWeights> LoadModelWeights(const WeightSource& source) {
  ModelWeights w;
  w.config = source.config();
  VERIFYD_RETURN_IF_ERROR(ValidateModelConfig(w.config));
  VERIFYD_RETURN_IF_ERROR(ValidateWeightSource(source, ModelTensorSpecs(w.config)));
  for (const TensorSpec& spec : ModelTensorSpecs(w.config)) {
    VERIFYD_ASSIGN_OR_RETURN(HostTensor t, ReadTensor(source, spec.name));
    w.tensors.emplace(spec.name, std::move(t));
  }
  VERIFYD_RETURN_IF_ERROR(ValidateModelWeights(w));
  return w;
}

}  // namespace verifyd::tp
