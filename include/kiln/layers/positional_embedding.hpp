// Static mode's positional embeddings, the twins of dynamic mode's (dynamic/modules/positional.hpp): a sample is a
// sequence [L, E] (the output of Embedding<V, E> on Input<L>), and the layer adds rows [0, L) of a table
// [MaxLen, E] to it, the same table under the same name as dynamic mode's module, added by the same kernels:
//   LearnedPositionalEmbedding<MaxLen, Std = 0.02>   parameter "weight" [MaxLen, E], drawn from N(0, Std^2) as
//                                                    nn::LearnedPositionalEmbedding draws it, and trained
//   SinusoidalPositionalEncoding<MaxLen>             buffer "pe" [MaxLen, E], fixed: pe[p, 2i] = sin(p w_i),
//                                                    pe[p, 2i + 1] = cos(p w_i), w_i = 10000^(-2i / E)
//   using Gpt = kiln::Sequential<kiln::policy::cpu, kiln::Input<128>, kiln::Embedding<256, 64>,
//                                kiln::LearnedPositionalEmbedding<128>, ...>;   // [128, 64]
//
// The table's gradient is the batch's output gradients summed sample by sample in order, the sum dynamic mode's
// broadcasting add takes, so both modes train to the same bits; rows from L on get no gradient.
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"

namespace kiln {

namespace positional_detail {

// What both tables share: the shape check and the add. MaxLen rows of In's width.
template <index_t MaxLen, class In>
struct table_shape {
  static constexpr index_t length = sequence_extent<In>(0), width = sequence_extent<In>(1);
  static constexpr index_t sequence = length * width, table_size = MaxLen * width;

  // y[s] = x[s] + table[0, L) for each of the batch's samples.
  template <class Policy, class T>
  static void add_rows(const T* table, const T* x, T* y, index_t batch) {
    for (index_t s = 0; s < batch; ++s) Policy::add(x + s * sequence, table, y + s * sequence, sequence);
  }
};

template <index_t MaxLen, class In>
constexpr bool fits() {
  return In::rank == 2 && In::extents[0] <= MaxLen;
}

}  // namespace positional_detail

template <index_t MaxLen, double Std = 0.02>
struct LearnedPositionalEmbedding {
  static_assert(MaxLen >= 1, "kiln::LearnedPositionalEmbedding<MaxLen>: expected a table of at least one row");
  static_assert(Std > 0, "kiln::LearnedPositionalEmbedding<MaxLen, Std>: expected a positive standard deviation");
  static constexpr const char* name = "LearnedPositionalEmbedding";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = positional_detail::fits<MaxLen, In>();
  static constexpr const char* requirement =
      "a sequence [L, E] no longer than the table (L <= MaxLen): the output of Embedding<V, E> on Input<L>";

  template <class In>
  struct bind : positional_detail::table_shape<MaxLen, In> {
    using base = positional_detail::table_shape<MaxLen, In>;
    using base::length, base::width, base::sequence, base::table_size;
    using output = In;
    static constexpr index_t param_count = table_size;
    static constexpr index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T* params, random_generator& rng) {
      for (index_t i = 0; i < table_size; ++i) params[i] = static_cast<T>(Std * static_cast<double>(rng.normal<T>()));
    }
    template <class Policy, class T>
    static void forward(const T* params, T*, const T* x, T* y, T*, const layer_context& ctx, bool) {
      base::template add_rows<Policy>(params, x, y, ctx.batch);
    }
    template <class Policy, class T>
    static void backward(const T*, const T*, const T*, T* dy, T* dx, T* dparams, T*, const layer_context& ctx) {
      const T* g = dy;
      Policy::copy(g, dparams, sequence);
      for (index_t s = 1; s < ctx.batch; ++s) Policy::accumulate(g + s * sequence, dparams, sequence);
      if constexpr (MaxLen > length) Policy::fill(dparams + sequence, T(0), table_size - sequence);
      if (dx) Policy::copy(g, dx, ctx.batch * sequence);
    }
    static std::vector<static_parameter_info> parameter_tensors() { return {{"weight", shape{MaxLen, width}, 0}}; }
    static std::string description() {
      return "LearnedPositionalEmbedding(" + std::to_string(MaxLen) + ", " + std::to_string(width) + ")";
    }
  };
};

template <index_t MaxLen>
struct SinusoidalPositionalEncoding {
  static_assert(MaxLen >= 1, "kiln::SinusoidalPositionalEncoding<MaxLen>: expected a table of at least one row");
  static constexpr const char* name = "SinusoidalPositionalEncoding";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = positional_detail::fits<MaxLen, In>();
  static constexpr const char* requirement = LearnedPositionalEmbedding<MaxLen>::requirement;

  template <class In>
  struct bind : positional_detail::table_shape<MaxLen, In> {
    using base = positional_detail::table_shape<MaxLen, In>;
    using base::length, base::width, base::sequence, base::table_size;
    using output = In;
    static constexpr index_t param_count = 0;
    static constexpr index_t buffer_count = table_size;
    static constexpr index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T*, random_generator&) {}
    // nn::SinusoidalPositionalEncoding's table, computed as it computes it.
    template <class T>
    static void init_buffers(T* pe) {
      for (index_t p = 0; p < MaxLen; ++p)
        for (index_t c = 0; c < width; ++c) {
          const index_t even = c - c % 2;
          const double angle = static_cast<double>(p) * std::exp(static_cast<double>(even) *
                                                                 (-std::log(10000.0) / static_cast<double>(width)));
          pe[p * width + c] = static_cast<T>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
        }
    }
    template <class Policy, class T>
    static void forward(const T*, T* pe, const T* x, T* y, T*, const layer_context& ctx, bool) {
      base::template add_rows<Policy>(static_cast<const T*>(pe), x, y, ctx.batch);
    }
    template <class Policy, class T>
    static void backward(const T*, const T*, const T*, T* dy, T* dx, T*, T*, const layer_context& ctx) {
      if (dx) Policy::copy(static_cast<const T*>(dy), dx, ctx.batch * sequence);
    }
    static std::vector<static_parameter_info> buffer_tensors() { return {{"pe", shape{MaxLen, width}, 0}}; }
    static std::string description() {
      return "SinusoidalPositionalEncoding(" + std::to_string(MaxLen) + ", " + std::to_string(width) + ")";
    }
  };
};

}  // namespace kiln
