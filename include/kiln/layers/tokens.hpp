// Static layers that make and read a sequence of tokens, a Vision Transformer's:
//   Patches<P>        an image [C, H, W] (or [H, W]) -> [(H / P) (W / P), C P P]: each P x P patch one token, the
//                     patches in row-major order, each patch's values channel, row, column (what a stride-P
//                     convolution or nn.Unfold reads, and dynamic mode's view-permute-reshape gives)
//   ClassToken<Std>   [L, E] -> [L + 1, E]: a learned token in front (parameter "class_token" [1, 1, E], drawn from
//                     N(0, Std^2))
//   SelectToken<I>    [L, E] -> [E]: token I alone, as x[:, I] in PyTorch (the class token for I = 0)
//   using Vit = kiln::Sequential<kiln::policy::cpu, kiln::Input<28, 28>, kiln::Patches<7>,
//                                kiln::TimeDistributed<kiln::Dense<64>>, kiln::ClassToken<>,
//                                kiln::LearnedPositionalEmbedding<17>, ..., kiln::SelectToken<0>, kiln::Dense<10>>;
// Each only moves values; their backward sends every gradient back to where its value came from (the class token's
// summed over the batch sample by sample in order, as dynamic mode's expand sums it).
#pragma once

#include <string>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"

namespace kiln {

namespace tokens_detail {

// An image's channels, height and width: [C, H, W], or [H, W] as one channel.
template <class In>
struct image {
  static constexpr index_t channels = In::rank == 3 ? In::extents[0] : 1;
  static constexpr index_t height = In::rank >= 2 ? In::extents[std::size_t(In::rank - 2)] : 1;
  static constexpr index_t width = In::rank >= 2 ? In::extents[std::size_t(In::rank - 1)] : 1;
};

}  // namespace tokens_detail

template <index_t P>
struct Patches {
  static_assert(P >= 1, "kiln::Patches<P>: expected patches of at least one pixel");
  static constexpr const char* name = "Patches";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = (In::rank == 2 || In::rank == 3) && tokens_detail::image<In>::height % P == 0 &&
                                  tokens_detail::image<In>::width % P == 0;
  static constexpr const char* requirement =
      "an image [C, H, W] or [H, W] whose height and width the patch size divides";

  template <class In>
  struct bind {
    using im = tokens_detail::image<In>;
    static constexpr index_t rows = im::height / P, cols = im::width / P, token = im::channels * P * P;
    using output = dims<rows * cols, token>;
    static constexpr index_t param_count = 0;
    static constexpr index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T*, random_generator&) {}
    template <class Policy, class T>
    static void forward(const T*, T*, const T* x, T* y, T*, const layer_context& ctx, bool) {
      move<Policy>(x, y, ctx.batch, true);
    }
    template <class Policy, class T>
    static void backward(const T*, const T*, const T*, T* dy, T* dx, T*, T*, const layer_context& ctx) {
      if (dx) move<Policy>(static_cast<const T*>(dy), dx, ctx.batch, false);
    }
    static std::string description() { return "Patches(" + std::to_string(P) + ")"; }

   private:
    // Image to tokens (or back): one call per (sample, channel, row of patches, pixel row) moves that pixel row of
    // every patch in the row of patches, P values each.
    template <class Policy, class T>
    static void move(const T* from, T* to, index_t batch, bool to_tokens) {
      for (index_t s = 0; s < batch; ++s)
        for (index_t c = 0; c < im::channels; ++c)
          for (index_t pr = 0; pr < rows; ++pr)
            for (index_t r = 0; r < P; ++r) {
              const index_t pixels = s * In::size + c * im::height * im::width + (pr * P + r) * im::width;
              const index_t tokens = s * output::size + pr * cols * token + c * P * P + r * P;
              if (to_tokens) Policy::copy_rows(cols, P, from + pixels, P, to + tokens, token);
              else Policy::copy_rows(cols, P, from + tokens, token, to + pixels, P);
            }
    }
  };
};

template <double Std = 0.02>
struct ClassToken {
  static_assert(Std > 0, "kiln::ClassToken<Std>: expected a positive standard deviation");
  static constexpr const char* name = "ClassToken";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = In::rank == 2;
  static constexpr const char* requirement = "a sequence of tokens [L, E]";

  template <class In>
  struct bind {
    static constexpr index_t length = sequence_extent<In>(0), width = sequence_extent<In>(1);
    using output = dims<length + 1, width>;
    static constexpr index_t param_count = width;
    static constexpr index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T* params, random_generator& rng) {
      for (index_t i = 0; i < width; ++i) params[i] = static_cast<T>(Std * static_cast<double>(rng.normal<T>()));
    }
    template <class Policy, class T>
    static void forward(const T* params, T*, const T* x, T* y, T*, const layer_context& ctx, bool) {
      for (index_t s = 0; s < ctx.batch; ++s) {
        Policy::copy(params, y + s * output::size, width);
        Policy::copy(x + s * In::size, y + s * output::size + width, In::size);
      }
    }
    template <class Policy, class T>
    static void backward(const T*, const T*, const T*, T* dy, T* dx, T* dparams, T*, const layer_context& ctx) {
      const T* g = dy;
      Policy::copy(g, dparams, width);
      for (index_t s = 1; s < ctx.batch; ++s) Policy::accumulate(g + s * output::size, dparams, width);
      if (dx)
        for (index_t s = 0; s < ctx.batch; ++s) Policy::copy(g + s * output::size + width, dx + s * In::size, In::size);
    }
    static std::vector<static_parameter_info> parameter_tensors() {
      return {{"class_token", shape{1, 1, width}, 0}};
    }
    static std::string description() { return "ClassToken"; }
  };
};

template <index_t I>
struct SelectToken {
  static_assert(I >= 0, "kiln::SelectToken<I>: expected a token index of 0 or more");
  static constexpr const char* name = "SelectToken";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = In::rank == 2 && I < sequence_extent<In>(0);
  static constexpr const char* requirement = "a sequence of tokens [L, E] with more than I tokens";

  template <class In>
  struct bind {
    static constexpr index_t width = sequence_extent<In>(1);
    using output = dims<width>;
    static constexpr index_t param_count = 0;
    static constexpr index_t scratch_per_sample = 0;
    static constexpr bool aliases_input = false;

    template <class T>
    static void init(T*, random_generator&) {}
    template <class Policy, class T>
    static void forward(const T*, T*, const T* x, T* y, T*, const layer_context& ctx, bool) {
      Policy::copy_rows(ctx.batch, width, x + I * width, In::size, y, width);
    }
    template <class Policy, class T>
    static void backward(const T*, const T*, const T*, T* dy, T* dx, T*, T*, const layer_context& ctx) {
      if (!dx) return;
      Policy::fill(dx, T(0), ctx.batch * In::size);
      Policy::copy_rows(ctx.batch, width, static_cast<const T*>(dy), width, dx + I * width, In::size);
    }
    static std::string description() { return "SelectToken(" + std::to_string(I) + ")"; }
  };
};

}  // namespace kiln
