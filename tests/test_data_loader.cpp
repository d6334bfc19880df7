// data_loader and transforms: every sample once per epoch, reproducible orders and augmentations whatever the prefetch
// depth or thread count, clean shutdown mid-epoch, errors carried to the caller, labels and shapes kept.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "allocation_counter.hpp"
#include "kiln/data/data_loader.hpp"
#include "kiln/data/transforms.hpp"

using namespace kiln;
using namespace kiln::data;

namespace {

// Sample i is an (H, W) image holding i + pixel / 1000 with label i % 10, so each row says which sample it is.
tensor_dataset<float, std::int64_t> numbered(index_t n, index_t h = 4, index_t w = 5) {
  Tensor<float> x(shape{n, h, w});
  Tensor<std::int64_t> y(shape{n});
  for (index_t i = 0; i < n; ++i) {
    for (index_t p = 0; p < h * w; ++p) x[i * h * w + p] = static_cast<float>(i) + static_cast<float>(p) / 1000.0f;
    y[i] = i % 10;
  }
  return {std::move(x), std::move(y)};
}

// Every batch of an epoch, flattened: the sample indices and the feature values in order.
struct epoch_record {
  std::vector<index_t> samples;
  std::vector<float> values;
  std::vector<index_t> sizes;
};
template <class D>
epoch_record run_epoch(data_loader<D>& loader, std::uint64_t e) {
  epoch_record r;
  for (const auto& batch : loader.epoch(e)) {
    r.sizes.push_back(batch.size);
    r.samples.insert(r.samples.end(), batch.samples.begin(), batch.samples.end());
    r.values.insert(r.values.end(), batch.x.span().begin(), batch.x.span().end());
    for (index_t k = 0; k < batch.size; ++k) CHECK(batch.y[k] == batch.samples[static_cast<std::size_t>(k)] % 10);
  }
  return r;
}
}  // namespace

TEST_CASE("tensor_dataset satisfies the dataset concept and copies samples") {
  static_assert(dataset<tensor_dataset<float, std::int64_t>>);
  auto d = numbered(7);
  CHECK(d.size() == 7);
  CHECK(d.sample_shape() == shape{4, 5});
  Tensor<float> x(shape{3, 4, 5});
  Tensor<std::int64_t> y(shape{3});
  std::vector<index_t> idx{6, 0, 3};
  get_batch(d, idx, x.view(), y.view());
  CHECK(x.at(0, 0, 0) == 6.0f);
  CHECK(x.at(2, 3, 4) == doctest::Approx(3.019f));
  CHECK(y[0] == 6);
  CHECK_THROWS_AS(d.get(7, x.rows(0, 1).reshaped(shape{4, 5}), y.rows(0, 1).reshaped(shape{})), kiln::error);
  CHECK_THROWS_AS((tensor_dataset<float, std::int64_t>(Tensor<float>(shape{3, 2}), Tensor<std::int64_t>(shape{4}))),
                  kiln::error);
  // Regression targets: (N, 2) labels.
  tensor_dataset<double, double> reg(Tensor<double>(shape{4, 3}), Tensor<double>(shape{4, 2}, 1.5));
  CHECK(reg.label_shape() == shape{2});
  data_loader loader(reg, {.batch_size = 3});
  auto* b = (loader.start_epoch(0), loader.next());
  REQUIRE(b);
  CHECK(b->y.shape() == shape{3, 2});
}

TEST_CASE("data_loader: every sample exactly once, batch sizes, drop_last") {
  auto d = numbered(103);
  for (bool drop : {false, true})
    for (int prefetch : {0, 1, 3}) {
      data_loader loader(d, {.batch_size = 10, .drop_last = drop, .seed = 5, .prefetch = prefetch});
      CHECK(loader.batches_per_epoch() == (drop ? 10 : 11));
      auto r = run_epoch(loader, 0);
      CHECK(static_cast<index_t>(r.sizes.size()) == loader.batches_per_epoch());
      CHECK(r.sizes.front() == 10);
      CHECK(r.sizes.back() == (drop ? 10 : 3));
      std::set<index_t> unique(r.samples.begin(), r.samples.end());
      CHECK(unique.size() == r.samples.size());
      CHECK(r.samples.size() == (drop ? 100u : 103u));
      for (std::size_t k = 0; k < r.samples.size(); ++k)  // the rows hold the samples the batch says they hold
        CHECK(r.values[k * 20] == static_cast<float>(r.samples[k]));
    }
  data_loader plain(d, {.batch_size = 50, .shuffle = false});
  auto r = run_epoch(plain, 9);
  for (std::size_t k = 0; k < r.samples.size(); ++k) CHECK(r.samples[k] == static_cast<index_t>(k));
}

