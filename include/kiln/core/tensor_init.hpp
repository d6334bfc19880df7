// Initialisers over whole weight tensors, with torch.nn.init's formulas and Keras' named initialisers: the fans come
// from the tensor's shape, so the same call serves a Dense weight (out, in), a convolution's (out, in / groups, kh, kw)
// and a recurrent layer's (gates * hidden, in). Each fills the tensor in place from the generator it is given; the
// dynamic-mode forms over nn::Variable are in kiln/dynamic/init.hpp, and static mode's tensors are
// Sequential::parameter(name). As in torch, a tensor without elements is left as it is.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/init.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::init {

// A weight's fan-in and fan-out by PyTorch's rule: dimension 1 counts the inputs and dimension 0 the outputs, and
// the dimensions after them (a convolution's kernel window) multiply both.
struct fans {
  index_t in = 0, out = 0;
};
inline fans fans_of(const shape& s, const char* who = "init") {
  if (s.rank() < 2)
    fail(who, ": expected a weight of rank 2 or more to compute its fans, found shape ", s);
  index_t window = 1;
  for (int d = 2; d < s.rank(); ++d) window *= s[d];
  return {s[1] * window, s[0] * window};
}

// The nonlinearity a layer's output goes through, for the gain that keeps the activations' variance.
enum class nonlinearity { linear, conv, sigmoid, tanh, relu, leaky_relu, selu };

// torch.nn.init.calculate_gain: 1 for linear, convolution and sigmoid, 5/3 for tanh, sqrt(2) for ReLU,
// sqrt(2 / (1 + slope^2)) for a leaky ReLU of that negative slope, 3/4 for SELU.
inline double calculate_gain(nonlinearity n, double negative_slope = 0.01) {
  switch (n) {
    case nonlinearity::linear:
    case nonlinearity::conv:
    case nonlinearity::sigmoid: return 1.0;
    case nonlinearity::tanh: return 5.0 / 3.0;
    case nonlinearity::relu: return std::sqrt(2.0);
    case nonlinearity::leaky_relu: return std::sqrt(2.0 / (1.0 + negative_slope * negative_slope));
    case nonlinearity::selu: return 0.75;
  }
  return 1.0;
}

// Which fan Kaiming's initialisations scale by: fan_in keeps the forward pass's variance, fan_out the backward's.
enum class fan_mode { fan_in, fan_out };

// torch.nn.init's Kaiming settings and their defaults: a is the negative slope of the leaky ReLU that follows.
struct kaiming_options {
  double a = 0;
  fan_mode mode = fan_mode::fan_in;
  nonlinearity nonlinear = nonlinearity::leaky_relu;
};

namespace detail {
inline double kaiming_std(const shape& s, const kaiming_options& o, const char* who) {
  fans f = fans_of(s, who);
  index_t fan = o.mode == fan_mode::fan_in ? f.in : f.out;
  return calculate_gain(o.nonlinear, o.a) / std::sqrt(static_cast<double>(fan));
}
}  // namespace detail

// U(low, high) in every element.
template <class T>
void uniform(tensor_view<T> w, random_generator& rng, double low = 0.0, double high = 1.0) {
  if (!(low <= high)) fail("init::uniform: expected low <= high, found ", low, " and ", high);
  uniform(w.span(), static_cast<T>(low), static_cast<T>(high), rng);
}
// N(mean, stddev^2) in every element.
template <class T>
void normal(tensor_view<T> w, random_generator& rng, double mean = 0.0, double stddev = 1.0) {
  if (!(stddev >= 0)) fail("init::normal: expected stddev >= 0, found ", stddev);
  normal(w.span(), static_cast<T>(mean), static_cast<T>(stddev), rng);
}
template <class T>
void constant(tensor_view<T> w, double value) {
  constant(w.span(), static_cast<T>(value));
}
template <class T>
void zeros(tensor_view<T> w) {
  constant(w, 0.0);
}
template <class T>
void ones(tensor_view<T> w) {
  constant(w, 1.0);
}

// N(mean, stddev^2) restricted to [a, b] (absolute bounds, as torch.nn.init.trunc_normal_), drawn by rejection.
template <class T>
void trunc_normal(tensor_view<T> w, random_generator& rng, double mean = 0.0, double stddev = 1.0, double a = -2.0,
                  double b = 2.0) {
  if (!(stddev > 0)) fail("init::trunc_normal: expected stddev > 0, found ", stddev);
  if (!(a < b)) fail("init::trunc_normal: expected a < b, found a = ", a, " and b = ", b);
  // Rejection costs 1 / mass draws per value; below this mass the interval lies too far in a tail to be meant.
  auto cdf = [&](double x) { return 0.5 * std::erfc(-(x - mean) / (stddev * std::sqrt(2.0))); };
  double mass = cdf(b) - cdf(a);
  if (mass < 1e-3)
    fail("init::trunc_normal: expected [a, b] to hold at least 0.1% of N(mean, stddev^2), found ", mass * 100,
         "% for [", a, ", ", b, "], mean ", mean, " and stddev ", stddev);
  for (T& v : w.span()) {
    double x;
    do x = mean + stddev * rng.normal<double>();
    while (x < a || x > b);
    v = static_cast<T>(x);
  }
}

