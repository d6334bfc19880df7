// Sample transforms (augmentation) for image data sets, (H, W) or (C, H, W) per sample. Each call gets a generator
// that the loader derives from (seed, epoch, sample index) alone, so a sample's augmentation does not depend on which
// thread ran it, in what order, or whether prefetching was on: runs are reproducible from the seed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numbers>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"

namespace kiln::data {

// What a transform gets besides the sample: its own random stream and a scratch buffer that its owner (one per loader
// worker) keeps between calls, so transforms that need a copy of the input allocate only on the first sample.
struct transform_context {
  random_generator rng{};
  std::vector<float> scratch{};
  float* scratch_for(index_t count) {
    if (static_cast<index_t>(scratch.size()) < count) scratch.resize(static_cast<std::size_t>(count));
    return scratch.data();
  }
};

// A type-erased transform applied in place to one sample, as a loader stores it.
template <class T>
using transform_fn = std::function<void(tensor_view<T>, transform_context&)>;

namespace detail {
// Image extents of a sample: (H, W) is one channel, (C, H, W) several; each channel gets the same geometric change.
struct image_dims {
  index_t channels, height, width;
};
inline image_dims image_dims_of(const shape& s, const char* who) {
  if (s.rank() == 2) return {1, s[0], s[1]};
  if (s.rank() == 3) return {s[0], s[1], s[2]};
  fail(who, ": expected an image sample of shape (H, W) or (C, H, W), found ", s);
}
}  // namespace detail

// (x - mean) / std on every element.
struct normalize {
  float mean = 0.0f, std = 1.0f;
  template <class T>
  void operator()(tensor_view<T> x, transform_context&) const {
    static_assert(std::is_floating_point_v<T>,
                  "kiln::data::normalize: expected floating-point samples (integer ones would truncate the result)");
    if (!(std > 0.0f) || !std::isfinite(std) || !std::isfinite(mean))
      fail("normalize: expected a finite mean and a positive, finite std, found mean ", mean, " and std ", std);
    const T m = static_cast<T>(mean), inv = static_cast<T>(1.0f / std);
    for (T& v : x.span()) v = (v - m) * inv;
  }
};

// Random translation by up to `pad` pixels in each direction, with zeros shifted in: the same as padding the image by
// `pad` zeros on every side and cropping a random window of the original size back out.
struct random_shift {
  index_t pad = 2;
  template <class T>
  void operator()(tensor_view<T> x, transform_context& ctx) const {
    auto [channels, h, w] = detail::image_dims_of(x.shape(), "random_shift");
    if (pad < 0 || pad > (index_t{1} << 30)) fail("random_shift: expected pad in [0, 2^30], found ", pad);
    const auto span = static_cast<std::uint64_t>(2 * pad + 1);
    const index_t dy = static_cast<index_t>(ctx.rng.below(span)) - pad;  // crop offset - pad
    const index_t dx = static_cast<index_t>(ctx.rng.below(span)) - pad;
    if (dy == 0 && dx == 0) return;
    T* scratch = reinterpret_cast<T*>(ctx.scratch_for(static_cast<index_t>((h * w * sizeof(T) + 3) / 4)));
    for (index_t c = 0; c < channels; ++c) {
      T* img = x.data() + c * h * w;
      std::memcpy(scratch, img, static_cast<std::size_t>(h * w) * sizeof(T));
      for (index_t r = 0; r < h; ++r) {  // output (r, col) reads input (r + dy, col + dx)
        T* out = img + r * w;
        const index_t sr = r + dy;
        if (sr < 0 || sr >= h) {
          std::fill_n(out, w, T(0));
          continue;
        }
        const index_t first = std::clamp<index_t>(-dx, 0, w), last = std::clamp<index_t>(w - dx, 0, w);
        std::fill_n(out, first, T(0));
        if (last > first) std::memcpy(out + first, scratch + sr * w + first + dx, static_cast<std::size_t>(last - first) * sizeof(T));
        std::fill(out + std::max(first, last), out + w, T(0));
      }
    }
  }
};

// Rotation about the image centre by an angle drawn uniformly from [-degrees, degrees], bilinear interpolation,
// zeros outside the source image.
struct random_rotation {
  float degrees = 10.0f;
  template <class T>
  void operator()(tensor_view<T> x, transform_context& ctx) const {
    auto [channels, h, w] = detail::image_dims_of(x.shape(), "random_rotation");
    const double angle = ctx.rng.uniform<double>(-degrees, degrees) * std::numbers::pi / 180.0;
    const double cs = std::cos(angle), sn = std::sin(angle);
    const double cy = (static_cast<double>(h) - 1) / 2, cx = (static_cast<double>(w) - 1) / 2;
    T* scratch = reinterpret_cast<T*>(ctx.scratch_for(static_cast<index_t>((h * w * sizeof(T) + 3) / 4)));
    for (index_t c = 0; c < channels; ++c) {
      T* img = x.data() + c * h * w;
      std::memcpy(scratch, img, static_cast<std::size_t>(h * w) * sizeof(T));
      auto pixel = [&](index_t r, index_t col) -> T {
        return (r < 0 || r >= h || col < 0 || col >= w) ? T(0) : scratch[r * w + col];
      };
      for (index_t r = 0; r < h; ++r) {
        for (index_t col = 0; col < w; ++col) {
          // Inverse mapping: the output pixel takes the source point rotated back by the angle.
          const double yr = static_cast<double>(r) - cy, xr = static_cast<double>(col) - cx;
          const double sy = cs * yr - sn * xr + cy, sx = sn * yr + cs * xr + cx;
          const double fy = std::floor(sy), fx = std::floor(sx);
          const auto y0 = static_cast<index_t>(fy), x0 = static_cast<index_t>(fx);
          const double ay = sy - fy, ax = sx - fx;
          const double v = (1 - ay) * ((1 - ax) * static_cast<double>(pixel(y0, x0)) + ax * static_cast<double>(pixel(y0, x0 + 1))) +
                           ay * ((1 - ax) * static_cast<double>(pixel(y0 + 1, x0)) + ax * static_cast<double>(pixel(y0 + 1, x0 + 1)));
          img[r * w + col] = static_cast<T>(v);
        }
      }
    }
  }
};

// Mirrors the image left-right with probability p (not for digits, whose meaning changes; for Fashion-MNIST, photos).
struct random_hflip {
  float p = 0.5f;
  template <class T>
  void operator()(tensor_view<T> x, transform_context& ctx) const {
    auto [channels, h, w] = detail::image_dims_of(x.shape(), "random_hflip");
    if (!(ctx.rng.uniform<float>() < p)) return;
    for (index_t row = 0; row < channels * h; ++row) std::reverse(x.data() + row * w, x.data() + (row + 1) * w);
  }
};

// Adds independent N(0, std^2) noise to every element.
struct gaussian_noise {
  float std = 0.1f;
  template <class T>
  void operator()(tensor_view<T> x, transform_context& ctx) const {
    static_assert(std::is_floating_point_v<T>,
                  "kiln::data::gaussian_noise: expected floating-point samples (noise on integers would wrap around)");
    if (!(std >= 0.0f) || !std::isfinite(std)) fail("gaussian_noise: expected a finite std >= 0, found ", std);
    // Box-Muller in float, using both outputs of each pair of 24-bit uniforms: noise needs no double precision, and
    // this costs much less than one double-precision normal() per element.
    T* v = x.data();
    const index_t n = x.numel();
    constexpr float two_pi = 2.0f * std::numbers::pi_v<float>;
    for (index_t i = 0; i < n; i += 2) {
      const float u1 = 1.0f - ctx.rng.uniform<float>(), u2 = ctx.rng.uniform<float>();  // u1 in (0, 1]
      const float radius = std * std::sqrt(-2.0f * std::log(u1)), theta = two_pi * u2;
      v[i] += static_cast<T>(radius * std::cos(theta));
      if (i + 1 < n) v[i + 1] += static_cast<T>(radius * std::sin(theta));
    }
  }
};

// Several transforms applied left to right, drawing from one stream in turn (so the draws are a fixed sequence).
template <class... Ts>
struct compose {
  std::tuple<Ts...> steps;
  explicit compose(Ts... ts) : steps(std::move(ts)...) {}
  template <class T>
  void operator()(tensor_view<T> x, transform_context& ctx) const {
    std::apply([&](const auto&... step) { (step(x, ctx), ...); }, steps);
  }
};

}  // namespace kiln::data
