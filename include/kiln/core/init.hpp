// Weight initialisations with PyTorch's formulas: its Linear default (Kaiming-uniform with a = sqrt(5), uniform bias),
// Xavier/Glorot uniform and normal, Kaiming normal, plain normal and uniform.
#pragma once

#include <cmath>
#include <span>

#include "kiln/core/random.hpp"

namespace kiln::init {

template <class T>
void uniform(std::span<T> values, T low, T high, random_generator& rng) {
  for (T& v : values) v = rng.uniform<T>(low, high);
}
template <class T>
void normal(std::span<T> values, T mean, T stddev, random_generator& rng) {
  for (T& v : values) v = rng.normal<T>(mean, stddev);
}
template <class T>
void constant(std::span<T> values, T value) {
  for (T& v : values) v = value;
}

// PyTorch's nn.Linear weight default: kaiming_uniform_(a = sqrt(5)), which reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
template <class T>
void linear_weight_default(std::span<T> weight, index_t fan_in, random_generator& rng) {
  T gain = static_cast<T>(std::sqrt(2.0 / (1.0 + 5.0)));
  T bound = static_cast<T>(std::sqrt(3.0)) * gain / static_cast<T>(std::sqrt(static_cast<double>(fan_in)));
  uniform(weight, -bound, bound, rng);
}
// PyTorch's nn.Linear bias default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
template <class T>
void linear_bias_default(std::span<T> bias, index_t fan_in, random_generator& rng) {
  T bound = fan_in > 0 ? static_cast<T>(1.0 / std::sqrt(static_cast<double>(fan_in))) : T(0);
  uniform(bias, -bound, bound, rng);
}
// Glorot & Bengio (2010): U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)).
template <class T>
void xavier_uniform(std::span<T> weight, index_t fan_in, index_t fan_out, random_generator& rng, T gain = T(1)) {
  T bound = gain * static_cast<T>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
  uniform(weight, -bound, bound, rng);
}
// N(0, gain^2 * 2 / (fan_in + fan_out)).
template <class T>
void xavier_normal(std::span<T> weight, index_t fan_in, index_t fan_out, random_generator& rng, T gain = T(1)) {
  normal(weight, T(0), gain * static_cast<T>(std::sqrt(2.0 / static_cast<double>(fan_in + fan_out))), rng);
}
// He et al. (2015) for ReLU networks: N(0, 2 / fan_in).
template <class T>
void kaiming_normal(std::span<T> weight, index_t fan_in, random_generator& rng) {
  normal(weight, T(0), static_cast<T>(std::sqrt(2.0 / static_cast<double>(fan_in))), rng);
}

}  // namespace kiln::init