TEST_CASE("data_loader: same order for the same seed and epoch, another next epoch, prefetch does not matter") {
  auto d = numbered(257);
  auto augment = compose(random_shift{1}, gaussian_noise{0.05f});
  data_loader a(d, {.batch_size = 16, .seed = 42, .transform = augment});
  data_loader b(d, {.batch_size = 16, .seed = 42, .prefetch = 2, .transform = augment});
  data_loader c(d, {.batch_size = 16, .seed = 42, .prefetch = 4, .threads = 3, .transform = augment});
  data_loader other_seed(d, {.batch_size = 16, .seed = 43, .transform = augment});
  auto a0 = run_epoch(a, 0), a1 = run_epoch(a, 1);
  auto b0 = run_epoch(b, 0), b1 = run_epoch(b, 1);
  auto c1 = run_epoch(c, 1), c0 = run_epoch(c, 0);  // epochs in another order
  CHECK(a0.samples == b0.samples);
  CHECK(a0.values == b0.values);
  CHECK(a0.values == c0.values);
  CHECK(a1.values == b1.values);
  CHECK(a1.values == c1.values);
  CHECK(a0.samples != a1.samples);
  CHECK(a0.samples != run_epoch(other_seed, 0).samples);
  CHECK(run_epoch(a, 0).values == a0.values);  // replaying an epoch replays its augmentation
}

TEST_CASE("data_loader: plain batches large enough to copy on several threads hold the same rows") {
  // 64 samples of 28 x 28 floats (196 KiB) are shared out over the threads; 16 of 4 x 5 (1.25 KiB) are not.
  for (index_t side : {28, 4}) {
    auto d = numbered(300, side, side);
    data_loader one(d, {.batch_size = 64, .seed = 7});
    data_loader two(d, {.batch_size = 64, .seed = 7, .threads = 2});
    data_loader three_prefetched(d, {.batch_size = 64, .seed = 7, .prefetch = 2, .threads = 3});
    const auto expected = run_epoch(one, 3);
    CHECK(expected.values.size() == std::size_t(300 * side * side));
    CHECK(run_epoch(two, 3).values == expected.values);
    CHECK(run_epoch(three_prefetched, 3).values == expected.values);
    // The short last batch (300 = 4 x 64 + 44) too.
    CHECK(expected.sizes.back() == 44);
  }
}

TEST_CASE("data_loader: no heap allocation per batch in the steady state") {
  auto d = numbered(640, 28, 28);
  for (int prefetch : {0, 2}) {
    data_loader loader(d, {.batch_size = 64, .seed = 1, .prefetch = prefetch,
                           .transform = compose(random_shift{2}, random_rotation{10}, gaussian_noise{0.1f})});
    loader.start_epoch(0);
    while (loader.next()) {
    }
    loader.start_epoch(1);
    loader.next();  // the first batch, thread start-up and the scratch buffers may allocate
    loader.next();
    const long long before = kiln_test::heap_allocations.load();
    int batches = 0;
    while (loader.next()) ++batches;
    CHECK(batches == 8);
    CHECK(kiln_test::heap_allocations.load() - before == 0);
  }
}

TEST_CASE("data_loader: destroyed or restarted mid-epoch, errors reach the caller") {
  auto d = numbered(1000);
  for (int round = 0; round < 20; ++round) {
    data_loader loader(d, {.batch_size = 7, .seed = 3, .prefetch = 1 + round % 4});
    loader.start_epoch(0);
    for (int k = 0; k < round % 5; ++k) REQUIRE(loader.next());
    if (round % 2) loader.start_epoch(1);  // abandons epoch 0
  }                                        // destroyed with the worker possibly blocked on a full queue
  data_loader loader(d, {.batch_size = 10, .prefetch = 2});
  CHECK_THROWS_AS(loader.next(), kiln::error);  // no epoch started
  int calls = 0;
  data_loader failing(d, {.batch_size = 10, .shuffle = false, .prefetch = 2,
                          .transform = [&calls](tensor_view<float>, transform_context&) {
                            if (++calls == 35) fail("transform failed on purpose");
                          }});
  failing.start_epoch(0);
  int good = 0;
  try {
    while (failing.next()) ++good;
    FAIL("expected an exception");
  } catch (const kiln::error& e) {
    CHECK(std::string(e.what()) == "transform failed on purpose");
  }
  CHECK(good == 3);  // batches 0-2 were complete; the failure happened in batch 3
  CHECK(failing.next() == nullptr);
  calls = 1000;
  CHECK(run_epoch(failing, 1).samples.size() == 1000);  // a new epoch works again
}

