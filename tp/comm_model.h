// A latency + bandwidth model of the time a tensor-parallel collective takes on one host of
// 8 NVLink GPUs, for benchmark reports of a single rank run alone (the other ranks absent):
// the rank's collectives are recorded (kind, bytes) instead of run, and this model turns them
// into seconds that the report adds to the measured step.
//
// Convention: NCCL-tests bus bandwidth (busbw, https://github.com/NVIDIA/nccl-tests,
// doc/PERFORMANCE.md). For N ranks, a small-message latency `lat` and a large-message busbw B:
//   all-reduce of a `bytes` buffer:            t = lat + 2(N-1)/N * bytes / B
//   all-gather of `bytes` sent by each rank:   t = lat + (N-1)/N * (N * bytes) / B
// and t = 0 at N = 1 (no communication). bytes = 0 costs the latency alone.
//
// The constants of NvlinkH200x8() (public nccl-tests measurements, 8 H100/H200 SXM GPUs,
// NVLink 4 through NVSwitch; GB/s = 1e9 bytes/s as nccl-tests prints it):
// - all-reduce busbw 370 GB/s, NVLS (NVLink SHARP) off: NCCL_ALGO=RING all_reduce_perf on
//   8x H100 SXM, 2-4 GB messages, busbw 365-370 GB/s
//   (https://github.com/NVIDIA/nccl/issues/1455). NCCL's maintainer gives the same figure as
//   the intra-node NVLink target (~80 % of the 450 GB/s line rate) for ring all-reduce and
//   every non-all-reduce collective (https://github.com/NVIDIA/nccl-tests/issues/212,
//   https://github.com/NVIDIA/nccl/issues/1442). With NVLS on, all-reduce reaches ~480 GB/s
//   busbw on 8 GPUs (same threads; 478.9 GB/s at 8 GB on 8x H100 and 480.0 on 8x H200 in
//   https://github.com/Azure/AI-benchmarking-guide, Azure_Results/ND_H*_v5_results.md): not
//   taken (the non-NVLS figure is the one used).
// - all-gather busbw 370 GB/s, NVLS off: the maintainer's figure above for non-all-reduce
//   collectives on 8x H100 (no public all_gather_perf table of 8 H100/H200 was found).
// - all-reduce latency 25 us: the only public 8x H100 SXM all_reduce_perf table with small
//   messages found (Azure ND H100 v5, NCCL 2.18.5, in-place, 8 GPUs, NCCL_ALGO=NVLS forced by
//   its Benchmarks/NVIDIA/NCCLBandwidth.py) prints busbw 0.07 / 0.14 / 0.27 / 0.53 GB/s at
//   1 / 2 / 4 / 8 KB, i.e. 25.6-27.0 us per call; 8x H200 (ND H200 v5, NCCL 2.20.5): 0.06 GB/s
//   at 1 KB = 29.9 us. These are NVLS figures (no non-NVLS small-message table of 8 H100/H200
//   was found); NCCL's default for small messages (ring/tree, LL protocol) is faster, so this
//   latency errs on the slow side.
// - all-gather latency 25 us: taken equal to the all-reduce one (no public small-message
//   all_gather_perf table of 8 H100/H200 was found; a ring all-gather has N-1 steps against
//   the all-reduce's 2(N-1), so this too errs on the slow side).
// A real step's messages (hundreds of KB to ~100 MB) do not all reach the large-message
// bandwidth; lat + bytes / B covers that to first order only. Against the Azure 8x H100 curve
// above (NVLS): 1 MiB measured 42.0 us, modeled 30.0 us; 16 MiB measured 125.2 us, modeled
// 104.4 us; 64 MiB measured 324.6 us, modeled 342.4 us.
//
// Thread-safety: pure functions on values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace verifyd::tp {

enum class CollectiveKind { kAllReduce, kAllGather };

// One collective of one rank. all-reduce: the buffer's bytes; all-gather: each rank's send
// bytes (the received buffer is world x bytes).
struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int64_t bytes = 0;
};

// Latencies in microseconds, bus bandwidths in GB/s (1e9 bytes/s, nccl-tests busbw).
struct CommModel {
  std::string name, source;
  double all_reduce_latency_us = 0, all_reduce_bus_gbps = 0;
  double all_gather_latency_us = 0, all_gather_bus_gbps = 0;
  int world = 1;
};

// 8 H100/H200 SXM GPUs on NVLink 4 / NVSwitch, NCCL without NVLS (constants and sources in
// the comment above; `source` carries them in one line for reports).
CommModel NvlinkH200x8();

// InvalidArgument naming the field: world >= 1, latencies >= 0, bandwidths > 0 (all finite),
// and every calls[i].bytes >= 0. ModeledSeconds requires inputs that pass this.
absl::Status ValidateCommModel(const CommModel& model,
                               const std::vector<CollectiveCall>& calls = {});

// Seconds one collective takes under the model (0 at world 1).
double ModeledSeconds(const CommModel& model, const CollectiveCall& call);

// Sum over the calls.
double ModeledSeconds(const CommModel& model, const std::vector<CollectiveCall>& calls);

}  // namespace verifyd::tp
