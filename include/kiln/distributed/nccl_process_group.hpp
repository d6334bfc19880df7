// kiln::distributed::nccl_process_group: the ranks of an MPI job, one GPU each, as a group over NCCL: rank, world size,
// broadcast, all-reduce (sum and average) and barrier on device memory. Rank 0 makes NCCL's unique id and the MPI
// group (process_group) broadcasts it, so the job is started by mpirun as on the CPU. Link kiln::nccl.
//
// The collectives run in order on the group's own stream. A collective reads device memory that the caller's kernels
// may still be writing: pass the stream that writes it as `after`, and the group's stream waits for that stream's work
// so far. Every wait polls the stream against the timeout (process_group_options::timeout), and also NCCL's own
// asynchronous error; on a timeout or an error the communicator is aborted (which releases the collectives stuck on
// the device) and a kiln::error names the operation, the rank and the timeout. The group is unusable afterwards.
//
// NCCL refuses two ranks on one GPU: each rank selects its own device (cudaSetDevice) before making the group.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "kiln/core/error.hpp"
#include "kiln/distributed/process_group.hpp"

namespace kiln::distributed {

namespace detail {
template <class T>
ncclDataType_t nccl_datatype() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int64_t>) return ncclInt64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return ncclUint64;
  else static_assert(sizeof(T) == 0, "kiln::distributed: expected float, double or a 32- or 64-bit integer");
}
}  // namespace detail

class nccl_process_group {
 public:
  // A collective under way on the group's stream: finish it with wait() before reading its result on the host or
  // from another stream. Its operation's name must outlive it.
  class request {
   public:
    request() = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    request(request&& other) noexcept
        : done_(std::exchange(other.done_, nullptr)), what_(other.what_), count_(other.count_), bytes_(other.bytes_) {}
    request& operator=(request&& other) noexcept {
      std::swap(done_, other.done_);
      what_ = other.what_;
      count_ = other.count_;
      bytes_ = other.bytes_;
      return *this;
    }
    ~request() {
      if (done_) cudaEventDestroy(done_);
    }
    bool pending() const { return done_ != nullptr; }

   private:
    friend class nccl_process_group;
    cudaEvent_t done_ = nullptr;  // recorded on the group's stream after the collective
    const char* what_ = "";
    std::size_t count_ = 0, bytes_ = 0;
  };

