// A tp::Communicator for N ranks that share one GPU in one process: tensor parallelism (and
// later expert parallelism) tested on a single GPU, the same engine code path as NCCL across
// GPUs with a different communicator.
//
// Each collective is a rendezvous of the ranks' engine threads (host): every rank posts its
// buffer and a CUDA event recorded on its stream; every rank's stream then waits for the
// others' events and computes its result from all ranks' buffers (same device memory), then a
// second rendezvous exchanges "done reading" events so no rank overwrites a buffer another
// still reads. No thread waits for the GPU inside a collective.
//
//   AllReduceSum: out[i] = (((buf_0[i] + buf_1[i]) + buf_2[i]) + ...) in rank order, in
//                 float32 (bf16 inputs are widened and the sum rounded once): bit-identical on
//                 every rank, and independent of the message size.
//   AllGather:    recv[r] = rank r's send, device-to-device copies.
// A rank that does not arrive within timeout_ms fails the collective (Unavailable) and aborts
// the group: every waiting and later collective of every rank answers Unavailable.
//
// Thread-safety: one LoopbackCommunicator per rank thread; the LoopbackGroup they share is
// thread-safe (members under mu_).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "tp/cuda/device_communicator.h"

namespace verifyd::tp {

// Most ranks one loopback group holds.
inline constexpr int kMaxLoopbackRanks = 8;  // <= kMaxRankOrderSources (rank_order_sum.h)

// The rendezvous shared by the ranks of one loopback group.
class LoopbackGroup {
 public:
  // What a rank posts at a rendezvous: a device pointer and a cudaEvent_t (as void*).
  struct Post {
    const void* ptr = nullptr;
    void* event = nullptr;
  };

  LoopbackGroup(int world_size, int timeout_ms);

  // Posts rank `rank`'s entry and waits until every rank posted for this rendezvous; then
  // fills *all with every rank's post (rank order). Unavailable when the group failed or
  // timeout_ms passed (which fails the group).
  absl::Status Exchange(int rank, const Post& mine, std::vector<Post>* all);

  void Abort();
  bool failed() const;
  int world_size() const { return world_; }
  int timeout_ms() const { return timeout_ms_; }

 private:
  const int world_;
  const int timeout_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Post> posts_ ABSL_GUARDED_BY(mu_);
  // The completed rendezvous of generation g is in published_[g % 2]: a rank reaches the
  // rendezvous after next only once every rank has read this one.
  std::vector<Post> published_[2] ABSL_GUARDED_BY(mu_);
};

class LoopbackCommunicator : public DeviceCommunicator {
 public:
  // Rank `rank` of `group`, on `device` (every rank of a group on the same device). Call on
  // the rank's own thread.
  static absl::StatusOr<std::unique_ptr<LoopbackCommunicator>> Create(
      std::shared_ptr<LoopbackGroup> group, int rank, int device);
  ~LoopbackCommunicator() override;
  LoopbackCommunicator(const LoopbackCommunicator&) = delete;
  LoopbackCommunicator& operator=(const LoopbackCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }

  // dtype kFloat32 or kBFloat16; buf on the group's device.
  absl::Status AllReduceSum(void* buf, size_t count, kernels::DType dtype, void* stream) override;
  absl::Status AllGather(const void* send, void* recv, size_t bytes, void* stream) override;
  void Abort() override { group_->Abort(); }
  absl::Status Synchronize(void* stream) override;
  bool failed() const override { return group_->failed(); }

 private:
  LoopbackCommunicator(std::shared_ptr<LoopbackGroup> group, int rank, int device);
  // Records `event` on `stream`, exchanges it (with `ptr`), and makes `stream` wait for every
  // other rank's event. *all receives the posts.
  absl::Status Rendezvous(const void* ptr, void* event, void* stream,
                          std::vector<LoopbackGroup::Post>* all);

  std::shared_ptr<LoopbackGroup> group_;
  const int rank_;
  const int device_;
  void* ready_ = nullptr;    // cudaEvent_t: this rank's inputs are ready
  void* done_ = nullptr;     // cudaEvent_t: this rank finished reading the others' buffers
  void* scratch_ = nullptr;  // device buffer for the reduced result
  size_t scratch_bytes_ = 0;
};

// A whole group of world_size loopback communicators on `device` (tests and tools; the CUDA
// engine creates each rank's communicator on the rank's own thread).
absl::StatusOr<std::vector<std::unique_ptr<LoopbackCommunicator>>> CreateLoopbackGroup(
    int world_size, int device, int timeout_ms = 60000);

}  // namespace verifyd::tp
