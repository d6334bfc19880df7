// Counter-based random numbers (Philox-4x32-10, Salmon et al., SC'11): the n-th number of a stream is a pure function
// of (seed, stream, n), so CPU and GPU kernels, threads and resumed runs all draw the same values.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "kiln/core/config.hpp"

namespace kiln {

// Ten Philox rounds on a counter held in four words, in place. Written on plain scalars so that GPU kernels
// (KILN_HOST_DEVICE) run the very same code as the CPU generator.
KILN_HOST_DEVICE KILN_ALWAYS_INLINE void philox4x32_rounds(std::uint32_t& c0, std::uint32_t& c1, std::uint32_t& c2,
                                                           std::uint32_t& c3, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t mul0 = 0xD2511F53u, mul1 = 0xCD9E8D57u;
  constexpr std::uint32_t weyl0 = 0x9E3779B9u, weyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{mul0} * c0;
    const std::uint64_t p1 = std::uint64_t{mul1} * c2;
    const std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0, n1 = static_cast<std::uint32_t>(p1),
                        n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1, n3 = static_cast<std::uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += weyl0;
    k1 += weyl1;
  }
}

// One Philox-4x32-10 block: 128 bits of counter and 64 bits of key in, 128 random bits out.
KILN_ALWAYS_INLINE std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                                           std::array<std::uint32_t, 2> key) {
  philox4x32_rounds(counter[0], counter[1], counter[2], counter[3], key[0], key[1]);
  return counter;
}

// A stream of random numbers: seed and stream id are the Philox key and upper counter, position the lower counter.
// Copying a generator copies its position; state() and set_state() save and restore it exactly.
class random_generator {
 public:
  struct state_type {
    std::uint64_t seed = 0, stream = 0, position = 0;
  };

  explicit random_generator(std::uint64_t seed = 0, std::uint64_t stream = 0) : state_{seed, stream, 0} {}

  // A generator for an independent stream under the same seed (one per layer, per loader, per epoch...).
  random_generator fork(std::uint64_t stream) const { return random_generator(state_.seed, stream); }

  std::uint32_t next_u32() {
    std::uint64_t block = state_.position >> 2;
    int lane = static_cast<int>(state_.position & 3);
    if (block != cached_block_ || !cache_valid_) {
      cache_ = philox4x32({static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                           static_cast<std::uint32_t>(state_.stream), static_cast<std::uint32_t>(state_.stream >> 32)},
                          {static_cast<std::uint32_t>(state_.seed), static_cast<std::uint32_t>(state_.seed >> 32)});
      cached_block_ = block;
      cache_valid_ = true;
    }
    ++state_.position;
    return cache_[lane];
  }
  std::uint64_t next_u64() {
    std::uint64_t hi = next_u32();
    return (hi << 32) | next_u32();
  }

  // Uniform in [0, 1): 24 random bits for float, 53 for double, so every value is exactly representable.
  template <class T = float>
  T uniform() {
    if constexpr (sizeof(T) <= 4) {
      return static_cast<T>(next_u32() >> 8) * T(1.0f / 16777216.0f);
    } else {
      return static_cast<T>(next_u64() >> 11) * T(1.0 / 9007199254740992.0);
    }
  }
  template <class T = float>
  T uniform(T low, T high) {
    return low + (high - low) * uniform<T>();
  }
  // Standard normal by the Box-Muller transform (computed in double, so float and double draws agree).
  template <class T = float>
  T normal(T mean = T(0), T stddev = T(1)) {
    double u1 = 1.0 - uniform<double>();  // in (0, 1]: log stays finite
    double u2 = uniform<double>();
    double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    return static_cast<T>(mean + stddev * z);
  }
  // Uniform integer in [0, bound) without modulo bias (Lemire's multiply-shift with rejection).
  std::uint64_t below(std::uint64_t bound) {
    if (bound <= 0xFFFFFFFFull) {
      std::uint64_t product = std::uint64_t{next_u32()} * bound;
      std::uint32_t low = static_cast<std::uint32_t>(product);
      if (low < bound) {
        std::uint32_t threshold = static_cast<std::uint32_t>(-static_cast<std::uint32_t>(bound) % bound);
        while (low < threshold) {
          product = std::uint64_t{next_u32()} * bound;
          low = static_cast<std::uint32_t>(product);
        }
      }
      return product >> 32;
    }
    std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % bound);
    std::uint64_t x;
    do x = next_u64();
    while (x >= limit);
    return x % bound;
  }

  const state_type& state() const { return state_; }
  // The largest position a saved state may hold (io::load_checkpoint checks it): more numbers than any run draws, and
  // far enough below 2^64 that drawing on never wraps around to the start of the stream.
  static constexpr std::uint64_t max_saved_position = std::uint64_t{1} << 62;
  void set_state(const state_type& s) {
    state_ = s;
    cache_valid_ = false;
  }

 private:
  state_type state_;
  std::array<std::uint32_t, 4> cache_{};
  std::uint64_t cached_block_ = 0;
  bool cache_valid_ = false;
};

