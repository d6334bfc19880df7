// data_loader: batches of a dataset, shuffled per epoch, transformed per sample, optionally assembled ahead of time by
// a background thread. Every batch is written into buffers allocated once, at construction.
//
//   data_loader loader(train, {.batch_size = 64, .seed = 1, .prefetch = 2, .transform = compose(random_shift{2})});
//   for (int e = 0; e < epochs; ++e)
//     for (const auto& batch : loader.epoch(e))      // or: loader.start_epoch(e); while (auto* b = loader.next()) ...
//       step(batch.x, batch.y);                       // views valid until the next batch is requested
//
// Reproducibility: the order of epoch e is a Fisher-Yates shuffle drawn from random_generator(seed) forked to a stream
// that depends on e alone, and the augmentation of sample i in epoch e draws from a stream that depends on (e, i) alone.
// So the batches are the same whatever the prefetch depth, the thread count or the timing.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/data/transforms.hpp"

namespace kiln::data {

// How a data_loader batches. Feature type T is the data set's, so the transform can work on its samples in place.
template <class T>
struct loader_options {
  index_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = false;        // drop a last batch smaller than batch_size
  std::uint64_t seed = 0;        // fixes the order of every epoch and every augmentation draw
  int prefetch = 0;              // batches assembled ahead by a background thread; 0: assembled in next()
  int threads = 1;               // threads that copy and transform the samples of one batch (OpenMP)
  transform_fn<T> transform{};   // applied in place to every sample's features; labels are never touched
};

// The random streams under the loader's seed: shuffling uses the top bit, augmentation the rest, so they never meet.
inline std::uint64_t shuffle_stream(std::uint64_t epoch) { return (std::uint64_t{1} << 63) | epoch; }
inline std::uint64_t augment_stream(std::uint64_t epoch, index_t sample) {
  return ((epoch & 0x7FFFFFFFull) << 32) ^ static_cast<std::uint64_t>(sample);
}

// The bytes of one batch's features below which a data_loader copies them on one thread: a parallel region costs
// a few microseconds, about what copying 16 KiB from memory takes.
inline constexpr index_t parallel_copy_bytes = index_t(32) << 10;

// Iterates a dataset in batches; see the top of this file. The data set is referenced, not copied: it must outlive
// the loader. One epoch at a time: start_epoch (or epoch()) abandons an epoch in progress, as does destruction.
template <dataset D>
class data_loader {
 public:
  using feature_type = typename D::feature_type;
  using label_type = typename D::label_type;

  // One batch: the first `size` rows of the loader's buffers, and which samples they hold.
  struct batch {
    tensor_view<const feature_type> x;  // (size, sample_shape...)
    tensor_view<const label_type> y;    // (size, label_shape...)
    index_t size = 0;
    index_t index = 0;                  // position of this batch in its epoch
    std::span<const index_t> samples;   // data set indices of the rows
  };

  KILN_KERNEL data_loader(const D& data, loader_options<feature_type> options = {})
      : data_(&data), options_(std::move(options)) {
    if (options_.batch_size <= 0) fail("data_loader: batch_size must be positive, found ", options_.batch_size);
    if (options_.prefetch < 0) fail("data_loader: prefetch must be >= 0, found ", options_.prefetch);
    if (options_.threads < 1) options_.threads = 1;
    const index_t n = data.size();
    order_.resize(static_cast<std::size_t>(n));
    // No batch holds more rows than the data set has, and no epoch has more batches to prefetch than it has
    // batches: a batch_size or prefetch far beyond the data (a "whole data set in one batch" 1 << 40) plans buffers
    // for what can happen, not for the number asked.
    const index_t rows = std::min(options_.batch_size, std::max<index_t>(n, 1));
    const index_t slots = std::min<index_t>(options_.prefetch, batches_per_epoch()) + 1;
    shape xs{rows}, ys{rows};
    for (index_t e : data.sample_shape()) xs.push_back(e);
    for (index_t e : data.label_shape()) ys.push_back(e);
    slots_.resize(static_cast<std::size_t>(slots));
    for (auto& s : slots_) {
      s.x = Tensor<feature_type>(xs);
      s.y = Tensor<label_type>(ys);
    }
    contexts_.resize(static_cast<std::size_t>(options_.threads));
  }
  data_loader(const data_loader&) = delete;
  data_loader& operator=(const data_loader&) = delete;
  ~data_loader() { stop(); }

