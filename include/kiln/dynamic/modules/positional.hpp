// Positional embeddings, added to a sequence of token embeddings so that attention can tell positions apart:
//   nn::SinusoidalPositionalEncoding(d_model, max_len, {.batch_first})   buffer "pe" [max_len, d_model], fixed:
//       pe[p, 2i] = sin(p / 10000^(2i / d_model)), pe[p, 2i + 1] = cos(p / 10000^(2i / d_model))
//       (Vaswani et al., "Attention is all you need", as PyTorch's transformer tutorial computes it)
//   nn::LearnedPositionalEmbedding(max_len, d_model, {.batch_first, .std})   parameter "weight" [max_len, d_model],
//       drawn from N(0, std^2) (GPT-2's and ViT's 0.02 by default) and trained
// forward(x): x [L, N, E] ([N, L, E] with batch_first; [L, E] unbatched) plus rows [0, L) of the table, L <= max_len.
//   kiln::nn::LearnedPositionalEmbedding positions(128, 64, {.batch_first = true});
//   auto h = positions(tokens(ids));   // [N, 128, 64]
#pragma once

#include <cmath>
#include <string>

#include "kiln/core/random.hpp"
#include "kiln/dynamic/functional/arithmetic.hpp"
#include "kiln/dynamic/functional/shape.hpp"
#include "kiln/dynamic/module.hpp"

namespace kiln::nn {

struct positional_encoding_options {
  bool batch_first = false;
};

struct learned_positional_embedding_options {
  bool batch_first = false;
  double std = 0.02;
};

namespace detail {

// x plus rows [0, L) of table [max_len, E], broadcast over the batch.
template <class T>
basic_variable<T> add_positions(const basic_variable<T>& x, const basic_variable<T>& table, bool batch_first) {
  const index_t max_len = table.shape()[0], width = table.shape()[1];
  if (!(x.dim() == 2 || x.dim() == 3) || x.shape()[x.dim() - 1] != width)
    fail("expected input of shape [L, N, ", width, "], [N, L, ", width, "] or [L, ", width, "], found ", x.shape());
  const int sequence_dim = x.dim() == 3 && batch_first ? 1 : 0;
  const index_t length = x.shape()[sequence_dim];
  if (length > max_len)
    fail("the sequence has ", length, " positions and the table ", max_len, " (raise max_len), input ", x.shape());
  basic_variable<T> rows = narrow(table, 0, 0, length);
  if (x.dim() == 3) rows = view(rows, batch_first ? kiln::shape{1, length, width} : kiln::shape{length, 1, width});
  return add(x, rows);
}

}  // namespace detail

template <class T>
class basic_sinusoidal_positional_encoding : public basic_module<T> {
 public:
  basic_sinusoidal_positional_encoding(index_t d_model, index_t max_len = 5000, positional_encoding_options options = {})
      : batch_first_(options.batch_first) {
    if (d_model < 1 || max_len < 1)
      fail("SinusoidalPositionalEncoding: expected positive d_model and max_len, found ", d_model, " and ", max_len);
    Tensor<T> table(kiln::shape{max_len, d_model});
    for (index_t p = 0; p < max_len; ++p)
      for (index_t c = 0; c < d_model; ++c) {
        const index_t even = c - c % 2;
        const double angle = static_cast<double>(p) * std::exp(static_cast<double>(even) *
                                                               (-std::log(10000.0) / static_cast<double>(d_model)));
        table[p * d_model + c] = static_cast<T>(c % 2 == 0 ? std::sin(angle) : std::cos(angle));
      }
    pe = this->register_buffer("pe", table);
  }
  basic_variable<T> forward(const basic_variable<T>& x) override {
    try {
      return detail::add_positions(x, pe, batch_first_);
    } catch (const error& e) {
      fail(this->describe(), ": ", e.what());
    }
  }
  std::string name() const override { return "SinusoidalPositionalEncoding"; }
  std::string extra_repr() const override {
    return "d_model=" + std::to_string(pe.shape()[1]) + ", max_len=" + std::to_string(pe.shape()[0]);
  }

  bool batch_first() const { return batch_first_; }

  basic_variable<T> pe;  // [max_len, d_model]

 private:
  bool batch_first_;
};

template <class T>
class basic_learned_positional_embedding : public basic_module<T> {
 public:
  basic_learned_positional_embedding(index_t max_len, index_t d_model,
                                     learned_positional_embedding_options options = {})
      : batch_first_(options.batch_first), std_(options.std) {
    if (d_model < 1 || max_len < 1)
      fail("LearnedPositionalEmbedding: expected positive max_len and d_model, found ", max_len, " and ", d_model);
    if (!(options.std >= 0.0)) fail("LearnedPositionalEmbedding: expected a non-negative std, found ", options.std);
    weight = this->register_parameter("weight", Tensor<T>(kiln::shape{max_len, d_model}));
    random_generator rng = this->take_init_generator();
    reset_parameters(rng);
  }
  basic_variable<T> forward(const basic_variable<T>& x) override {
    try {
      return detail::add_positions(x, weight, batch_first_);
    } catch (const error& e) {
      fail(this->describe(), ": ", e.what());
    }
  }
  void reset_parameters(random_generator& rng) override {
    detail::host_values<T> w(weight);
    for (T& v : w.span()) v = static_cast<T>(std_ * static_cast<double>(rng.normal<T>()));
    w.write_back();
  }
  std::string name() const override { return "LearnedPositionalEmbedding"; }
  std::string extra_repr() const override {
    return "max_len=" + std::to_string(weight.shape()[0]) + ", d_model=" + std::to_string(weight.shape()[1]);
  }

  bool batch_first() const { return batch_first_; }

  basic_variable<T> weight;  // [max_len, d_model]

 private:
  bool batch_first_;
  double std_;
};

using SinusoidalPositionalEncoding = basic_sinusoidal_positional_encoding<float>;
using LearnedPositionalEmbedding = basic_learned_positional_embedding<float>;

}  // namespace kiln::nn
