// kiln::distributed::gradient_reducer: averages one flat buffer of gradients over the ranks of a process group, in
// buckets that start as soon as they are full.
//
// The backward pass finishes the gradients from the last layer down, so the caller reports ranges of the buffer from
// its end down (ready(first, count)); consecutive ranges are gathered into a bucket, a contiguous part of the buffer,
// until it holds bucket_bytes (the first bucket: first_bucket_bytes), and the bucket is then all-reduced in place by a
// non-blocking MPI_Iallreduce while the layers below are still in their backward. finish() reduces what is left, waits
// for every bucket and divides by the number of ranks. Nothing is copied: a bucket is a span of the buffer.
//
// Open MPI moves a non-blocking collective forward only inside MPI calls, and a layer's backward is one long call of
// kiln's own, so left alone a bucket started during the backward would mostly wait for finish(). With overlap on, a
// progress thread starts the buckets and polls them (MPI_Test, then a sleep of poll_interval) from begin() to the end
// of finish(), while the caller's thread runs the backward; it sleeps between steps. It needs MPI_THREAD_SERIALIZED
// (process_group asks for it); without it, the caller's thread polls at each ready() instead.
//
// Every rank must report the same ranges, which the same model does: the buckets, and so the collectives, then match
// rank for rank. Bits: an all-reduce over two ranks computes a + b, the same bits on both ranks and in either order;
// over more ranks MPI may add in another order on each rank (it does not promise otherwise), so the ranks' gradients,
// and then their parameters, can differ in the last bit. Dividing by a power of two is exact.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "kiln/core/config.hpp"
#include "kiln/core/error.hpp"
#include "kiln/distributed/process_group.hpp"

namespace kiln::distributed {

struct bucket_options {
  // Bytes of gradients in one all-reduce, as PyTorch DDP's bucket_cap_mb (25 MB): fewer, larger buckets cost less
  // per call, smaller ones start sooner behind the backward.
  index_t bucket_bytes = index_t(25) << 20;
  // The first bucket's cap, as DDP's first bucket (1 MiB): the last layers' gradients start moving while most of the
  // backward is still to run.
  index_t first_bucket_bytes = index_t(1) << 20;
  // Start each bucket as soon as it is full, during the backward (true), or all of them after it (false): the same
  // buckets and the same sums, for measuring what the overlap hides.
  bool overlap = true;
  // With overlap: a thread that moves the buckets forward during the backward (see the top of this file), polling
  // every poll_interval; off, the caller's thread polls at each ready().
  bool progress_thread = true;
  std::chrono::microseconds poll_interval{50};
};

template <class T>
class gradient_reducer {
 public:
  explicit gradient_reducer(process_group& group, bucket_options options = {}) : group_(&group), options_(options) {
    if (options_.bucket_bytes <= 0 || options_.first_bucket_bytes <= 0)
      fail("gradient_reducer: expected positive bucket sizes, found bucket_bytes ", options_.bucket_bytes,
           " and first_bucket_bytes ", options_.first_bucket_bytes);
    if (options_.overlap && options_.progress_thread && group.serialized_threads() && group.size() > 1)
      progress_ = std::thread([this] { progress(); });
  }
  gradient_reducer(const gradient_reducer&) = delete;
  gradient_reducer& operator=(const gradient_reducer&) = delete;
  ~gradient_reducer() {
    if (!progress_.joinable()) return;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    progress_.join();
  }

  // Starts a step over `gradients`, whose values will be reported final by ready() from the end down.
  void begin(std::span<T> gradients) {
    std::lock_guard lock(mutex_);
    if (active_)
      fail("gradient_reducer::begin: the previous step's buckets were never finished (finish() after each step)");
    gradients_ = gradients;
    top_ = bottom_ = static_cast<index_t>(gradients.size());
    buckets_.clear();
    visible_ = posted_ = completed_ = 0;
    finishing_ = done_ = false;
    active_ = true;
  }

  // Values [first, first + count) are final. They must lie right below the values reported before in this step.
  void ready(index_t first, index_t count) {
    if (count <= 0) return;
    if (first < 0 || first + count != bottom_)
      fail("gradient_reducer::ready: expected the values right below ", bottom_, " (ranges are reported from the end "
           "of the buffer down, without gaps), found [", first, ", ", first + count, ")");
    bottom_ = first;
    const index_t cap = buckets_.empty() ? options_.first_bucket_bytes : options_.bucket_bytes;
    if ((top_ - bottom_) * index_t(sizeof(T)) < cap) return;
    close_bucket();
    if (!options_.overlap) return;
    if (progress_.joinable()) {
      changed_.notify_all();
      return;
    }
    post_visible();
    // One poll of each bucket in flight per layer keeps them moving while the backward runs.
    for (std::size_t b = 0; b < posted_; ++b) group_->test(buckets_[b].request);
  }

