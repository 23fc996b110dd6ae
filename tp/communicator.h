// Collectives among the tensor-parallel ranks of one host.
//
// One Communicator object per rank; each rank's engine thread calls the collectives in the
// same order (the usual NCCL contract). Buffers live where the backend computes: host memory
// for the CPU backend (InProcessCommunicator), device memory for the CUDA backend
// (NcclCommunicator, tp/cuda/nccl_communicator.h, with `stream` a cudaStream_t).
//
// Results are identical on every rank (sums are taken in rank order), so decisions made from
// them (argmax, acceptance, KV bookkeeping) agree everywhere.
// Thread-safety: one thread per Communicator object.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common.h"

namespace verifyd::tp {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place: buf[i] = sum over ranks of buf[i], count elements of dtype.
  virtual absl::Status AllReduceSum(void* buf, size_t count, kernels::DType dtype,
                                    void* stream) = 0;

  // recv[r * bytes .. (r+1) * bytes) = rank r's send[0 .. bytes), for every rank r.
  virtual absl::Status AllGather(const void* send, void* recv, size_t bytes, void* stream) = 0;

  // Marks the group failed: every pending and later collective on every rank returns
  // Unavailable instead of waiting (used when a rank dies or hangs).
  virtual void Abort() = 0;
};

// Creates world_size communicators sharing one in-process group (host buffers, threads).
// Collectives wait at most `timeout_ms` for the other ranks, then fail with
// DeadlineExceeded and abort the group.
std::vector<std::unique_ptr<Communicator>> CreateInProcessGroup(int world_size,
                                                                int timeout_ms = 60000);

}  // namespace verifyd::tp
