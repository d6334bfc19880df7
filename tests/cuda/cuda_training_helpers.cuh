// Helpers of the CUDA training tests: random batches of a sample shape, and the losses of a static model trained on
// them with Adam, so that one model can be compared across policies and modes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cuda_test_helpers.cuh"
#include "kiln/kiln.hpp"

namespace kiln::cuda_test {

// The batch size of the training tests.
inline constexpr index_t training_batch = 32;

// Random inputs in [-1, 1) and labels 0..9 for `samples` samples of sample_shape.
struct batch_data {
  Tensor<float> x;
  Tensor<std::int64_t> y;
};
inline batch_data make_data(shape sample_shape, index_t samples, std::uint64_t seed) {
  shape full{samples};
  for (index_t e : sample_shape) full.push_back(e);
  auto values = random_values<float>(full.numel(), seed);
  batch_data d{Tensor<float>(full, std::span<const float>(values)), Tensor<std::int64_t>(shape{samples})};
  for (index_t i = 0; i < samples; ++i) d.y[i] = (i * 7 + 3) % 10;
  return d;
}

// Losses of `steps` Adam steps (lr 1e-3) of a static model over the data's batches in order (host data, staged by the
// model).
template <class Net>
std::vector<float> train_losses(Net& net, const batch_data& d, int steps) {
  optim::basic_adam<float, typename Net::policy> adam({.lr = 1e-3});
  const index_t batches = d.x.extent(0) / training_batch;
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    const index_t first = (s % batches) * training_batch;
    losses.push_back(
        net.train_step(d.x.rows(first, training_batch), d.y.rows(first, training_batch), loss::cross_entropy{}, adam));
  }
  return losses;
}

}  // namespace kiln::cuda_test
