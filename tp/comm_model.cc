#include "tp/comm_model.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace verifyd::tp {

CommModel NvlinkH200x8() {
  CommModel m;
  m.name = "nvlink4-nvswitch-8gpu-nccl-no-nvls";
  m.source =
      "nccl-tests busbw on 8 H100/H200 SXM (NVLink 4, NVSwitch), NVLS off: all-reduce and "
      "all-gather 370 GB/s (NCCL_ALGO=RING all_reduce_perf, 2-4 GB: "
      "https://github.com/NVIDIA/nccl/issues/1455; NCCL maintainer's intra-node figure: "
      "https://github.com/NVIDIA/nccl-tests/issues/212, "
      "https://github.com/NVIDIA/nccl/issues/1442); latency 25 us per call (8x H100 "
      "all_reduce_perf at 1-8 KB, NVLS forced, 25.6-27.0 us: "
      "https://github.com/Azure/AI-benchmarking-guide Azure_Results/ND_H100_v5_results.md; "
      "all-gather taken equal)";
  // Small-message latency: ~25 us per call at 1-8 KB (Azure ND H100 v5, NVLS forced; the
  // slow side of NCCL's small-message paths). See tp/comm_model.h.
  m.all_reduce_latency_us = 25.0;
  // Large-message busbw without NVLS: ring all-reduce on 8x H100 SXM, 2-4 GB, 365-370 GB/s.
  m.all_reduce_bus_gbps = 370.0;
  // Assumed equal to the all-reduce latency (no public small all_gather_perf table found).
  m.all_gather_latency_us = 25.0;
  // NCCL's intra-node busbw target for non-all-reduce collectives on 8x H100: 370 GB/s.
  m.all_gather_bus_gbps = 370.0;
  m.world = 8;
  return m;
}

namespace {

absl::Status CheckNonNegative(const char* field, double v) {
  if (std::isfinite(v) && v >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("CommModel.", field, " must be >= 0, got ", v));
}

absl::Status CheckPositive(const char* field, double v) {
  if (std::isfinite(v) && v > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("CommModel.", field, " must be > 0, got ", v));
}

}  // namespace

absl::Status ValidateCommModel(const CommModel& model, const std::vector<CollectiveCall>& calls) {
  if (model.world < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CommModel.world must be >= 1, got ", model.world));
  }
  for (absl::Status s : {CheckNonNegative("all_reduce_latency_us", model.all_reduce_latency_us),
                         CheckPositive("all_reduce_bus_gbps", model.all_reduce_bus_gbps),
                         CheckNonNegative("all_gather_latency_us", model.all_gather_latency_us),
                         CheckPositive("all_gather_bus_gbps", model.all_gather_bus_gbps)}) {
    if (!s.ok()) return s;
  }
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("calls[", i, "].bytes must be >= 0, got ", calls[i].bytes));
    }
  }
  return absl::OkStatus();
}

double ModeledSeconds(const CommModel& model, const CollectiveCall& call) {
  if (model.world <= 1) return 0.0;
  const double n = model.world;
  const double bytes = static_cast<double>(call.bytes);
  switch (call.kind) {
    case CollectiveKind::kAllReduce:
      return model.all_reduce_latency_us * 1e-6 +
             2.0 * (n - 1) / n * bytes / (model.all_reduce_bus_gbps * 1e9);
    case CollectiveKind::kAllGather:
      return model.all_gather_latency_us * 1e-6 +
             (n - 1) / n * (n * bytes) / (model.all_gather_bus_gbps * 1e9);
  }
  return 0.0;
}

double ModeledSeconds(const CommModel& model, const std::vector<CollectiveCall>& calls) {
  double total = 0.0;
  for (const CollectiveCall& c : calls) total += ModeledSeconds(model, c);
  return total;
}

}  // namespace verifyd::tp
