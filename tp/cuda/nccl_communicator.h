// NCCL implementation of tp::Communicator for the CUDA backend: one communicator per rank
// (one GPU, one engine thread), created non-blocking (ncclConfig_t::blocking = 0) so that no
// NCCL call can wait forever: every call that answers ncclInProgress is polled with
// ncclCommGetAsyncError under a deadline, and on an error or a timeout the communicator is
// aborted (ncclCommAbort) and the call returns Unavailable. Aborting one rank marks the whole
// group failed: every other rank's next poll sees it, aborts its own communicator and
// answers Unavailable too (no rank waits on a dead peer).
//
// Buffers are device memory on the rank's device; `stream` is the rank's cudaStream_t.
// Collectives are enqueued on the stream (they return once enqueued); Synchronize(stream)
// waits for the stream with the same polling and deadline, which is how an engine step
// detects a hung or failed peer.
//
// Built without NCCL (VERIFYD_ENGINE_WITH_NCCL=0) the class exists but Available() is false
// and NewUniqueId / Create answer Unimplemented.
//
// Thread-safety: each NcclCommunicator is used by one thread (its rank's engine thread);
// Abort() and failed() may be called from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tp/cuda/device_communicator.h"

namespace verifyd::tp {

// Failure flag shared by the communicators of one group.
struct NcclGroupState {
  std::atomic<bool> failed{false};
};

class NcclCommunicator : public DeviceCommunicator {
 public:
  // True when this build has NCCL (tp > 1 possible on the CUDA engine).
  static bool Available();

  // A fresh ncclUniqueId, as bytes (created once, handed to every rank of the group).
  static absl::StatusOr<std::string> NewUniqueId();

  // Creates rank `rank` of a world_size group on `device`; call on the rank's own thread
  // (it sets the thread's current device). Waits at most timeout_ms for the other ranks to
  // join; then aborts and returns Unavailable (DeadlineExceeded text in the message).
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const std::string& unique_id, int rank, int world_size, int device, int timeout_ms,
      std::shared_ptr<NcclGroupState> group);

  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  int device() const { return device_; }

  // Sum over the ranks in place on the stream; dtype kFloat32 or kBFloat16. ncclAllReduce,
  // or after EnableRankOrderReduce an all-gather followed by SumInRankOrderCuda
  // (rank_order_sum.h): each element summed in rank order, whatever the message size (NCCL's
  // own reduction order depends on its algorithm and chunking, hence on the message size).
  absl::Status AllReduceSum(void* buf, size_t count, kernels::DType dtype, void* stream) override;
  // The batch-invariant mode's reduction: allocates a [world_size, max_bytes] gather buffer
  // on the rank's device (call on the rank's thread, before the first step); AllReduceSum of
  // more than max_bytes then answers InvalidArgument.
  absl::Status EnableRankOrderReduce(size_t max_bytes);
  // ncclAllGather of `bytes` bytes per rank (recv holds world_size * bytes).
  absl::Status AllGather(const void* send, void* recv, size_t bytes, void* stream) override;
  // Marks the group failed (any thread). Every rank's next collective or poll then aborts
  // its own communicator (ncclCommAbort, on the owner thread) and answers Unavailable.
  void Abort() override;

  // Waits until the stream's work is done, polling NCCL's async error and the group flag;
  // Unavailable after an error, an abort or timeout_ms.
  absl::Status Synchronize(void* stream) override;

  bool failed() const override;

 private:
  NcclCommunicator(void* comm, int rank, int world, int device, int timeout_ms,
                   std::shared_ptr<NcclGroupState> group);
  // Polls until the communicator is no longer ncclInProgress.
  absl::Status WaitReady(const char* what);
  // Aborts the local communicator once and sets the group flag; returns Unavailable(msg).
  absl::Status Fail(const std::string& msg);
  // The one NCCL error check: OK for ncclSuccess / ncclInProgress (a non-blocking call in
  // flight), else Fail("<call> failed: <NCCL error>"). `result` is an ncclResult_t.
  absl::Status FailOnError(int result, const char* call);

  void* comm_;  // ncclComm_t
  int rank_, world_, device_, timeout_ms_;
  void* gather_ = nullptr;  // EnableRankOrderReduce's [world, gather_bytes_] device buffer
  size_t gather_bytes_ = 0;
  std::shared_ptr<NcclGroupState> group_;
  std::atomic<bool> aborted_{false};
};

// Creates a whole group in this process, one communicator per device (rank r on devices[r]),
// initialising the ranks concurrently from temporary threads. For tests and tools; the CUDA
// engine creates each rank's communicator on the rank's own thread.
absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> CreateNcclGroup(
    const std::vector<int>& devices, int timeout_ms = 60000);

}  // namespace verifyd::tp
