// LoopbackCommunicator: N ranks on one GPU (see the header).
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "tp/cuda/loopback_communicator.h"
#include "tp/cuda/rank_order_sum.h"

namespace verifyd::tp {
namespace {

static_assert(kMaxLoopbackRanks <= kMaxRankOrderSources, "loopback ranks");

absl::Status Unavailable(const std::string& what) {
  return absl::UnavailableError(absl::StrCat("loopback communicator: ", what));
}

}  // namespace

LoopbackGroup::LoopbackGroup(int world_size, int timeout_ms)
    : world_(world_size), timeout_ms_(timeout_ms), posts_(world_size) {
  published_[0].resize(world_size);
  published_[1].resize(world_size);
}

absl::Status LoopbackGroup::Exchange(int rank, const Post& mine, std::vector<Post>* all) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_) return Unavailable("the group has failed");
  const uint64_t gen = generation_;
  posts_[rank] = mine;
  if (++arrived_ == world_) {
    published_[gen % 2] = posts_;
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    while (generation_ == gen && !failed_) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && generation_ == gen) {
        failed_ = true;
        cv_.notify_all();
        return Unavailable(absl::StrCat("DeadlineExceeded: rank ", rank, " waited ", timeout_ms_,
                                        " ms for the other ranks; group aborted"));
      }
    }
    if (generation_ == gen) return Unavailable("the group has failed");
  }
  *all = published_[gen % 2];
  return absl::OkStatus();
}

void LoopbackGroup::Abort() {
  std::lock_guard<std::mutex> lock(mu_);
  failed_ = true;
  cv_.notify_all();
}

bool LoopbackGroup::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

LoopbackCommunicator::LoopbackCommunicator(std::shared_ptr<LoopbackGroup> group, int rank,
                                           int device)
    : group_(std::move(group)), rank_(rank), device_(device) {}

absl::StatusOr<std::unique_ptr<LoopbackCommunicator>> LoopbackCommunicator::Create(
    std::shared_ptr<LoopbackGroup> group, int rank, int device) {
  if (group == nullptr) return absl::InvalidArgumentError("loopback communicator: no group");
  if (group->world_size() < 1 || group->world_size() > kMaxLoopbackRanks) {
    return absl::InvalidArgumentError(absl::StrCat("loopback communicator: world size ",
                                                   group->world_size(), " not in [1, ",
                                                   kMaxLoopbackRanks, "]"));
  }
  if (rank < 0 || rank >= group->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("loopback communicator: rank ", rank));
  }
  std::unique_ptr<LoopbackCommunicator> c(new LoopbackCommunicator(std::move(group), rank, device));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaEvent_t ready, done;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  c->ready_ = ready;
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  c->done_ = done;
  return c;
}

LoopbackCommunicator::~LoopbackCommunicator() {
  if (ready_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(ready_));
  if (done_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(done_));
  if (scratch_ != nullptr) cudaFree(scratch_);
}

absl::Status LoopbackCommunicator::Rendezvous(const void* ptr, void* event, void* stream,
                                              std::vector<LoopbackGroup::Post>* all) {
  auto s = static_cast<cudaStream_t>(stream);
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(event), s));
  VERIFYD_RETURN_IF_ERROR(group_->Exchange(rank_, {ptr, event}, all));
  for (int r = 0; r < group_->world_size(); ++r) {
    if (r == rank_) continue;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>((*all)[r].event)));
  }
  return absl::OkStatus();
}

absl::Status LoopbackCommunicator::AllReduceSum(void* buf, size_t count, kernels::DType dtype,
                                                void* stream) {
  if (dtype != kernels::DType::kFloat32 && dtype != kernels::DType::kBFloat16) {
    return absl::InvalidArgumentError("loopback AllReduceSum: dtype must be float32 or bfloat16");
  }
  const size_t bytes = count * kernels::DTypeSize(dtype);
  if (bytes > scratch_bytes_) {  // grows once to the largest message (not during capture)
    if (scratch_ != nullptr) VERIFYD_CUDA_RETURN_IF_ERROR(cudaFree(scratch_));
    scratch_ = nullptr;
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, bytes));
    scratch_bytes_ = bytes;
  }
  auto s = static_cast<cudaStream_t>(stream);
  std::vector<LoopbackGroup::Post> all;
  VERIFYD_RETURN_IF_ERROR(Rendezvous(buf, ready_, stream, &all));
  const void* src[kMaxLoopbackRanks];
  for (int r = 0; r < group_->world_size(); ++r) src[r] = all[r].ptr;
  VERIFYD_RETURN_IF_ERROR(
      SumInRankOrderCuda(src, group_->world_size(), count, dtype, scratch_, stream));
  // Every rank has read every buffer before any rank overwrites its own.
  VERIFYD_RETURN_IF_ERROR(Rendezvous(nullptr, done_, stream, &all));
  if (bytes > 0) {
    VERIFYD_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(buf, scratch_, bytes, cudaMemcpyDeviceToDevice, s));
  }
  return absl::OkStatus();
}

absl::Status LoopbackCommunicator::AllGather(const void* send, void* recv, size_t bytes,
                                             void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  std::vector<LoopbackGroup::Post> all;
  VERIFYD_RETURN_IF_ERROR(Rendezvous(send, ready_, stream, &all));
  for (int r = 0; r < group_->world_size() && bytes > 0; ++r) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(recv) + r * bytes, all[r].ptr,
                                                 bytes, cudaMemcpyDeviceToDevice, s));
  }
  // No rank overwrites its send buffer before every rank copied it.
  return Rendezvous(nullptr, done_, stream, &all);
}

absl::Status LoopbackCommunicator::Synchronize(void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(group_->timeout_ms());
  for (int it = 0;; ++it) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      group_->Abort();
      return kernels::cuda::CudaErrorToStatus(e, "cudaStreamQuery", __FILE__, __LINE__);
    }
    if (group_->failed()) return Unavailable("the group has failed");
    if (std::chrono::steady_clock::now() > deadline) {
      group_->Abort();
      return Unavailable(absl::StrCat("DeadlineExceeded: rank ", rank_,
                                      " stream did not finish in ", group_->timeout_ms(),
                                      " ms; group aborted"));
    }
    if (it > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

absl::StatusOr<std::vector<std::unique_ptr<LoopbackCommunicator>>> CreateLoopbackGroup(
    int world_size, int device, int timeout_ms) {
  auto group = std::make_shared<LoopbackGroup>(world_size, timeout_ms);
  std::vector<std::unique_ptr<LoopbackCommunicator>> out;
  for (int r = 0; r < world_size; ++r) {
    VERIFYD_ASSIGN_OR_RETURN(auto c, LoopbackCommunicator::Create(group, r, device));
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace verifyd::tp
