// torch.nn.init for dynamic mode: the initialisers of kiln/core/tensor_init.hpp applied in place to a Variable, e.g.
// nn::init::xavier_uniform(linear.weight) or nn::init::kaiming_normal(conv.weight, {.mode = fan_mode::fan_out}).
// Without a generator each call draws from the next of kiln::manual_seed's initialisation streams, as a newly built
// module does, so a seeded program initialises the same way every run; with one (the last argument, as torch's
// generator=), from that generator, which gives the values a static model's tensor gets from the same generator.
// The values are drawn on the host and written into the Variable's memory (uploaded on a GPU policy); no graph is
// recorded.
#pragma once

#include "kiln/core/random.hpp"
#include "kiln/core/tensor_init.hpp"
#include "kiln/dynamic/variable.hpp"

namespace kiln::nn::init {

using kiln::init::calculate_gain;
using kiln::init::fan_mode;
using kiln::init::kaiming_options;
using kiln::init::nonlinearity;

namespace detail {
// Fills a host tensor of v's shape from the generator given, or else from the next initialisation stream, and writes
// it into v.
template <class T, class Draw>
void draw(const basic_variable<T>& v, random_generator* generator, Draw&& fill) {
  Tensor<T> host(v.shape());
  if (generator) {
    fill(host.view(), *generator);
  } else {
    random_generator stream = next_init_generator();
    fill(host.view(), stream);
  }
  kiln::nn::detail::copy_values_from_host(host.data(), v.data(), host.numel());
}
}  // namespace detail

// Each takes torch.nn.init's arguments, then the generator to draw from (none: the next initialisation stream).
template <class T>
void uniform(const basic_variable<T>& v, double low = 0.0, double high = 1.0, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::uniform(w, rng, low, high); });
}
template <class T>
void normal(const basic_variable<T>& v, double mean = 0.0, double stddev = 1.0,
            random_generator* generator = nullptr) {
  detail::draw(v, generator,
               [&](tensor_view<T> w, random_generator& rng) { kiln::init::normal(w, rng, mean, stddev); });
}
template <class T>
void trunc_normal(const basic_variable<T>& v, double mean = 0.0, double stddev = 1.0, double a = -2.0,
                  double b = 2.0, random_generator* generator = nullptr) {
  detail::draw(v, generator,
               [&](tensor_view<T> w, random_generator& rng) { kiln::init::trunc_normal(w, rng, mean, stddev, a, b); });
}
template <class T>
void xavier_uniform(const basic_variable<T>& v, double gain = 1.0, random_generator* generator = nullptr) {
  detail::draw(v, generator,
               [&](tensor_view<T> w, random_generator& rng) { kiln::init::xavier_uniform(w, rng, gain); });
}
template <class T>
void xavier_normal(const basic_variable<T>& v, double gain = 1.0, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::xavier_normal(w, rng, gain); });
}
template <class T>
void kaiming_uniform(const basic_variable<T>& v, kaiming_options o = {}, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::kaiming_uniform(w, rng, o); });
}
template <class T>
void kaiming_normal(const basic_variable<T>& v, kaiming_options o = {}, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::kaiming_normal(w, rng, o); });
}
template <class T>
void orthogonal(const basic_variable<T>& v, double gain = 1.0, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::orthogonal(w, rng, gain); });
}

// Keras' named initialisers.
template <class T>
void glorot_uniform(const basic_variable<T>& v, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::glorot_uniform(w, rng); });
}
template <class T>
void glorot_normal(const basic_variable<T>& v, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::glorot_normal(w, rng); });
}
template <class T>
void he_uniform(const basic_variable<T>& v, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::he_uniform(w, rng); });
}
template <class T>
void he_normal(const basic_variable<T>& v, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::he_normal(w, rng); });
}
template <class T>
void lecun_uniform(const basic_variable<T>& v, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::lecun_uniform(w, rng); });
}
template <class T>
void lecun_normal(const basic_variable<T>& v, random_generator* generator = nullptr) {
  detail::draw(v, generator, [&](tensor_view<T> w, random_generator& rng) { kiln::init::lecun_normal(w, rng); });
}

// Constants draw nothing, so they take no generator and leave the streams where they were.
template <class T>
void constant(const basic_variable<T>& v, double value) {
  Tensor<T> host(v.shape(), static_cast<T>(value));
  kiln::nn::detail::copy_values_from_host(host.data(), v.data(), host.numel());
}
template <class T>
void zeros(const basic_variable<T>& v) {
  constant(v, 0.0);
}
template <class T>
void ones(const basic_variable<T>& v) {
  constant(v, 1.0);
}

}  // namespace kiln::nn::init
