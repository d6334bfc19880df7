// kiln::distributed::process_group: the ranks of an MPI job (processes started by mpirun) as one group: rank, world
// size, broadcast, all-reduce (sum and average), barrier, and the non-blocking all-reduce that data-parallel training
// overlaps with the backward pass.
//
// A collective that a peer never joins (it exited early, ran out of batches sooner, or posted a collective of another
// size) would wait forever in MPI's own blocking calls. Here every wait polls MPI_Test against a timeout
// (process_group_options::timeout) and then throws a kiln::error naming the operation, the rank and the timeout. The
// group is unusable after that (its collectives are out of step with the peers'), and says so if it is used again.
//
// MPI is initialised by the first group unless the program did it, and then finalised at exit. The group works on a
// duplicate of MPI_COMM_WORLD, so its collectives never match the program's own. kiln asks MPI for
// MPI_THREAD_SERIALIZED: one thread calls MPI at a time, the program's, or during a step the gradient reducer's
// progress thread (gradient_reducer.hpp), which a program that initialised MPI with less goes without. kiln's OpenMP
// threads and a data loader's thread never call MPI.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"

namespace kiln::distributed {

struct process_group_options {
  // How long one blocking operation may wait for the peers before it fails instead of hanging.
  std::chrono::milliseconds timeout{60'000};
};

enum class reduce_op { sum, average };

namespace detail {

template <class T>
MPI_Datatype mpi_datatype() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int64_t>) return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>) return MPI_UINT64_T;
  else static_assert(sizeof(T) == 0, "kiln::distributed: expected float, double or a 32- or 64-bit integer");
}

// The text of an MPI error code.
inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

// Initialises MPI once per process, unless the program already did, and finalises it at exit if kiln initialised it.
inline void initialize_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) fail("process_group: MPI was already finalised; make every process group before MPI_Finalize");
    return;
  }
  int provided = 0;
  if (int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided); code != MPI_SUCCESS)
    fail("process_group: MPI_Init_thread failed: ", mpi_error_text(code));
  // Destroyed at exit, after every object made later; MPI_Finalize waits for the peers to finalise too.
  static const struct finalizer {
    ~finalizer() {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
  } finalize_at_exit;
}

}  // namespace detail

class process_group {
 public:
  // A non-blocking collective under way: finish it with wait() (or poll it with test()) before its buffer is read or
  // changed. It keeps what it is (an operation's name, which must outlive it, and a size) for the error a timeout
  // gives, and allocates nothing.
  class request {
   public:
    request() = default;
    request(const request&) = delete;
    request& operator=(const request&) = delete;
    request(request&& other) noexcept
        : handle_(std::exchange(other.handle_, MPI_REQUEST_NULL)), what_(other.what_), count_(other.count_),
          bytes_(other.bytes_) {}
    request& operator=(request&& other) noexcept {
      handle_ = std::exchange(other.handle_, MPI_REQUEST_NULL);
      what_ = other.what_;
      count_ = other.count_;
      bytes_ = other.bytes_;
      return *this;
    }
    // A collective must be finished, not dropped: MPI cannot cancel one. A request still pending here belongs to a
    // group that failed (an exception unwound past it); the group refuses further work, so it is left to MPI_Finalize.
    ~request() = default;
    bool pending() const { return handle_ != MPI_REQUEST_NULL; }

   private:
    friend class process_group;
    MPI_Request handle_ = MPI_REQUEST_NULL;
    const char* what_ = "";
    std::size_t count_ = 0, bytes_ = 0;  // values and bytes each (none for a barrier)
  };

