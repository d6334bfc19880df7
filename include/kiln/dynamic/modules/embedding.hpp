// nn::Embedding(num_embeddings, embedding_dim, {.padding_idx = ...}): a table of rows looked up by integer ids, as
// torch.nn.Embedding: weight [num_embeddings, embedding_dim] drawn from N(0, 1), the padding row zero and never
// trained. nn::Unflatten(dim, sizes), as torch.nn.Unflatten.
//   kiln::nn::Embedding tokens(256, 64);
//   auto x = tokens(ids);          // ids: kiln::Tensor<std::int64_t> [B, L] -> [B, L, 64]
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/core/random.hpp"
#include "kiln/dynamic/functional/indexing.hpp"
#include "kiln/dynamic/module.hpp"

namespace kiln::nn {

struct embedding_options {
  std::optional<index_t> padding_idx{};  // this row (negative: from the end) starts at zero and gets no gradient
};

template <class T>
class basic_embedding : public basic_module<T> {
 public:
  using variable = basic_variable<T>;

  basic_embedding(index_t num_embeddings, index_t embedding_dim, embedding_options options = {})
      : num_(num_embeddings), dim_(embedding_dim) {
    if (num_embeddings < 1 || embedding_dim < 0)
      fail("Embedding: expected num_embeddings >= 1 and embedding_dim >= 0, found ", num_embeddings, " and ",
           embedding_dim);
    if (options.padding_idx) {
      const index_t p = *options.padding_idx;
      if (p < -num_embeddings || p >= num_embeddings)
        fail("Embedding: padding_idx ", p, " is out of range for ", num_embeddings, " embeddings");
      padding_ = p < 0 ? p + num_embeddings : p;
    }
    weight = this->register_parameter("weight", Tensor<T>(kiln::shape{num_embeddings, embedding_dim}));
    random_generator rng = this->take_init_generator();
    reset_parameters(rng);
  }

  // The rows at ids (any shape): ids.shape + [embedding_dim].
  variable forward(tensor_view<const std::int64_t> ids) {
    try {
      return embedding(ids, weight, padding_);
    } catch (const error& e) {
      fail(this->describe(), ": ", e.what());
    }
  }
  variable operator()(tensor_view<const std::int64_t> ids) { return forward(ids); }
  // The same with the ids as a Variable of whole numbers (the input of a Sequential), as exact integers in T.
  variable forward(const variable& ids) override {
    const Tensor<T> values = ids.tensor();
    Tensor<std::int64_t> as_ids(values.shape());
    for (index_t i = 0; i < values.numel(); ++i) {
      const T v = values.data()[i];
      if (!(v == std::floor(v)))
        fail(this->describe(), ": expected whole-number ids, found ", v, " at position ", i);
      as_ids.data()[i] = static_cast<std::int64_t>(v);
    }
    return forward(as_ids.view());
  }
  using basic_module<T>::operator();

  std::string name() const override { return "Embedding"; }
  std::string extra_repr() const override {
    return std::to_string(num_) + ", " + std::to_string(dim_) +
           (padding_ ? ", padding_idx=" + std::to_string(*padding_) : std::string());
  }
  // torch.nn.Embedding's initialisation: N(0, 1), then the padding row zeroed.
  void reset_parameters(random_generator& rng) override {
    detail::host_values<T> w(weight);
    for (T& v : w.span()) v = rng.normal<T>();
    if (padding_)
      for (index_t j = 0; j < dim_; ++j) w.span()[static_cast<std::size_t>(*padding_ * dim_ + j)] = T(0);
    w.write_back();
  }
  index_t num_embeddings() const { return num_; }
  index_t embedding_dim() const { return dim_; }
  std::optional<index_t> padding_idx() const { return padding_; }

  variable weight;  // (num_embeddings, embedding_dim)

 private:
  index_t num_, dim_;
  std::optional<index_t> padding_;
};

using Embedding = basic_embedding<float>;

template <class T>
class basic_unflatten : public basic_module<T> {
 public:
  basic_unflatten(int dim, const kiln::shape& sizes) : dim_(dim), sizes_(sizes) {}
  basic_variable<T> forward(const basic_variable<T>& x) override {
    try {
      return unflatten(x, dim_, sizes_);
    } catch (const error& e) {
      fail(this->describe(), ": ", e.what());
    }
  }
  std::string name() const override { return "Unflatten"; }
  std::string extra_repr() const override {
    return "dim=" + std::to_string(dim_) + ", unflattened_size=" + sizes_.str();
  }

 private:
  int dim_;
  kiln::shape sizes_;
};

using Unflatten = basic_unflatten<float>;

}  // namespace kiln::nn
