// The recording stand-in communicator (see recording_communicator.h).
#include "tp/cuda/recording_communicator.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "tp/cuda/rank_order_sum.h"

namespace verifyd::tp {

RecordingCommunicator::RecordingCommunicator(int rank, int world, int device, int timeout_ms)
    : rank_(rank), world_(world), device_(device), timeout_ms_(timeout_ms) {}

absl::StatusOr<std::unique_ptr<RecordingCommunicator>> RecordingCommunicator::Create(
    int rank, int world, int device, size_t rank_order_max_bytes, int timeout_ms) {
  if (world < 2 || world > kMaxRankOrderSources) {
    return absl::InvalidArgumentError(absl::StrCat("recording communicator: world ", world,
                                                   " outside [2, ", kMaxRankOrderSources, "]"));
  }
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("recording communicator: rank ", rank, " outside [0, ", world, ")"));
  }
  std::unique_ptr<RecordingCommunicator> c(
      new RecordingCommunicator(rank, world, device, timeout_ms));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  if (rank_order_max_bytes > 0) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMalloc(&c->zeros_, rank_order_max_bytes));
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemset(c->zeros_, 0, rank_order_max_bytes));
    c->rank_order_bytes_ = rank_order_max_bytes;
  }
  return c;
}

RecordingCommunicator::~RecordingCommunicator() {
  if (zeros_ != nullptr) {
    cudaSetDevice(device_);
    cudaFree(zeros_);
  }
}

void RecordingCommunicator::Record(CollectiveKind kind, size_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  records_.push_back(CollectiveCall{kind, static_cast<int64_t>(bytes)});
}

std::vector<CollectiveCall> RecordingCommunicator::TakeRecords() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<CollectiveCall> out;
  out.swap(records_);
  return out;
}

void RecordingCommunicator::Abort() {
  std::lock_guard<std::mutex> l(mu_);
  aborted_ = true;
}

bool RecordingCommunicator::failed() const {
  std::lock_guard<std::mutex> l(mu_);
  return aborted_;
}

absl::Status RecordingCommunicator::AllReduceSum(void* buf, size_t count, kernels::DType dtype,
                                                 void* stream) {
  if (failed()) return absl::UnavailableError("AllReduceSum on an aborted communicator");
  if (count == 0) return absl::OkStatus();
  if (buf == nullptr) return absl::InvalidArgumentError("AllReduceSum: buf is null");
  if (dtype != kernels::DType::kFloat32 && dtype != kernels::DType::kBFloat16) {
    return absl::InvalidArgumentError("AllReduceSum: dtype must be float32 or bfloat16");
  }
  const size_t bytes = count * kernels::DTypeSize(dtype);
  if (zeros_ == nullptr) {
    Record(CollectiveKind::kAllReduce, bytes);
    return absl::OkStatus();
  }
  if (bytes > rank_order_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AllReduceSum: ", bytes, " bytes > the rank-order buffer's ", rank_order_bytes_));
  }
  Record(CollectiveKind::kAllGather, bytes);
  const void* src[kMaxRankOrderSources];
  for (int r = 0; r < world_; ++r) src[r] = r == rank_ ? buf : zeros_;
  return SumInRankOrderCuda(src, world_, count, dtype, buf, stream);
}

absl::Status RecordingCommunicator::AllGather(const void* send, void* recv, size_t bytes,
                                              void* stream) {
  if (failed()) return absl::UnavailableError("AllGather on an aborted communicator");
  if (bytes == 0) return absl::OkStatus();
  if (send == nullptr || recv == nullptr) {
    return absl::InvalidArgumentError("AllGather: null buffer");
  }
  Record(CollectiveKind::kAllGather, bytes);
  const auto s = static_cast<cudaStream_t>(stream);
  size_t& zeroed = zeroed_[recv];
  if (zeroed < world_ * bytes) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(recv, 0, world_ * bytes, s));
    zeroed = world_ * bytes;
  }
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<char*>(recv) + rank_ * bytes, send,
                                               bytes, cudaMemcpyDeviceToDevice, s));
  return absl::OkStatus();
}

absl::Status RecordingCommunicator::Synchronize(void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  for (int it = 0;; ++it) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      return kernels::cuda::CudaErrorToStatus(e, "cudaStreamQuery", __FILE__, __LINE__);
    }
    if (failed()) return absl::UnavailableError("communicator aborted");
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::UnavailableError(
          absl::StrCat("rank ", rank_, " stream did not finish in ", timeout_ms_, " ms"));
    }
    if (it > 64) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace verifyd::tp