TEST_CASE("transforms: labels and shapes kept, values plausible, deterministic per stream") {
  auto d = numbered(64, 28, 28);
  data_loader loader(d, {.batch_size = 64, .shuffle = false, .seed = 7,
                         .transform = compose(random_shift{3}, random_rotation{15}, random_hflip{0.5f},
                                              gaussian_noise{0.01f}, normalize{0.5f, 2.0f})});
  for (const auto& batch : loader.epoch(0)) {
    CHECK(batch.x.shape() == shape{64, 28, 28});
    CHECK(batch.y.shape() == shape{64});
    for (index_t k = 0; k < 64; ++k) CHECK(batch.y[k] == k % 10);
    for (float v : batch.x.span()) CHECK(std::isfinite(v));
  }
  // random_shift moves the picture by at most pad pixels and fills with zeros.
  Tensor<float> img(shape{1, 5, 5}, 0.0f);
  img.at(0, 2, 2) = 1.0f;
  transform_context ctx{random_generator(1)};
  std::set<std::pair<int, int>> seen;
  for (int t = 0; t < 200; ++t) {
    Tensor<float> copy = img;
    random_shift{1}(copy.view(), ctx);
    float total = 0;
    for (int r = 0; r < 5; ++r)
      for (int c = 0; c < 5; ++c)
        if (copy.at(0, r, c) == 1.0f) seen.insert({r, c});
    for (float v : copy.span()) total += v;
    CHECK(total == 1.0f);
  }
  CHECK(seen.size() == 9);  // every shift in [-1, 1]^2
  // A rotation by 0 degrees is the identity; by 90 degrees it moves a corner pixel to another corner.
  Tensor<float> square(shape{3, 3}, {1, 0, 0, 0, 0, 0, 0, 0, 0});
  Tensor<float> same = square;
  random_rotation{0.0f}(same.view(), ctx);
  for (index_t i = 0; i < 9; ++i) CHECK(same[i] == doctest::Approx(square[i]).epsilon(1e-6));
  // The flip with p = 1 mirrors every row of every channel.
  Tensor<float> rows(shape{2, 1, 3}, {1, 2, 3, 4, 5, 6});
  random_hflip{1.0f}(rows.view(), ctx);
  CHECK(rows.span()[0] == 3.0f);
  CHECK(rows.span()[5] == 4.0f);
  // Noise of std s has roughly that standard deviation.
  Tensor<float> zeros(shape{100, 100});
  gaussian_noise{0.5f}(zeros.view(), ctx);
  double sum2 = 0;
  for (float v : zeros.span()) sum2 += double(v) * v;
  CHECK(std::sqrt(sum2 / 10000) == doctest::Approx(0.5).epsilon(0.05));
  CHECK_THROWS_AS(random_shift{1}(Tensor<float>(shape{4}).view(), ctx), kiln::error);
}

TEST_CASE("data_loader: a batch or a prefetch depth beyond the data set plans for the data set") {
  auto d = numbered(7);
  // Buffers were sized by the numbers asked for: 2^40 rows (or 2^30 slots) of 20 floats each.
  for (auto [batch, prefetch] : {std::pair<index_t, int>{index_t{1} << 40, 0}, {index_t{1} << 40, 2}, {3, 1 << 30}}) {
    data_loader loader(d, {.batch_size = batch, .seed = 1, .prefetch = prefetch});
    auto r = run_epoch(loader, 0);
    CHECK(r.samples.size() == 7u);
    CHECK(std::set<index_t>(r.samples.begin(), r.samples.end()).size() == 7u);
    CHECK(r.sizes.front() == std::min<index_t>(batch, 7));
  }
}

TEST_CASE("transforms: parameters that cannot work are refused") {
  Tensor<float> image(shape{4, 5}, 1.0f);
  transform_context ctx;
  CHECK_THROWS_WITH_AS(random_shift{-2}(image.view(), ctx), doctest::Contains("pad in [0, 2^30]"), kiln::error);
  CHECK_THROWS_WITH_AS((normalize{0.5f, 0.0f}(image.view(), ctx)), doctest::Contains("positive, finite std"),
                       kiln::error);
  CHECK_THROWS_AS((normalize{std::nanf(""), 1.0f}(image.view(), ctx)), kiln::error);
  CHECK_THROWS_WITH_AS(gaussian_noise{-1.0f}(image.view(), ctx), doctest::Contains("std >= 0"), kiln::error);
  for (float v : image.span()) CHECK(v == 1.0f);  // refused before touching the sample
}
