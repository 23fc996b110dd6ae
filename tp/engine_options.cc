// Resolving the model EngineOptions names; see engine_options.h.
#include "tp/engine_options.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/status.h"
#include "tp/checkpoint_reader.h"
#include "tp/presets.h"

namespace verifyd::tp {

absl::StatusOr<EngineModel> ResolveEngineModel(const EngineOptions& o) {
  EngineModel m;
  if (o.source) {
    m.config = o.source->config();
    m.source = o.source;
  } else if (o.weights) {
    VERIFYD_RETURN_IF_ERROR(ValidateModelWeights(*o.weights));
    m.config = o.weights->config;
    // Not owned by the source: the deleter keeps the caller's weights alive with it.
    std::shared_ptr<const ModelWeights> keep = o.weights;
    m.source = std::shared_ptr<const WeightSource>(new InMemoryWeightSource(keep.get()),
                                                   [keep](const WeightSource* s) { delete s; });
    return m;
  } else if (o.config) {
    m.config = *o.config;
  } else {
    absl::StatusOr<ModelConfig> preset = PresetConfig(o.model, o.preset_layers);
    if (preset.ok()) {
      m.config = *std::move(preset);
    } else if (preset.status().code() != absl::StatusCode::kNotFound) {
      return preset.status();
    } else {
      std::error_code ec;
      if (!std::filesystem::is_directory(o.model, ec)) {
        return absl::InvalidArgumentError(
            absl::StrCat("model: '", o.model, "' is neither a preset (",
                         absl::StrJoin(PresetNames(), ", "), ") nor a checkpoint directory"));
      }
      // Header-only: validates every model tensor's file, dtype and shape, reads no data.
      VERIFYD_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWeightSource> ckpt,
                               CheckpointWeightSource::Open(o.model));
      m.config = ckpt->config();
      m.source = std::move(ckpt);
      return m;
    }
  }
  VERIFYD_RETURN_IF_ERROR(ValidateModelConfig(m.config));
  if (m.source)
    VERIFYD_RETURN_IF_ERROR(ValidateWeightSource(*m.source, ModelTensorSpecs(m.config)));
  return m;
}

const char* KvDtypeName(KvDtype d) { return d == KvDtype::kFp8 ? "fp8" : "auto"; }

absl::StatusOr<KvDtype> ParseKvDtype(const std::string& s) {
  if (s == "auto") return KvDtype::kAuto;
  if (s == "fp8") return KvDtype::kFp8;
  return absl::InvalidArgumentError(absl::StrCat("kv_dtype: '", s, "' is not one of auto, fp8"));
}

}  // namespace verifyd::tp
