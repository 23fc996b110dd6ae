// NcclCommunicator (see nccl_communicator.h).
#include "tp/cuda/nccl_communicator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/status.h"

#if VERIFYD_ENGINE_WITH_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "kernels/cuda/cuda_check.h"
#include "tp/cuda/rank_order_sum.h"

namespace verifyd::tp {
namespace {

using Clock = std::chrono::steady_clock;

ncclComm_t AsComm(void* c) { return static_cast<ncclComm_t>(c); }

std::string NcclError(ncclResult_t r, ncclComm_t comm) {
  std::string s = absl::StrCat(ncclGetErrorString(r), " (", static_cast<int>(r), ")");
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') absl::StrAppend(&s, ": ", last);
  }
  return s;
}

// Short sleeps while polling: a step's collectives finish in microseconds to milliseconds;
// the poll must not burn a core for the whole timeout.
void PollPause(int iteration) {
  if (iteration < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace

bool NcclCommunicator::Available() { return true; }

absl::StatusOr<std::string> NcclCommunicator::NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    return absl::UnavailableError(absl::StrCat("ncclGetUniqueId failed: ", NcclError(r, nullptr)));
  }
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

NcclCommunicator::NcclCommunicator(void* comm, int rank, int world, int device, int timeout_ms,
                                   std::shared_ptr<NcclGroupState> group)
    : comm_(comm),
      rank_(rank),
      world_(world),
      device_(device),
      timeout_ms_(timeout_ms),
      group_(std::move(group)) {}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const std::string& unique_id, int rank, int world_size, int device, int timeout_ms,
    std::shared_ptr<NcclGroupState> group) {
  if (unique_id.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unique_id has ", unique_id.size(), " bytes, want ", sizeof(ncclUniqueId)));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " out of range for world_size ", world_size));
  }
  if (timeout_ms <= 0) return absl::InvalidArgumentError("timeout_ms must be > 0");
  if (!group) group = std::make_shared<NcclGroupState>();
  const cudaError_t ce = cudaSetDevice(device);
  if (ce != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("cudaSetDevice(", device, ") failed: ", cudaGetErrorString(ce)));
  }
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; we poll with a deadline
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::UnavailableError(
        absl::StrCat("ncclCommInitRankConfig(rank ", rank, ") failed: ", NcclError(r, comm)));
  }
  std::unique_ptr<NcclCommunicator> c(
      new NcclCommunicator(comm, rank, world_size, device, timeout_ms, std::move(group)));
  absl::Status st = c->WaitReady("ncclCommInitRankConfig");
  if (!st.ok()) return st;
  return c;
}

NcclCommunicator::~NcclCommunicator() {
  // Abort rather than finalize: ncclCommFinalize/Destroy may wait for the peers, and ranks
  // are torn down one after the other (or after a peer died). Abort frees the local
  // resources without a handshake; the engine synchronises its streams first.
  if (!aborted_.exchange(true) && comm_ != nullptr) {
    cudaSetDevice(device_);
    ncclCommAbort(AsComm(comm_));
  }
  if (gather_ != nullptr) {
    cudaSetDevice(device_);
    cudaFree(gather_);
  }
}

bool NcclCommunicator::failed() const { return aborted_.load() || group_->failed.load(); }

absl::Status NcclCommunicator::Fail(const std::string& msg) {
  group_->failed.store(true);
  if (!aborted_.exchange(true) && comm_ != nullptr) ncclCommAbort(AsComm(comm_));
  return absl::UnavailableError(absl::StrCat("nccl rank ", rank_, ": ", msg));
}

absl::Status NcclCommunicator::FailOnError(int result, const char* call) {
  const auto r = static_cast<ncclResult_t>(result);
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  return Fail(absl::StrCat(call, " failed: ", NcclError(r, AsComm(comm_))));
}

// Only the flag here: ncclCommAbort must not run concurrently with another call on the same
// communicator, and Abort() may come from any thread. The owner thread aborts the
// communicator at its next collective or poll (it sees the flag), or the destructor does.
void NcclCommunicator::Abort() { group_->failed.store(true); }

absl::Status NcclCommunicator::WaitReady(const char* what) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  for (int it = 0;; ++it) {
    if (aborted_.load())
      return absl::UnavailableError(absl::StrCat(what, ": communicator aborted"));
    if (group_->failed.load()) return Fail(absl::StrCat(what, ": another rank failed"));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(AsComm(comm_), &state);
    if (r != ncclSuccess)
      return Fail(
          absl::StrCat(what, ": ncclCommGetAsyncError failed: ", NcclError(r, AsComm(comm_))));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress)
      return Fail(absl::StrCat(what, ": ", NcclError(state, AsComm(comm_))));
    if (Clock::now() > deadline) {
      return Fail(absl::StrCat(what, ": deadline exceeded after ", timeout_ms_, " ms"));
    }
    PollPause(it);
  }
}

