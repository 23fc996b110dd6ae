#include "server/engine_factory.h"

#include <filesystem>
#include <memory>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/cuda_engine_module.h"
#include "server/toy_engine.h"
#include "spdlog/spdlog.h"
#include "tp/checkpoint_reader.h"
#include "tp/cpu/cpu_engine.h"
#include "tp/presets.h"

namespace verifyd::server {
namespace {

// The RankFaultHook for EngineSpec::testing_fault ("" = none).
absl::StatusOr<tp::RankFaultHook> FaultHook(const std::string& spec) {
  if (spec.empty() || absl::StartsWith(spec, "load:")) return tp::RankFaultHook();
  int rank = 0;
  int64_t value = 0;
  std::vector<std::string> parts = absl::StrSplit(spec, absl::ByAnyChar(":@"));
  if (parts.size() == 3 && parts[0] == "fail" && absl::SimpleAtoi(parts[1], &rank) &&
      absl::SimpleAtoi(parts[2], &value) && rank >= 0 && value >= 0) {
    return tp::RankFaultHook([rank, value](int r, int64_t step) -> absl::Status {
      if (r == rank && step >= value) return absl::InternalError("injected rank failure");
      return absl::OkStatus();
    });
  }
  if (parts.size() == 2 && parts[0] == "slow" && absl::SimpleAtoi(parts[1], &value) && value >= 0) {
    return tp::RankFaultHook([value](int r, int64_t) -> absl::Status {
      if (r == 0) absl::SleepFor(absl::Milliseconds(value));
      return absl::OkStatus();
    });
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--testing_fault: '", spec, "' is not fail:<rank>@<step>, slow:<ms> or load:<ms>"));
}

// --model naming a checkpoint directory (not a preset, no source / weights / config set): the
// directory is opened here, once (tp/checkpoint_reader.h: config.json and the safetensors
// headers, validated against the model's tensors; no weight data is read), logged, and handed
// to the engine as its source. A truncated file or a missing / mis-shaped tensor fails here,
// before serving, naming the file and the tensor. Anything else is left to the engine.
absl::StatusOr<tp::EngineOptions> WithCheckpointSource(const tp::EngineOptions& in,
                                                       const tp::LoadProgressCallback& progress) {
  tp::EngineOptions o = in;
  if (o.source || o.weights || o.config) return o;
  if (tp::PresetConfig(o.model, o.preset_layers).status().code() != absl::StatusCode::kNotFound) {
    return o;  // a preset (or a preset's own error)
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(o.model, ec)) return o;  // the engine names the error
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::unique_ptr<tp::CheckpointWeightSource>> src =
      tp::CheckpointWeightSource::Open(o.model);
  if (!src.ok()) {
    return absl::Status(src.status().code(), absl::StrCat("--model: checkpoint ", o.model, ": ",
                                                          src.status().message()));
  }
  spdlog::info(
      "checkpoint {}: {} safetensors file(s), {} bytes ({:.2f} GiB) mapped, read on demand; {} "
      "tensors; opened and validated in {:.2f} s",
      o.model, (*src)->num_files(), (*src)->mapped_bytes(),
      static_cast<double>((*src)->mapped_bytes()) / (1 << 30), (*src)->TensorNames().size(),
      absl::ToDoubleSeconds(absl::Now() - t0));
  if (progress) (*src)->SetProgressCallback(progress);
  o.source = *std::move(src);
  return o;
}

absl::StatusOr<std::unique_ptr<tp::Engine>> CreateCpu(const EngineSpec& spec) {
  auto hook = FaultHook(spec.testing_fault);
  if (!hook.ok()) return hook.status();
  if (absl::StartsWith(spec.testing_fault, "load:")) {
    int64_t ms = 0;
    if (!absl::SimpleAtoi(spec.testing_fault.substr(5), &ms) || ms < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--testing_fault: '", spec.testing_fault,
                                                     "' is not load:<ms> (a slow model load)"));
    }
    absl::SleepFor(absl::Milliseconds(ms));
  }
  absl::StatusOr<tp::EngineOptions> o = WithCheckpointSource(spec.engine, spec.on_load_progress);
  if (!o.ok()) return o.status();
  if (*hook) o->fault_hook = *std::move(hook);
  return tp::CreateCpuEngine(*o);
}

// The CUDA engine lives in a module loaded on demand (server/cuda_engine_module.h says why).
absl::StatusOr<std::unique_ptr<tp::Engine>> CreateCuda(const EngineSpec& spec) {
  auto module = LoadCudaEngineModule();
  if (!module.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--backend cuda: ", module.status().message(),
                     "; this build may lack CUDA (configure with the CUDA toolkit)"));
  }
  if (!(*module)->devices_available()) {
    return absl::UnavailableError("--backend cuda: no CUDA device is visible");
  }
  absl::StatusOr<tp::EngineOptions> o = WithCheckpointSource(spec.engine, spec.on_load_progress);
  if (!o.ok()) return o.status();
  absl::StatusOr<std::unique_ptr<tp::Engine>> engine =
      absl::UnknownError("the CUDA engine module returned nothing");
  (*module)->create(&*o, &engine);
  if (!engine.ok()) {
    // Passed through with its code (e.g. Unimplemented for a model feature the CUDA engine
    // lacks: MoE, FP8, YaRN), prefixed with the flag that chose the backend.
    return absl::Status(engine.status().code(),
                        absl::StrCat("--backend ", spec.backend, ": ", engine.status().message()));
  }
  return engine;
}

// Why --backend auto would not use the CUDA engine (OK: it would).
absl::Status CudaUsable() {
  auto module = LoadCudaEngineModule();
  if (!module.ok()) return module.status();
  if (!(*module)->devices_available()) {
    return absl::UnavailableError("no CUDA device is visible");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<tp::Engine>> CreateEngine(const EngineSpec& spec) {
  const tp::EngineOptions& e = spec.engine;
  if (e.tp < 1) return absl::InvalidArgumentError("--tp: must be >= 1");
  if (e.kv_slots < 2 || e.kv_slots > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError("--kv_slots: must be in [2, 2^31)");
  }
  if (e.limits.max_batch < 1) return absl::InvalidArgumentError("--max_batch: must be >= 1");
  if (!spec.testing_fault.empty() && spec.backend != "cpu") {
    return absl::InvalidArgumentError("--testing_fault: needs --backend cpu");
  }
  if (spec.backend == "cuda") return CreateCuda(spec);
  if (spec.backend == "auto") {
    const absl::Status cuda = CudaUsable();
    if (cuda.ok()) return CreateCuda(spec);
    spdlog::warn(
        "--backend auto: serving on the CPU reference backend (not for real model "
        "sizes): the CUDA engine is not usable: {}",
        std::string(cuda.message()));
    return CreateCpu(spec);
  }
  if (spec.backend == "cpu") return CreateCpu(spec);
  if (spec.backend == "toy") {
    testing::ToyEngineOptions o;
    o.kv_slots = e.kv_slots;
    o.max_batch = e.limits.max_batch;
    o.tp_size = e.tp;
    o.seed = e.seed;
    return std::unique_ptr<tp::Engine>(new testing::ToyEngine(o));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--backend: '", spec.backend, "' is not one of cpu, cuda, auto, toy"));
}

}  // namespace verifyd::server
