// A stand-in communicator for one tensor-parallel rank run alone (EngineOptions::cuda.
// slice_rank): the rank's collectives keep its data flowing and are recorded (kind and
// bytes) instead of exchanged, so a benchmark can time rank R of TP N on one GPU and add a
// modeled communication time (tp/comm_model.h). Its results are NOT the model's: the other
// ranks' shares are absent (zeros). For numbers, never for serving.
//
//   AllReduceSum: the reduction's local arithmetic as the real rank does it: with the rank-order
//                 reduction (batch-invariant steps: NCCL all-gathers the fp32 partials and
//                 sums them in rank order, nccl_communicator.h) the same sum kernel over this
//                 rank's buffer and world - 1 zero buffers (recorded as an all-gather of the
//                 buffer); without it nothing (recorded as an all-reduce). The buffer keeps
//                 this rank's own partial sums.
//   AllGather:    this rank's slot of recv is its send (a device copy); the other slots are
//                 zeroed once (then keep whatever this rank wrote there before: finite).
//
// Thread-safety: used by its rank's thread; TakeRecords / Abort / failed from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "tp/comm_model.h"
#include "tp/cuda/device_communicator.h"

namespace verifyd::tp {

class RecordingCommunicator : public DeviceCommunicator {
 public:
  // Rank `rank` of `world` (world in [2, kMaxRankOrderSources]) on `device` (call on the
  // rank's thread). rank_order_max_bytes > 0: AllReduceSum is the rank-order reduction of up
  // to that many bytes (a zero buffer of that size is allocated); 0: a plain all-reduce.
  static absl::StatusOr<std::unique_ptr<RecordingCommunicator>> Create(int rank, int world,
                                                                       int device,
                                                                       size_t rank_order_max_bytes,
                                                                       int timeout_ms);
  ~RecordingCommunicator() override;
  RecordingCommunicator(const RecordingCommunicator&) = delete;
  RecordingCommunicator& operator=(const RecordingCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  absl::Status AllReduceSum(void* buf, size_t count, kernels::DType dtype, void* stream) override;
  absl::Status AllGather(const void* send, void* recv, size_t bytes, void* stream) override;
  void Abort() override;
  absl::Status Synchronize(void* stream) override;
  bool failed() const override;

  // The collectives recorded since the last call, in call order.
  std::vector<CollectiveCall> TakeRecords();

 private:
  RecordingCommunicator(int rank, int world, int device, int timeout_ms);
  void Record(CollectiveKind kind, size_t bytes);

  const int rank_;
  const int world_;
  const int device_;
  const int timeout_ms_;
  void* zeros_ = nullptr;  // rank-order mode: rank_order_bytes_ zero bytes
  size_t rank_order_bytes_ = 0;
  std::map<void*, size_t> zeroed_;  // AllGather recv buffers: bytes zeroed from the start
  mutable std::mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<CollectiveCall> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace verifyd::tp