// Glorot & Bengio (2010): U(-bound, bound) with bound = gain * sqrt(6 / (fan_in + fan_out)).
template <class T>
void xavier_uniform(tensor_view<T> w, random_generator& rng, double gain = 1.0) {
  fans f = fans_of(w.shape(), "init::xavier_uniform");
  if (w.numel() == 0) return;
  xavier_uniform(w.span(), f.in, f.out, rng, static_cast<T>(gain));
}
// N(0, gain^2 * 2 / (fan_in + fan_out)).
template <class T>
void xavier_normal(tensor_view<T> w, random_generator& rng, double gain = 1.0) {
  fans f = fans_of(w.shape(), "init::xavier_normal");
  if (w.numel() == 0) return;
  xavier_normal(w.span(), f.in, f.out, rng, static_cast<T>(gain));
}
// He et al. (2015): U(-bound, bound) with bound = gain / sqrt(fan) * sqrt(3).
template <class T>
void kaiming_uniform(tensor_view<T> w, random_generator& rng, kaiming_options o = {}) {
  double bound = std::sqrt(3.0) * detail::kaiming_std(w.shape(), o, "init::kaiming_uniform");
  if (w.numel() == 0) return;
  uniform(w.span(), static_cast<T>(-bound), static_cast<T>(bound), rng);
}
// N(0, gain^2 / fan).
template <class T>
void kaiming_normal(tensor_view<T> w, random_generator& rng, kaiming_options o = {}) {
  double stddev = detail::kaiming_std(w.shape(), o, "init::kaiming_normal");
  if (w.numel() == 0) return;
  normal(w.span(), T(0), static_cast<T>(stddev), rng);
}

// Saxe et al. (2013): the weight viewed as rows = its first dimension by the rest, filled with a (semi-)orthogonal
// matrix times gain: orthonormal rows where there are no more rows than columns, else orthonormal columns. As torch,
// the Q of a QR factorisation of a standard normal matrix with R's diagonal made positive, which is what Gram-Schmidt
// gives; it runs in double precision, twice over each vector so that rounding leaves it orthogonal.
template <class T>
void orthogonal(tensor_view<T> w, random_generator& rng, double gain = 1.0) {
  if (w.rank() < 2) fail("init::orthogonal: expected a weight of rank 2 or more, found shape ", w.shape());
  const index_t rows = w.extent(0), cols = rows ? w.numel() / rows : 0;
  if (rows == 0 || cols == 0) return;
  // Gram-Schmidt over the short side's vectors, each as long as the long side.
  const bool by_rows = rows <= cols;
  const index_t count = by_rows ? rows : cols, length = by_rows ? cols : rows;
  std::vector<double> a(static_cast<std::size_t>(rows * cols));
  for (double& v : a) v = rng.normal<double>();
  // Vector j, element i of the matrix drawn in row-major order: rows are vectors, or columns are.
  auto at = [&](index_t j, index_t i) -> double& {
    return a[static_cast<std::size_t>(by_rows ? j * cols + i : i * cols + j)];
  };
  for (index_t j = 0; j < count; ++j) {
    for (int pass = 0; pass < 2; ++pass)
      for (index_t k = 0; k < j; ++k) {
        double dot = 0;
        for (index_t i = 0; i < length; ++i) dot += at(k, i) * at(j, i);
        for (index_t i = 0; i < length; ++i) at(j, i) -= dot * at(k, i);
      }
    double norm = 0;
    for (index_t i = 0; i < length; ++i) norm += at(j, i) * at(j, i);
    norm = std::sqrt(norm);
    if (norm == 0) fail("init::orthogonal: the normal draw was rank-deficient (shape ", w.shape(), ")");
    for (index_t i = 0; i < length; ++i) at(j, i) /= norm;
  }
  for (index_t i = 0; i < rows * cols; ++i) w[i] = static_cast<T>(gain * a[static_cast<std::size_t>(i)]);
}

// Keras' names. glorot_uniform (Keras' default for Dense and Conv2D kernels) and he_uniform are the Xavier and
// Kaiming (ReLU) uniform ones above. Keras' normal variants draw from a normal truncated at two standard deviations,
// scaled up by 1 / 0.8796... so that the truncated distribution keeps the intended variance.
template <class T>
void glorot_uniform(tensor_view<T> w, random_generator& rng) {
  xavier_uniform(w, rng);
}
template <class T>
void he_uniform(tensor_view<T> w, random_generator& rng) {
  kaiming_uniform(w, rng, {.nonlinear = nonlinearity::relu});
}

namespace detail {
// Keras' VarianceScaling with a truncated normal: stddev = sqrt(scale / fan) / 0.87962566103423978 (the standard
// deviation of a unit normal truncated to [-2, 2]), truncated at two of those.
template <class T>
void keras_truncated_normal(tensor_view<T> w, random_generator& rng, double scale, double fan) {
  if (w.numel() == 0) return;
  double stddev = std::sqrt(scale / fan) / 0.87962566103423978;
  trunc_normal(w, rng, 0.0, stddev, -2 * stddev, 2 * stddev);
}
}  // namespace detail

template <class T>
void glorot_normal(tensor_view<T> w, random_generator& rng) {
  fans f = fans_of(w.shape(), "init::glorot_normal");
  detail::keras_truncated_normal(w, rng, 1.0, static_cast<double>(f.in + f.out) / 2);
}
template <class T>
void he_normal(tensor_view<T> w, random_generator& rng) {
  detail::keras_truncated_normal(w, rng, 2.0, static_cast<double>(fans_of(w.shape(), "init::he_normal").in));
}
template <class T>
void lecun_normal(tensor_view<T> w, random_generator& rng) {
  detail::keras_truncated_normal(w, rng, 1.0, static_cast<double>(fans_of(w.shape(), "init::lecun_normal").in));
}
// U(-bound, bound) with bound = sqrt(3 / fan_in).
template <class T>
void lecun_uniform(tensor_view<T> w, random_generator& rng) {
  kaiming_uniform(w, rng, {.nonlinear = nonlinearity::linear});
}

}  // namespace kiln::init