  // Reduces the values not yet reported (none, when the backward reported all of them) and the last bucket, waits
  // for every bucket, and divides the sums by the number of ranks. wait_seconds() is then the time spent here.
  void finish() {
    const auto start = std::chrono::steady_clock::now();
    bottom_ = 0;
    if (top_ > bottom_) close_bucket();
    if (progress_.joinable()) {
      std::unique_lock lock(mutex_);
      finishing_ = true;
      finish_started_ = start;
      changed_.notify_all();
      changed_.wait(lock, [&] { return done_; });
      active_ = false;
      if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
    } else {
      post_visible();
      for (auto& bucket : buckets_) {
        group_->wait(bucket.request);
        group_->divide(span_of(bucket));
      }
      std::lock_guard lock(mutex_);
      active_ = false;
    }
    wait_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // After a step that threw before its finish(): forgets the step if none of its buckets had closed (the model
  // refused the batch before its backward), so that the next step can begin. Otherwise this rank's collectives are out
  // of step with its peers', and the next begin() says so.
  void cancel() {
    std::lock_guard lock(mutex_);
    if (buckets_.empty()) active_ = false;
  }

  // Runs collective(), a blocking collective of the caller's own over the same group, in the middle of a step (a
  // SyncBatchNorm's sums, in the forward or the backward; dynamic_data_parallel::average() between its backward and
  // reduce_gradients()), where it stays in step with the buckets on every rank: the buckets closed so far start first
  // (by then every rank has closed the same ones, through the same ready() calls), then collective() runs while the
  // progress thread makes no MPI call (MPI_THREAD_SERIALIZED: one thread at a time). Outside a step it just runs
  // collective().
  template <class Collective>
  void within_step(Collective&& collective) {
    std::lock_guard lock(mutex_);
    if (active_ && options_.overlap) post_visible();
    collective();
  }

  // The buckets of the last step, and the time its finish() took (the part of the all-reduces not hidden).
  std::size_t bucket_count() const { return buckets_.size(); }
  double wait_seconds() const { return wait_seconds_; }
  const bucket_options& options() const { return options_; }

 private:
  struct bucket {
    index_t first = 0, count = 0;
    process_group::request request;
  };
  std::span<T> span_of(const bucket& b) const {
    return gradients_.subspan(static_cast<std::size_t>(b.first), static_cast<std::size_t>(b.count));
  }
  // Ends the open bucket at bottom_; with overlap, it may start now.
  void close_bucket() {
    std::lock_guard lock(mutex_);
    buckets_.push_back({bottom_, top_ - bottom_, {}});
    top_ = bottom_;
    if (options_.overlap) visible_ = buckets_.size();
  }
  // Starts the buckets not started yet (on the caller's thread).
  void post_visible() {
    visible_ = buckets_.size();
    for (; posted_ < visible_; ++posted_)
      buckets_[posted_].request = group_->start_all_reduce(span_of(buckets_[posted_]), "gradient bucket");
  }

  // The progress thread: starts each bucket once it is closed, polls those in flight every poll_interval, divides
  // each sum as it arrives, and tells finish() once every bucket is done (or the first error). From a step's begin()
  // to the end of its finish() it calls MPI only under mutex_, and the caller's thread only inside within_step(),
  // which holds it.
  void progress() {
    std::unique_lock lock(mutex_);
    for (;;) {
      // Asleep between steps; while buckets are in flight, awake every poll_interval, or at once for a new bucket;
      // once finish() waits, polling without a pause (the caller's thread sleeps then).
      const auto has_work = [&] { return stopping_ || (active_ && !done_ && (visible_ > posted_ || finishing_)); };
      if (active_ && !done_ && posted_ > completed_) changed_.wait_for(lock, options_.poll_interval, has_work);
      else changed_.wait(lock, has_work);
      if (stopping_) return;
      if (!active_ || done_) continue;
      try {
        while (posted_ < visible_) {
          bucket& b = buckets_[posted_];  // buckets_ only grows under the lock, and not while it is held here
          b.request = group_->start_all_reduce(span_of(b), "gradient bucket");
          ++posted_;
        }
        // The timeout runs from finish(): before it, the backward may take any time.
        const auto deadline = finishing_ ? finish_started_ + group_->options().timeout
                                         : std::chrono::steady_clock::time_point::max();
        for (std::size_t i = 0; i < posted_; ++i) {
          bucket& b = buckets_[i];
          if (b.request.pending() && group_->poll(b.request, deadline)) {
            group_->divide(span_of(b));
            ++completed_;
          }
        }
        if (finishing_ && completed_ == buckets_.size()) {
          done_ = true;
          changed_.notify_all();
        }
      } catch (...) {
        failure_ = std::current_exception();
        done_ = true;
        changed_.notify_all();
      }
    }
  }

  process_group* group_;
  bucket_options options_;
  std::span<T> gradients_;
  index_t top_ = 0, bottom_ = 0;  // the open bucket is [bottom_, top_); values below bottom_ are not final yet
  std::vector<bucket> buckets_;   // this step's, top of the buffer first; cleared, not freed, between steps
  std::size_t visible_ = 0;       // buckets that may start
  std::size_t posted_ = 0;        // buckets started
  std::size_t completed_ = 0;     // buckets reduced (by the progress thread)
  double wait_seconds_ = 0;

  // Shared with the progress thread, under mutex_ (buckets_ and the counts above too, while it runs).
  std::thread progress_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool active_ = false, finishing_ = false, done_ = false, stopping_ = false;
  std::chrono::steady_clock::time_point finish_started_;
  std::exception_ptr failure_;
};

}  // namespace kiln::distributed