  // Joins the job: every rank of MPI_COMM_WORLD must make its group at the same point of the program.
  explicit process_group(process_group_options options = {}) : options_(options) {
    if (options_.timeout.count() <= 0)
      fail("process_group: expected a positive timeout, found ", options_.timeout.count(), " ms");
    detail::initialize_mpi();
    setup(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    // Errors come back as codes, which check() turns into kiln::error, instead of aborting the job.
    setup(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    setup(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    setup(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    int level = MPI_THREAD_SINGLE;
    setup(MPI_Query_thread(&level), "MPI_Query_thread");
    serialized_threads_ = level >= MPI_THREAD_SERIALIZED;
  }
  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;
  ~process_group() {
    // Freeing a communicator with a collective still pending on it is erroneous; a failed group keeps it.
    if (comm_ != MPI_COMM_NULL && failure_.empty()) MPI_Comm_free(&comm_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  const process_group_options& options() const { return options_; }
  // Whether an operation has failed (timed out or returned an MPI error): then every later one fails at once.
  bool failed() const { return !failure_.empty(); }
  // Whether MPI lets another thread call it while this one does not (MPI_THREAD_SERIALIZED or more).
  bool serialized_threads() const { return serialized_threads_; }

  // Starts summing `values` over the ranks, in place: afterwards every rank holds the same sums. Every rank must
  // start the same all-reduces, of the same sizes, in the same order.
  template <class T>
  request start_all_reduce(std::span<T> values, const char* what = "all_reduce") {
    request r = prepared(what, values.size(), sizeof(T));
    check(MPI_Iallreduce(MPI_IN_PLACE, values.data(), mpi_count(r), detail::mpi_datatype<T>(), MPI_SUM, comm_,
                         &r.handle_),
          r);
    return r;
  }
  // Starts copying `values` from rank `root` to every other rank.
  template <class T>
  request start_broadcast(std::span<T> values, int root = 0, const char* what = "broadcast") {
    request r = prepared(what, values.size(), sizeof(T));
    if (root < 0 || root >= size_)
      fail("process_group: ", describe(r), ": expected a root rank below ", size_, ", found ", root);
    check(MPI_Ibcast(values.data(), mpi_count(r), detail::mpi_datatype<T>(), root, comm_, &r.handle_), r);
    return r;
  }

  // Lets MPI make progress on r; true once it has finished (or when there was nothing to finish). Open MPI moves a
  // non-blocking collective forward only inside MPI calls, so a caller that computes meanwhile tests now and then.
  bool test(request& r) {
    if (!r.pending()) return true;
    int done = 0;
    check(MPI_Test(&r.handle_, &done, MPI_STATUS_IGNORE), r);
    return done != 0;
  }
  // test(r), failing as a timeout would once the clock has passed `deadline` with r still pending.
  bool poll(request& r, std::chrono::steady_clock::time_point deadline) {
    if (test(r)) return true;
    if (std::chrono::steady_clock::now() > deadline) timed_out(r);
    return false;
  }
  // Waits for r, polling, and fails once the timeout has passed without the peers joining in. It polls without a
  // pause for the first spin_wait, then sleeps poll_pause between polls: a rank that waits long for a slower peer
  // leaves its core to the other processes (a peer, a data loader) instead of spinning on it.
  void wait(request& r) {
    if (!r.pending()) return;
    check_usable(r);
    constexpr auto spin_wait = std::chrono::microseconds(200), poll_pause = std::chrono::microseconds(50);
    const auto start = std::chrono::steady_clock::now(), deadline = start + options_.timeout;
    bool spinning = true;
    for (unsigned polls = 1;; ++polls) {
      if (test(r)) return;
      // While spinning, the clock is read every 16 polls: a poll is far shorter than the spin or any timeout.
      if (!spinning || polls % 16 == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (now > deadline) timed_out(r);
        spinning = now - start < spin_wait;
      }
      if (spinning) std::this_thread::yield();
      else std::this_thread::sleep_for(poll_pause);
    }
  }

  // Blocking forms.
  template <class T>
  void all_reduce(std::span<T> values, reduce_op op = reduce_op::sum, const char* what = "all_reduce") {
    request r = start_all_reduce(values, what);
    wait(r);
    if (op == reduce_op::average) divide(values);
  }
  template <class T>
  void broadcast(std::span<T> values, int root = 0, const char* what = "broadcast") {
    request r = start_broadcast(values, root, what);
    wait(r);
  }
  void barrier(const char* what = "barrier") {
    request r = prepared(what, 0, 0);
    check(MPI_Ibarrier(comm_, &r.handle_), r);
    wait(r);
  }
  // Divides values by the number of ranks: an all-reduced sum becomes the average. A division, not a product with
  // 1 / size, so that each average is the correctly rounded quotient (the same thing for a power-of-two size).
  template <class T>
  void divide(std::span<T> values) const {
    const T n = static_cast<T>(size_);
    if (size_ > 1)
      for (T& v : values) v /= n;
  }

  // Every rank's value, in rank order.
  std::vector<std::int64_t> all_gather(std::int64_t value, const char* what = "all_gather") {
    request r = prepared(what, 1, sizeof(std::int64_t));
    std::vector<std::int64_t> values(static_cast<std::size_t>(size_));
    check(MPI_Iallgather(&value, 1, MPI_INT64_T, values.data(), 1, MPI_INT64_T, comm_, &r.handle_), r);
    wait(r);
    return values;
  }
  // Fails on every rank, naming each rank's value, unless every rank passes the same value: the cheap check, before
  // buffers of some size are exchanged, that all ranks hold that size (a collective over buffers of different sizes
  // is undefined in MPI: it truncates, hangs or crashes).
  void check_same(std::int64_t value, const std::string& what) {
    const std::vector<std::int64_t> values = all_gather(value, "all_gather (checking that the ranks agree)");
    for (std::int64_t v : values)
      if (v != values.front()) {
        std::string each;
        for (std::size_t r = 0; r < values.size(); ++r)
          each += (r ? ", rank " : "rank ") + std::to_string(r) + " has " + std::to_string(values[r]);
        fail("process_group: expected every rank to have the same ", what, ", found ", each, " (seen from rank ",
             rank_, " of ", size_, ")");
      }
  }

  // The communicator, for a program's own MPI calls beside kiln's (they must not overlap a request of kiln's).
  MPI_Comm communicator() const { return comm_; }

 private:
  static void setup(int code, const char* call) {
    if (code != MPI_SUCCESS) fail("process_group: ", call, " failed: ", detail::mpi_error_text(code));
  }
  // A request for an operation about to start on a group that has not failed.
  request prepared(const char* what, std::size_t count, std::size_t bytes_each) const {
    request r;
    r.what_ = what;
    r.count_ = count;
    r.bytes_ = bytes_each;
    check_usable(r);
    return r;
  }
  // "all_reduce of 1000 values (4000 bytes)".
  static std::string describe(const request& r) {
    std::string text = r.what_;
    if (r.bytes_)
      text += " of " + std::to_string(r.count_) + " values (" + std::to_string(r.count_ * r.bytes_) + " bytes)";
    return text;
  }
  int mpi_count(const request& r) const {
    if (r.count_ > static_cast<std::size_t>(INT32_MAX))
      fail("process_group: ", describe(r), ": expected at most 2^31 - 1 values in one call");
    return static_cast<int>(r.count_);
  }
  void check_usable(const request& r) const {
    if (!failure_.empty())
      fail("process_group: cannot run ", describe(r), " on rank ", rank_, ": an earlier operation failed (", failure_,
           "), so this rank's collectives are out of step with its peers'");
  }
  void check(int code, const request& r) {
    if (code == MPI_SUCCESS) return;
    failure_ = describe(r) + " failed";
    fail("process_group: ", describe(r), " failed on rank ", rank_, " of ", size_, ": ",
         detail::mpi_error_text(code));
  }
  [[noreturn]] void timed_out(const request& r) {
    failure_ = describe(r) + " timed out";
    const double seconds = std::chrono::duration<double>(options_.timeout).count();
    fail("process_group: ", describe(r), " did not complete within the timeout of ", seconds, " s on rank ", rank_,
         " of ", size_, ": a peer exited early, stopped before this step, or posted another collective (a model of "
         "another size, fewer batches); every rank must run the same collectives in the same order");
  }

  process_group_options options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  bool serialized_threads_ = false;
  std::string failure_;
};

}  // namespace kiln::distributed