  index_t size() const { return data_->size(); }
  index_t batch_size() const { return options_.batch_size; }
  index_t batches_per_epoch() const {
    const index_t n = data_->size(), b = options_.batch_size;
    return options_.drop_last ? n / b : (n + b - 1) / b;
  }
  const loader_options<feature_type>& options() const { return options_; }

  // Begins epoch `epoch` (any number; the same number gives the same batches). Stops an epoch in progress.
  KILN_KERNEL void start_epoch(std::uint64_t epoch) {
    stop();
    epoch_ = epoch;
    for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<index_t>(i);
    if (options_.shuffle && order_.size() > 1) {
      random_generator rng = random_generator(options_.seed).fork(shuffle_stream(epoch));
      for (std::size_t i = order_.size() - 1; i > 0; --i) std::swap(order_[i], order_[rng.below(i + 1)]);
    }
    count_ = batches_per_epoch();
    consumed_ = 0;
    produced_ = 0;
    released_ = 0;
    failure_ = nullptr;
    failed_batch_ = -1;
    stopping_ = false;
    started_ = true;
    if (options_.prefetch > 0 && count_ > 0) worker_ = std::thread([this] { produce(); });
  }

  // The next batch of the current epoch, or nullptr at its end. The batch stays valid until the next call.
  // An exception thrown by the data set or a transform is rethrown here, at the batch it happened in.
  KILN_KERNEL const batch* next() {
    if (!started_) fail("data_loader::next: call start_epoch(e) or epoch(e) first");
    if (options_.prefetch == 0) {
      if (consumed_ >= count_) return nullptr;
      slot& s = slots_[0];
      fill(s, consumed_++);
      return &s.view;
    }
    std::unique_lock lock(mutex_);
    released_ = consumed_;  // the batch returned last time is the caller's no more
    changed_.notify_all();
    if (consumed_ >= count_) return nullptr;
    changed_.wait(lock, [&] { return produced_ > consumed_ || failed_batch_ == consumed_; });
    if (failed_batch_ == consumed_) {
      count_ = consumed_;  // the epoch ends here
      std::rethrow_exception(failure_);
    }
    slot& s = slots_[static_cast<std::size_t>(consumed_ % static_cast<index_t>(slots_.size()))];
    ++consumed_;
    return &s.view;
  }

  // for (const auto& b : loader.epoch(e)): a single-pass range over the batches of epoch e.
  class epoch_range {
   public:
    struct sentinel {};
    class iterator {
     public:
      using value_type = batch;
      using difference_type = std::ptrdiff_t;
      iterator() = default;
      explicit iterator(data_loader* l) : loader_(l), current_(l->next()) {}
      const batch& operator*() const { return *current_; }
      const batch* operator->() const { return current_; }
      iterator& operator++() {
        current_ = loader_->next();
        return *this;
      }
      void operator++(int) { ++*this; }
      friend bool operator==(const iterator& it, sentinel) { return it.current_ == nullptr; }

     private:
      data_loader* loader_ = nullptr;
      const batch* current_ = nullptr;
    };
    explicit epoch_range(data_loader* l) : loader_(l) {}
    iterator begin() { return iterator(loader_); }
    sentinel end() { return {}; }

   private:
    data_loader* loader_;
  };
  epoch_range epoch(std::uint64_t e) {
    start_epoch(e);
    return epoch_range(this);
  }

