// Finite-difference gradient checks in double for dynamic-mode code: random leaves, central differences of a scalar
// function of them against the gradients backward() leaves, and a weighted sum that turns any output into a scalar
// whose gradient reaches every element differently.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/dynamic/nn.hpp"

namespace kiln::test {

using double_variable = nn::basic_variable<double>;

// A leaf of the given shape with values from N(0, scale^2), requiring grad.
inline double_variable random_leaf(const shape& s, std::uint64_t seed, double scale = 1.0) {
  random_generator rng(seed);
  Tensor<double> t(s);
  for (auto& v : t.span()) v = scale * rng.normal<double>();
  return double_variable(t, true);
}

// d f() / d leaf against central differences (step 1e-6) for every element of every leaf, within tolerance of
// max(1, |numeric|, |analytic|). f is called again for each perturbation, under no_grad.
inline void check_gradients(const std::vector<double_variable>& leaves, const std::function<double_variable()>& f,
                            double tolerance = 1e-6) {
  for (const auto& leaf : leaves) leaf.zero_grad();
  f().backward();
  for (std::size_t l = 0; l < leaves.size(); ++l) {
    auto value = leaves[l].value();
    auto grad = leaves[l].grad();
    for (index_t i = 0; i < leaves[l].numel(); ++i) {
      const double saved = value[i];
      double plus, minus;
      {
        nn::no_grad guard;
        value[i] = saved + 1e-6;
        plus = f().item();
        value[i] = saved - 1e-6;
        minus = f().item();
        value[i] = saved;
      }
      const double numeric = (plus - minus) / 2e-6, analytic = grad[i];
      INFO("leaf ", l, " element ", i, ": analytic ", analytic, ", numeric ", numeric);
      CHECK(std::abs(analytic - numeric) <= tolerance * std::max({1.0, std::abs(numeric), std::abs(analytic)}));
    }
  }
}

// sum(y * w) for fixed random weights w.
inline double_variable weighted_sum(const double_variable& y, std::uint64_t seed = 99) {
  random_generator rng(seed);
  Tensor<double> w(y.shape());
  for (auto& v : w.span()) v = rng.normal<double>();
  return nn::sum(nn::mul(y, double_variable(w)));
}

}  // namespace kiln::test