absl::Status NcclCommunicator::AllReduceSum(void* buf, size_t count, kernels::DType dtype,
                                            void* stream) {
  if (failed()) return Fail("AllReduceSum on a failed group");
  if (count == 0) return absl::OkStatus();
  if (buf == nullptr) return absl::InvalidArgumentError("AllReduceSum: buf is null");
  if (dtype != kernels::DType::kFloat32 && dtype != kernels::DType::kBFloat16) {
    return absl::InvalidArgumentError("AllReduceSum: dtype must be float32 or bfloat16");
  }
  if (gather_ != nullptr) {
    const size_t bytes = count * kernels::DTypeSize(dtype);
    if (bytes > gather_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AllReduceSum: ", bytes, " bytes > the rank-order buffer's ", gather_bytes_));
    }
    VERIFYD_RETURN_IF_ERROR(AllGather(buf, gather_, bytes, stream));
    const void* src[kMaxRankOrderSources];
    for (int r = 0; r < world_; ++r) src[r] = static_cast<const char*>(gather_) + r * bytes;
    return SumInRankOrderCuda(src, world_, count, dtype, buf, stream);
  }
  const ncclDataType_t t = dtype == kernels::DType::kFloat32 ? ncclFloat32 : ncclBfloat16;
  VERIFYD_RETURN_IF_ERROR(FailOnError(
      ncclAllReduce(buf, buf, count, t, ncclSum, AsComm(comm_), static_cast<cudaStream_t>(stream)),
      "ncclAllReduce"));
  return WaitReady("ncclAllReduce");
}

absl::Status NcclCommunicator::EnableRankOrderReduce(size_t max_bytes) {
  if (world_ > kMaxRankOrderSources) {
    return absl::UnimplementedError(absl::StrCat("rank-order reduction: at most ",
                                                 kMaxRankOrderSources, " ranks, got ", world_));
  }
  if (gather_ != nullptr) {
    VERIFYD_CUDA_RETURN_IF_ERROR(cudaFree(gather_));
    gather_ = nullptr;
  }
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  VERIFYD_CUDA_RETURN_IF_ERROR(cudaMalloc(&gather_, std::max<size_t>(1, world_ * max_bytes)));
  gather_bytes_ = max_bytes;
  return absl::OkStatus();
}

absl::Status NcclCommunicator::AllGather(const void* send, void* recv, size_t bytes, void* stream) {
  if (failed()) return Fail("AllGather on a failed group");
  if (bytes == 0) return absl::OkStatus();
  if (send == nullptr || recv == nullptr)
    return absl::InvalidArgumentError("AllGather: null buffer");
  VERIFYD_RETURN_IF_ERROR(FailOnError(
      ncclAllGather(send, recv, bytes, ncclUint8, AsComm(comm_), static_cast<cudaStream_t>(stream)),
      "ncclAllGather"));
  return WaitReady("ncclAllGather");
}

absl::Status NcclCommunicator::Synchronize(void* stream) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  for (int it = 0;; ++it) {
    const cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(stream));
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) {
      return Fail(
          absl::StrCat("cudaStreamQuery: ", cudaGetErrorName(e), " ", cudaGetErrorString(e)));
    }
    if (aborted_.load() || group_->failed.load())
      return Fail("group failed while waiting for the stream");
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(AsComm(comm_), &state) == ncclSuccess && state != ncclSuccess &&
        state != ncclInProgress) {
      return Fail(absl::StrCat("async error: ", NcclError(state, AsComm(comm_))));
    }
    if (Clock::now() > deadline) {
      return Fail(absl::StrCat("stream not done after ", timeout_ms_, " ms (hung peer?)"));
    }
    PollPause(it);
  }
  if (failed()) return Fail("group failed");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> CreateNcclGroup(
    const std::vector<int>& devices, int timeout_ms) {
  if (devices.empty()) return absl::InvalidArgumentError("devices is empty");
  absl::StatusOr<std::string> id = NcclCommunicator::NewUniqueId();
  if (!id.ok()) return id.status();
  const int world = static_cast<int>(devices.size());
  auto group = std::make_shared<NcclGroupState>();
  std::vector<absl::StatusOr<std::unique_ptr<NcclCommunicator>>> made(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      made[r] = NcclCommunicator::Create(*id, r, world, devices[r], timeout_ms, group);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  for (int r = 0; r < world; ++r) {
    if (!made[r].ok()) {
      for (auto& m : made) {
        if (m.ok()) (*m)->Abort();
      }
      return made[r].status();
    }
    out.push_back(std::move(*made[r]));
  }
  return out;
}

}  // namespace verifyd::tp

#else  // !VERIFYD_ENGINE_WITH_NCCL: the class without NCCL; nothing can create one.

namespace verifyd::tp {
namespace {
absl::Status NoNccl() { return absl::UnimplementedError("this build has no NCCL"); }
}  // namespace

bool NcclCommunicator::Available() { return false; }
absl::StatusOr<std::string> NcclCommunicator::NewUniqueId() { return NoNccl(); }
absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const std::string&, int, int, int, int, std::shared_ptr<NcclGroupState>) {
  return NoNccl();
}
NcclCommunicator::~NcclCommunicator() = default;
bool NcclCommunicator::failed() const { return true; }
void NcclCommunicator::Abort() { group_->failed.store(true); }
absl::Status NcclCommunicator::AllReduceSum(void*, size_t, kernels::DType, void*) {
  return NoNccl();
}
absl::Status NcclCommunicator::EnableRankOrderReduce(size_t) { return NoNccl(); }
absl::Status NcclCommunicator::AllGather(const void*, void*, size_t, void*) { return NoNccl(); }
absl::Status NcclCommunicator::Synchronize(void*) { return NoNccl(); }
absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> CreateNcclGroup(
    const std::vector<int>&, int) {
  return NoNccl();
}

}  // namespace verifyd::tp

#endif  // VERIFYD_ENGINE_WITH_NCCL