 private:
  struct slot {
    Tensor<feature_type> x;
    Tensor<label_type> y;
    batch view;
  };

  // Assembles batch b of the current epoch into slot s: copy each sample, then transform it with its own stream.
  KILN_KERNEL void fill(slot& s, index_t b) {
    const index_t first = b * options_.batch_size;
    const index_t rows = std::min(options_.batch_size, data_->size() - first);
    const shape sample = data_->sample_shape(), label = data_->label_shape();
    const index_t* indices = order_.data() + first;
    std::exception_ptr error;
    auto one = [&](index_t k, transform_context& ctx) {
      auto x = s.x.rows(k, 1).reshaped(sample);
      data_->get(indices[k], x, s.y.rows(k, 1).reshaped(label));
      if (options_.transform) {
        ctx.rng = random_generator(options_.seed, augment_stream(epoch_, indices[k]));
        options_.transform(x, ctx);
      }
    };
#if defined(_OPENMP)
    // Plain copies are shared out only when there are enough bytes to pay for the parallel region. Each thread then
    // copies one contiguous range of rows, and those rows are in its own core's cache when the step starts: the batch
    // is assembled sooner, and the first layer reads only the other threads' rows from their cores' caches rather than
    // all of the batch (bench/RESULTS.md).
    const bool worth_sharing =
        options_.transform || rows * s.x.shape().row_size() * index_t(sizeof(feature_type)) >= parallel_copy_bytes;
    if (options_.threads > 1 && rows > 1 && worth_sharing) {
#pragma omp parallel for num_threads(options_.threads) schedule(static)
      for (index_t k = 0; k < rows; ++k) {
        try {
          one(k, contexts_[static_cast<std::size_t>(omp_get_thread_num())]);
        } catch (...) {
#pragma omp critical(kiln_data_loader_error)
          if (!error) error = std::current_exception();
        }
      }
      if (error) std::rethrow_exception(error);
    } else
#endif
    {
      for (index_t k = 0; k < rows; ++k) one(k, contexts_[0]);
    }
    s.view = batch{tensor_view<const feature_type>(s.x.data(), s.x.shape().with_batch(rows)),
                   tensor_view<const label_type>(s.y.data(), s.y.shape().with_batch(rows)), rows, b,
                   std::span<const index_t>(indices, static_cast<std::size_t>(rows))};
  }

  // The background thread: fills batch b once the caller has released the batch that used its slot before.
  KILN_KERNEL void produce() {
    const auto depth = static_cast<index_t>(slots_.size());
    for (index_t b = 0; b < count_; ++b) {
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || b < released_ + depth; });
        if (stopping_) return;
      }
      try {
        fill(slots_[static_cast<std::size_t>(b % depth)], b);
      } catch (...) {
        std::lock_guard lock(mutex_);
        failure_ = std::current_exception();
        failed_batch_ = b;
        changed_.notify_all();
        return;
      }
      std::lock_guard lock(mutex_);
      produced_ = b + 1;
      changed_.notify_all();
    }
  }

  KILN_KERNEL void stop() {
    if (worker_.joinable()) {
      {
        std::lock_guard lock(mutex_);
        stopping_ = true;
      }
      changed_.notify_all();
      worker_.join();
    }
  }

  const D* data_;
  loader_options<feature_type> options_;
  std::vector<index_t> order_;
  std::vector<slot> slots_;
  std::vector<transform_context> contexts_;
  std::uint64_t epoch_ = 0;
  bool started_ = false;
  index_t count_ = 0, consumed_ = 0;

  std::thread worker_;
  std::mutex mutex_;
  std::condition_variable changed_;
  index_t produced_ = 0, released_ = 0, failed_batch_ = -1;
  bool stopping_ = false;
  std::exception_ptr failure_;
};

}  // namespace kiln::data

#include "kiln/data/compiled_loaders.hpp"