// Where a generator stands: all a GPU kernel needs to draw the numbers that next_u32() would return next.
struct random_stream_position {
  std::uint64_t seed = 0, stream = 0, position = 0;
};

// Number position + offset of the stream, i.e. what the (offset + 1)-th call of next_u32() returns: element i of a
// GPU kernel draws random_draw(start, i), so CPU and GPU masks agree bit for bit whatever the launch shape.
KILN_HOST_DEVICE KILN_ALWAYS_INLINE std::uint32_t random_draw(const random_stream_position& start,
                                                              std::uint64_t offset) {
  const std::uint64_t at = start.position + offset;
  const std::uint64_t block = at >> 2;
  std::uint32_t c0 = static_cast<std::uint32_t>(block), c1 = static_cast<std::uint32_t>(block >> 32),
                c2 = static_cast<std::uint32_t>(start.stream), c3 = static_cast<std::uint32_t>(start.stream >> 32);
  philox4x32_rounds(c0, c1, c2, c3, static_cast<std::uint32_t>(start.seed),
                    static_cast<std::uint32_t>(start.seed >> 32));
  switch (at & 3) {
    case 0: return c0;
    case 1: return c1;
    case 2: return c2;
    default: return c3;
  }
}

// The position of a generator, for a kernel that draws in its place.
inline random_stream_position random_stream_position_of(const random_generator& g) {
  return {g.state().seed, g.state().stream, g.state().position};
}
// Moves a generator past `draws` numbers, as if next_u32() had been called that many times (after a GPU kernel drew
// them), so the host and the device stay on one stream.
inline void advance(random_generator& g, std::uint64_t draws) {
  auto s = g.state();
  s.position += draws;
  g.set_state(s);
}

// The global seed behind dynamic-mode initialisation, like torch.manual_seed. Every module that owns parameters takes
// the next stream of this seed when it is constructed; a static Sequential built with the same seed gives its k-th
// parameterised layer stream k, so both modes start from the same weights. Layers that draw at run time (dropout
// masks) count apart: the k-th takes stream runtime_stream_base + k in both modes, so each has numbers of its own and
// static and dynamic models with the same seed draw the same masks.
inline constexpr std::uint64_t runtime_stream_base = std::uint64_t{1} << 62;
struct init_streams {
  std::uint64_t seed = 0;
  std::uint64_t next_stream = 0;
  std::uint64_t next_runtime_stream = 0;
};
inline init_streams& global_init_streams() {
  static thread_local init_streams streams;
  return streams;
}
inline void manual_seed(std::uint64_t seed) { global_init_streams() = {seed, 0, 0}; }
// The generator for the next parameterised module.
inline random_generator next_init_generator() {
  auto& s = global_init_streams();
  return random_generator(s.seed, s.next_stream++);
}
// The generator for the next module that draws at run time.
inline random_generator next_runtime_generator() {
  auto& s = global_init_streams();
  return random_generator(s.seed, runtime_stream_base + s.next_runtime_stream++);
}

}  // namespace kiln