  // Every rank of `group` joins, on the CUDA device current on its thread; the timeout is the MPI group's unless given.
  explicit nccl_process_group(process_group& group) : nccl_process_group(group, group.options()) {}
  nccl_process_group(process_group& group, process_group_options options)
      : options_(options), rank_(group.rank()), size_(group.size()) {
    if (options_.timeout.count() <= 0)
      fail("nccl_process_group: expected a positive timeout, found ", options_.timeout.count(), " ms");
    setup(cudaGetDevice(&device_), "cudaGetDevice");
    ncclUniqueId id{};
    if (rank_ == 0) setup(ncclGetUniqueId(&id), "ncclGetUniqueId");
    // The id is 128 opaque bytes: broadcast as 16 64-bit words.
    static_assert(sizeof(id) % sizeof(std::uint64_t) == 0, "ncclUniqueId is a whole number of 64-bit words");
    std::uint64_t words[sizeof(id) / sizeof(std::uint64_t)];
    std::memcpy(words, &id, sizeof(id));
    group.broadcast(std::span<std::uint64_t>(words), 0, "broadcast of NCCL's unique id");
    std::memcpy(&id, words, sizeof(id));
    setup(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    setup(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    setup(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(std::int32_t)), "cudaMalloc");
    setup(cudaMemset(scratch_, 0, sizeof(std::int32_t)), "cudaMemset");
  }
  nccl_process_group(const nccl_process_group&) = delete;
  nccl_process_group& operator=(const nccl_process_group&) = delete;
  ~nccl_process_group() {
    if (comm_) {
      if (failure_.empty()) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  const process_group_options& options() const { return options_; }
  bool failed() const { return !failure_.empty(); }

  // Starts reducing `values` (device memory) over the ranks, in place, after the work enqueued so far on `after`.
  template <class T>
  request start_all_reduce(std::span<T> values, reduce_op op = reduce_op::sum, const char* what = "all_reduce",
                           cudaStream_t after = nullptr) {
    request r = prepared(what, values.size(), sizeof(T), after);
    check(ncclAllReduce(values.data(), values.data(), values.size(), detail::nccl_datatype<T>(),
                        op == reduce_op::average ? ncclAvg : ncclSum, comm_, stream_),
          r);
    return recorded(std::move(r));
  }
  // Starts copying `values` (device memory) from rank `root` to every other rank.
  template <class T>
  request start_broadcast(std::span<T> values, int root = 0, const char* what = "broadcast",
                          cudaStream_t after = nullptr) {
    request r = prepared(what, values.size(), sizeof(T), after);
    if (root < 0 || root >= size_)
      fail("nccl_process_group: ", describe(r), ": expected a root rank below ", size_, ", found ", root);
    check(ncclBroadcast(values.data(), values.data(), values.size(), detail::nccl_datatype<T>(), root, comm_, stream_),
          r);
    return recorded(std::move(r));
  }

  // Whether r has finished on the device; fails on NCCL's asynchronous error.
  bool test(request& r) {
    if (!r.pending()) return true;
    const cudaError_t status = cudaEventQuery(r.done_);
    if (status == cudaSuccess) {
      cudaEventDestroy(std::exchange(r.done_, nullptr));
      return true;
    }
    if (status != cudaErrorNotReady) check(status, r);
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &async), r);
    check(async, r);
    return false;
  }
  // Waits for r, polling, and aborts the communicator and fails once the timeout has passed.
  void wait(request& r) {
    if (!r.pending()) return;
    check_usable(r);
    const auto deadline = std::chrono::steady_clock::now() + options_.timeout;
    while (!test(r)) {
      if (std::chrono::steady_clock::now() > deadline) timed_out(r);
      std::this_thread::yield();
    }
  }

  template <class T>
  void all_reduce(std::span<T> values, reduce_op op = reduce_op::sum, const char* what = "all_reduce",
                  cudaStream_t after = nullptr) {
    request r = start_all_reduce(values, op, what, after);
    wait(r);
  }
  template <class T>
  void broadcast(std::span<T> values, int root = 0, const char* what = "broadcast", cudaStream_t after = nullptr) {
    request r = start_broadcast(values, root, what, after);
    wait(r);
  }
  // Every rank has reached this call: an all-reduce of one value, waited for.
  void barrier(const char* what = "barrier") { all_reduce(std::span<std::int32_t>(scratch_, 1), reduce_op::sum, what); }

 private:
  // A request for an operation about to start on a group that has not failed, ordered after `after`'s work so far.
  request prepared(const char* what, std::size_t count, std::size_t bytes_each, cudaStream_t after) {
    request r;
    r.what_ = what;
    r.count_ = count;
    r.bytes_ = bytes_each;
    check_usable(r);
    if (after) {
      check(cudaEventCreateWithFlags(&r.done_, cudaEventDisableTiming), r);
      check(cudaEventRecord(r.done_, after), r);
      check(cudaStreamWaitEvent(stream_, r.done_, 0), r);
    }
    return r;
  }
  // Marks the end of r's collective on the group's stream.
  request recorded(request r) {
    if (!r.done_) check(cudaEventCreateWithFlags(&r.done_, cudaEventDisableTiming), r);
    check(cudaEventRecord(r.done_, stream_), r);
    return r;
  }
  static std::string describe(const request& r) {
    std::string text = r.what_;
    text += " of " + std::to_string(r.count_) + " values (" + std::to_string(r.count_ * r.bytes_) + " bytes)";
    return text;
  }
  void check_usable(const request& r) const {
    if (!failure_.empty())
      fail("nccl_process_group: cannot run ", describe(r), " on rank ", rank_, ": an earlier operation failed (",
           failure_, "), and the communicator was aborted");
  }
  void check(cudaError_t status, const request& r) {
    if (status == cudaSuccess) return;
    failure_ = describe(r) + " failed";
    fail("nccl_process_group: ", describe(r), " failed on rank ", rank_, " of ", size_, " (device ", device_,
         "): ", cudaGetErrorString(status));
  }
  void check(ncclResult_t status, const request& r) {
    if (status == ncclSuccess) return;
    failure_ = describe(r) + " failed";
    fail("nccl_process_group: ", describe(r), " failed on rank ", rank_, " of ", size_, " (device ", device_,
         "): ", ncclGetErrorString(status));
  }
  static void setup(cudaError_t status, const char* call) {
    if (status != cudaSuccess) fail("nccl_process_group: ", call, " failed: ", cudaGetErrorString(status));
  }
  static void setup(ncclResult_t status, const char* call) {
    if (status != ncclSuccess) fail("nccl_process_group: ", call, " failed: ", ncclGetErrorString(status));
  }
  [[noreturn]] void timed_out(const request& r) {
    failure_ = describe(r) + " timed out";
    // Aborting releases the collectives that wait on the device for the peers.
    ncclCommAbort(std::exchange(comm_, nullptr));
    const double seconds = std::chrono::duration<double>(options_.timeout).count();
    fail("nccl_process_group: ", describe(r), " did not complete within the timeout of ", seconds, " s on rank ",
         rank_, " of ", size_, " (device ", device_, "): a peer exited early, stopped before this step, or posted "
         "another collective; the communicator is aborted");
  }

  process_group_options options_;
  int rank_ = 0, size_ = 1, device_ = 0;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::int32_t* scratch_ = nullptr;  // the barrier's one value, on the device
  std::string failure_;
};

}  // namespace kiln::distributed
