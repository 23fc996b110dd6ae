// The communicator interface of the CUDA engine: tp::Communicator over device buffers and a
// rank's cudaStream_t, plus the stream wait with a deadline that an engine step ends with.
// Implementations:
//   NcclCommunicator      (tp/cuda/nccl_communicator.h): one GPU per rank, NCCL.
//   LoopbackCommunicator  (tp/cuda/loopback_communicator.h): N ranks sharing one GPU in one
//                         process, for testing tensor parallelism without several GPUs.
// Thread-safety: each object is used by its rank's engine thread; Abort() and failed() may be
// called from any thread.
#pragma once

#include "absl/status/status.h"
#include "tp/communicator.h"

namespace verifyd::tp {

class DeviceCommunicator : public Communicator {
 public:
  // Waits until the stream's work is done; Unavailable after a group failure, an abort or
  // the communicator's timeout (a hung peer).
  virtual absl::Status Synchronize(void* stream) = 0;
  // Whether the group has failed (a rank aborted it or a collective timed out).
  virtual bool failed() const = 0;
};

}  // namespace verifyd::tp
