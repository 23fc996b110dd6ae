// The in-process Communicator: ranks are threads of one process sharing host buffers.
//
// Each collective is two barriers over a shared group state: every rank publishes its buffer
// pointer and waits for all (barrier 1); each rank then reads every rank's buffer and computes
// its own result (sums in rank order 0..N-1, so every rank gets bit-identical values); barrier
// 2 guarantees nobody still reads a buffer before its owner overwrites it. A barrier that
// waits longer than the timeout aborts the group (DeadlineExceeded); after an abort every
// collective answers Unavailable.
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tp/communicator.h"

namespace verifyd::tp {
namespace {

class InProcessGroup {
 public:
  InProcessGroup(int world_size, int timeout_ms)
      : world_size_(world_size), timeout_ms_(timeout_ms), ptrs_(world_size, nullptr) {}

  int world_size() const { return world_size_; }

  // Publishes rank's pointer for the current collective (read by the others after barrier 1).
  void Publish(int rank, const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    ptrs_[rank] = p;
  }
  const void* Peer(int rank) const { return ptrs_[rank]; }  // only between the barriers

  absl::Status Barrier(int rank, const char* op) {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return AbortedStatus(op);
    const uint64_t gen = generation_;
    if (++arrived_ == world_size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return absl::OkStatus();
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    const bool done =
        cv_.wait_until(lock, deadline, [&] { return generation_ != gen || aborted_; });
    if (generation_ != gen) return absl::OkStatus();
    if (done && aborted_) return AbortedStatus(op);
    aborted_ = true;  // timed out: the group is unusable from now on
    cv_.notify_all();
    return absl::DeadlineExceededError(absl::StrCat("in-process ", op, ": rank ", rank, " waited ",
                                                    timeout_ms_,
                                                    " ms for the other ranks; group aborted"));
  }

  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  static absl::Status AbortedStatus(const char* op) {
    return absl::UnavailableError(absl::StrCat("in-process ", op, ": communicator group aborted"));
  }

  const int world_size_;
  const int timeout_ms_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;                // guarded by mu_
  uint64_t generation_ = 0;        // guarded by mu_
  bool aborted_ = false;           // guarded by mu_
  std::vector<const void*> ptrs_;  // written under mu_ before barrier 1, read after it
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank)
      : group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }

  absl::Status AllReduceSum(void* buf, size_t count, kernels::DType dtype, void*) override {
    if (count > 0 && buf == nullptr) return absl::InvalidArgumentError("AllReduceSum: buf is null");
    group_->Publish(rank_, buf);
    if (absl::Status s = group_->Barrier(rank_, "AllReduceSum"); !s.ok()) return s;
    const int n = group_->world_size();
    // Sum in rank order into a private buffer (float accumulation for bf16).
    scratch_.assign(count, 0.0f);
    for (int r = 0; r < n; ++r) {
      if (dtype == kernels::DType::kFloat32) {
        const float* p = static_cast<const float*>(group_->Peer(r));
        for (size_t i = 0; i < count; ++i) scratch_[i] += p[i];
      } else {
        const kernels::bf16_bits* p = static_cast<const kernels::bf16_bits*>(group_->Peer(r));
        for (size_t i = 0; i < count; ++i) scratch_[i] += kernels::Bf16ToFloat(p[i]);
      }
    }
    if (absl::Status s = group_->Barrier(rank_, "AllReduceSum"); !s.ok()) return s;
    if (dtype == kernels::DType::kFloat32) {
      std::memcpy(buf, scratch_.data(), count * sizeof(float));
    } else {
      kernels::bf16_bits* p = static_cast<kernels::bf16_bits*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] = kernels::FloatToBf16(scratch_[i]);
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const void* send, void* recv, size_t bytes, void*) override {
    if (bytes > 0 && (send == nullptr || recv == nullptr)) {
      return absl::InvalidArgumentError("AllGather: send/recv is null");
    }
    group_->Publish(rank_, send);
    if (absl::Status s = group_->Barrier(rank_, "AllGather"); !s.ok()) return s;
    for (int r = 0; r < group_->world_size(); ++r) {
      // In place (NCCL style: send == recv + rank * bytes) the own part is already there;
      // skipping it also avoids writing memory the other ranks are reading.
      char* dst = static_cast<char*>(recv) + r * bytes;
      if (dst != group_->Peer(r)) std::memcpy(dst, group_->Peer(r), bytes);
    }
    return group_->Barrier(rank_, "AllGather");
  }

  void Abort() override { group_->Abort(); }

 private:
  std::shared_ptr<InProcessGroup> group_;
  const int rank_;
  std::vector<float> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> CreateInProcessGroup(int world_size, int timeout_ms) {
  std::vector<std::unique_ptr<Communicator>> out;
  if (world_size < 1) return out;
  auto group = std::make_shared<InProcessGroup>(world_size, timeout_ms);
  for (int r = 0; r < world_size; ++r) {
    out.push_back(std::make_unique<InProcessCommunicator>(group, r));
  }
  return out;
}

}  // namespace verifyd::tp
