// nn::MultiheadAttention(embed_dim, num_heads, {.bias, .dropout, .batch_first, .kdim, .vdim}), as
// torch.nn.MultiheadAttention: the same parameters under the same names (in_proj_weight and in_proj_bias, or
// q_proj_weight, k_proj_weight and v_proj_weight when kdim or vdim differ from embed_dim; out_proj.weight and
// out_proj.bias), the same forward arguments, masks and returned shapes, and the same initialisation formulas.
//
//   kiln::nn::MultiheadAttention attention(64, 4, {.dropout = 0.1, .batch_first = true});
//   auto [out, weights] = attention.forward(x, x, x, {.key_padding_mask = kiln::nn::bool_mask(padding)});
//
// forward's attention runs through nn::scaled_dot_product_attention (the tiled kernel, no [L, S] scores held) unless
// need_weights asks for the weights, which are then computed explicitly as PyTorch does.
#pragma once

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "kiln/core/random.hpp"
#include "kiln/dynamic/functional/attention.hpp"
#include "kiln/dynamic/functional/linear.hpp"
#include "kiln/dynamic/functional/reduce.hpp"
#include "kiln/dynamic/init.hpp"
#include "kiln/dynamic/module.hpp"
#include "kiln/dynamic/modules/linear.hpp"

namespace kiln::nn {

// MultiheadAttention's constructor options, in torch.nn.MultiheadAttention's order (add_bias_kv and add_zero_attn
// are not supported). kdim and vdim: the width of key and value, embed_dim when 0.
struct multihead_attention_options {
  bool bias = true;
  double dropout = 0.0;
  bool batch_first = false;
  index_t kdim = 0;
  index_t vdim = 0;
};

// forward's options, in the order of torch's forward after query, key and value. Boolean masks (nn::bool_mask)
// exclude where they are True, as PyTorch's do here; float masks are added to the scores.
template <class T>
struct basic_multihead_attention_forward_options {
  basic_attention_mask<T> key_padding_mask{};  // [N, S] ([S] unbatched): the keys each sequence ignores
  bool need_weights = true;                   // also return the attention weights (computed explicitly)
  basic_attention_mask<T> attn_mask{};          // [L, S] or [N * num_heads, L, S]
  bool average_attn_weights = true;           // the weights averaged over the heads, [N, L, S]; else [N, H, L, S]
  bool is_causal = false;  // a hint that attn_mask is the causal mask (which must be given, as in PyTorch)
};

namespace detail {

// out_proj: a Linear whose bias starts at zero, as MultiheadAttention's _reset_parameters leaves it.
template <class T>
class attention_out_projection : public basic_linear<T> {
 public:
  attention_out_projection(index_t features, bool bias) : basic_linear<T>(features, features, bias) { zero_bias(); }
  void reset_parameters(random_generator& rng) override {
    basic_linear<T>::reset_parameters(rng);
    zero_bias();
  }

 private:
  void zero_bias() {
    if (this->bias.defined()) dynamic_policy::fill(this->bias.data(), T(0), this->bias.numel());
  }
};

}  // namespace detail

template <class T>
class basic_multihead_attention : public basic_module<T> {
 public:
  using variable = basic_variable<T>;
  using forward_options = basic_multihead_attention_forward_options<T>;

  // Initialised as PyTorch does: xavier_uniform_ on in_proj_weight (or on q_proj_weight, k_proj_weight and
  // v_proj_weight, in that order), zeros in in_proj_bias and out_proj.bias, and out_proj.weight as a Linear's. This
  // module takes the next init stream for its own weights, then out_proj (a child Linear) the one after; dropout
  // masks come from the module's run-time generator (kiln::next_runtime_generator()), as nn::Dropout's.
  basic_multihead_attention(index_t embed_dim, index_t num_heads, multihead_attention_options options = {})
      : embed_dim_(embed_dim),
        num_heads_(num_heads),
        kdim_(options.kdim > 0 ? options.kdim : embed_dim),
        vdim_(options.vdim > 0 ? options.vdim : embed_dim),
        dropout_(static_cast<T>(options.dropout)),
        batch_first_(options.batch_first) {
    if (embed_dim <= 0 || num_heads <= 0 || embed_dim % num_heads != 0)
      fail("MultiheadAttention: expected embed_dim divisible by num_heads, both positive, found embed_dim ",
           embed_dim, " and num_heads ", num_heads);
    if (options.kdim < 0 || options.vdim < 0)
      fail("MultiheadAttention: expected non-negative kdim and vdim, found ", options.kdim, " and ", options.vdim);
    if (!(options.dropout >= 0.0 && options.dropout <= 1.0))
      fail("MultiheadAttention: expected dropout in [0, 1], found ", options.dropout);
    if (same_embed_dim()) {
      in_proj_weight = this->register_parameter("in_proj_weight", Tensor<T>(kiln::shape{3 * embed_dim, embed_dim}));
    } else {
      q_proj_weight = this->register_parameter("q_proj_weight", Tensor<T>(kiln::shape{embed_dim, embed_dim}));
      k_proj_weight = this->register_parameter("k_proj_weight", Tensor<T>(kiln::shape{embed_dim, kdim_}));
      v_proj_weight = this->register_parameter("v_proj_weight", Tensor<T>(kiln::shape{embed_dim, vdim_}));
    }
    if (options.bias) in_proj_bias = this->register_parameter("in_proj_bias", Tensor<T>(kiln::shape{3 * embed_dim}));
    random_generator init = this->take_init_generator();
    reset_parameters(init);
    out_proj = this->register_module("out_proj", detail::attention_out_projection<T>(embed_dim, options.bias));
    rng_ = next_runtime_generator();
  }

  // torch's forward: query [L, N, E] ([N, L, E] with batch_first; [L, E] unbatched), key [S, N, kdim], value
  // [S, N, vdim]. Returns the output, shaped as query, and the attention weights when need_weights ([N, L, S]
  // averaged over the heads, [N, num_heads, L, S] otherwise; without N unbatched), else an empty Variable.
  std::pair<variable, variable> forward(const variable& query, const variable& key, const variable& value,
                                        const forward_options& options = {}) {
    try {
      return attend(query, key, value, options);
    } catch (const error& e) {
      fail(describe(), ": ", e.what());
    }
  }
  std::pair<variable, variable> operator()(const variable& query, const variable& key, const variable& value,
                                           const forward_options& options = {}) {
    return forward(query, key, value, options);
  }
  // Self-attention of x without masks or weights (query = key = value = x): the output alone, so that the module
  // can stand in a Sequential.
  variable forward(const variable& x) override { return forward(x, x, x, {.need_weights = false}).first; }
  using basic_module<T>::operator();

  void reset_parameters(random_generator& rng) override {
    if (same_embed_dim()) {
      init::xavier_uniform(in_proj_weight, 1.0, &rng);
    } else {
      init::xavier_uniform(q_proj_weight, 1.0, &rng);
      init::xavier_uniform(k_proj_weight, 1.0, &rng);
      init::xavier_uniform(v_proj_weight, 1.0, &rng);
    }
    if (in_proj_bias.defined()) dynamic_policy::fill(in_proj_bias.data(), T(0), in_proj_bias.numel());
  }

  std::string name() const override { return "MultiheadAttention"; }
  std::string extra_repr() const override {
    char text[160];
    std::snprintf(text, sizeof text, "embed_dim=%lld, num_heads=%lld, dropout=%g, batch_first=%s",
                  static_cast<long long>(embed_dim_), static_cast<long long>(num_heads_),
                  static_cast<double>(dropout_), batch_first_ ? "True" : "False");
    std::string s = text;
    if (!same_embed_dim()) s += ", kdim=" + std::to_string(kdim_) + ", vdim=" + std::to_string(vdim_);
    return s;
  }
  using basic_module<T>::describe;
  index_t embed_dim() const { return embed_dim_; }
  index_t num_heads() const { return num_heads_; }
  index_t head_dim() const { return embed_dim_ / num_heads_; }
  index_t kdim() const { return kdim_; }
  index_t vdim() const { return vdim_; }
  bool batch_first() const { return batch_first_; }
  T dropout() const { return dropout_; }
  random_generator& generator() { return rng_; }

  variable in_proj_weight;                               // [3 E, E], when kdim = vdim = E
  variable q_proj_weight, k_proj_weight, v_proj_weight;  // [E, E], [E, kdim], [E, vdim] otherwise
  variable in_proj_bias;                                 // [3 E], or empty without bias
  std::shared_ptr<basic_linear<T>> out_proj;

 protected:
  random_generator* own_runtime_generator() override { return &rng_; }

 private:
  bool same_embed_dim() const { return kdim_ == embed_dim_ && vdim_ == embed_dim_; }

  // A mask for the scores, additive: a boolean one becomes -inf where True (PyTorch's _canonical_mask).
  static variable additive(const basic_attention_mask<T>& m) {
    if (!m.boolean) return m.values;
    return masked_fill(mul(m.values, T(0)), m.values, T(-INFINITY));
  }

  std::pair<variable, variable> attend(const variable& query_in, const variable& key_in, const variable& value_in,
                                       const forward_options& o) {
    const index_t e_dim = embed_dim_, heads = num_heads_, d_dim = head_dim();
    if (!query_in.defined() || !key_in.defined() || !value_in.defined())
      fail("query, key and value must all be defined");
    const bool batched = query_in.dim() == 3;
    if (!(query_in.dim() == 2 || batched) || key_in.dim() != query_in.dim() || value_in.dim() != query_in.dim())
      fail("expected query, key and value all of rank 3 (batched) or all of rank 2 (unbatched), found ",
           query_in.shape(), ", ", key_in.shape(), " and ", value_in.shape());
    // Work batch first, [N, L, E]: an unbatched input is a batch of one, a sequence-first one is transposed.
    auto batch_major = [&](const variable& x) {
      if (!batched) return unsqueeze(x, 0);
      return batch_first_ ? x : transpose(x, 0, 1);
    };
    const variable query = batch_major(query_in), key = batch_major(key_in), value = batch_major(value_in);
    const index_t n = query.shape()[0], l_dim = query.shape()[1], s_dim = key.shape()[1];
    if (query.shape()[2] != e_dim || key.shape()[2] != kdim_ || value.shape()[2] != vdim_)
      fail("expected query, key and value of widths ", e_dim, ", ", kdim_, " and ", vdim_, ", found ",
           query_in.shape(), ", ", key_in.shape(), " and ", value_in.shape());
    if (key.shape()[0] != n || value.shape()[0] != n || value.shape()[1] != s_dim)
      fail("query, key and value disagree on the batch or key and value on the sequence length: ", query_in.shape(),
           ", ", key_in.shape(), " and ", value_in.shape());
    if (o.is_causal && !o.attn_mask.defined())
      fail("is_causal is a hint that attn_mask is the causal mask, and needs attn_mask (as PyTorch)");

    // The input projections: one product for self-attention with the packed weight, else one per input.
    variable q, k, v;
    auto bias_part = [&](index_t part) {
      return in_proj_bias.defined() ? narrow(in_proj_bias, 0, part * e_dim, e_dim) : variable();
    };
    if (same_embed_dim() && query.node() == key.node() && key.node() == value.node()) {
      auto parts = chunk(linear(query, in_proj_weight, in_proj_bias), 3, -1);
      q = parts[0];
      k = parts[1];
      v = parts[2];
    } else {
      auto weight_part = [&](const variable& own, index_t part) {
        return same_embed_dim() ? narrow(in_proj_weight, 0, part * e_dim, e_dim) : own;
      };
      q = linear(query, weight_part(q_proj_weight, 0), bias_part(0));
      k = linear(key, weight_part(k_proj_weight, 1), bias_part(1));
      v = linear(value, weight_part(v_proj_weight, 2), bias_part(2));
    }
    auto split_heads = [&](const variable& x, index_t length) {  // [N, len, E] -> [N, H, len, D]
      return transpose(view(x, {n, length, heads, d_dim}), 1, 2);
    };
    q = split_heads(q, l_dim);
    k = split_heads(k, s_dim);
    v = split_heads(v, s_dim);

    // One additive mask broadcastable to [N, H, L, S]: attn_mask [L, S] or [N H, L, S], plus key_padding_mask [N, S]
    // as [N, 1, 1, S].
    variable mask;
    if (o.attn_mask.defined()) {
      const kiln::shape& ms = o.attn_mask.values.shape();
      const bool two_d = ms.rank() == 2 && ms[0] == l_dim && ms[1] == s_dim;
      const bool three_d = ms.rank() == 3 && ms[0] == n * heads && ms[1] == l_dim && ms[2] == s_dim;
      if (!two_d && !three_d)
        fail("expected attn_mask of shape [", l_dim, ", ", s_dim, "] or [", n * heads, ", ", l_dim, ", ", s_dim,
             "], found ", ms);
      mask = additive(o.attn_mask);
      if (three_d) mask = view(mask, {n, heads, l_dim, s_dim});
    }
    if (o.key_padding_mask.defined()) {
      const kiln::shape& ps = o.key_padding_mask.values.shape();
      const bool ok = batched ? ps.rank() == 2 && ps[0] == n && ps[1] == s_dim : ps.rank() == 1 && ps[0] == s_dim;
      if (!ok)
        fail("expected key_padding_mask of shape ", batched ? "[" + std::to_string(n) + ", " : std::string("["), s_dim,
             "], found ", ps);
      variable padding = view(additive(o.key_padding_mask), {n, 1, 1, s_dim});
      mask = mask.defined() ? add(mask, padding) : padding;
    }
    const T p = this->is_training() ? dropout_ : T(0);

    variable attended, weights;  // [N, H, L, D], [N, H, L, S]
    if (!o.need_weights) {
      // As PyTorch: the causal hint replaces the mask when there is nothing else to mask.
      const bool causal = o.is_causal && !o.key_padding_mask.defined();
      const basic_attention_mask<T> sdpa_mask = causal ? basic_attention_mask<T>() : basic_attention_mask<T>(mask);
      attended = scaled_dot_product_attention(q, k, v, sdpa_mask, static_cast<double>(p), causal, std::nullopt, &rng_);
    } else {
      // The weights explicitly, as PyTorch's need_weights path: q scaled first, the mask added, softmax, dropout.
      const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d_dim)));
      variable scores = matmul(mul(q, scale), transpose(k, -2, -1));
      if (mask.defined()) scores = add(scores, mask);
      weights = softmax(scores, -1);
      if (p > T(0)) weights = nn::dropout(weights, p, true, rng_);
      attended = matmul(weights, v);
    }
    variable out = (*out_proj)(reshape(transpose(attended, 1, 2), {n, l_dim, e_dim}));  // [N, L, E]
    if (!batched) out = squeeze(out, 0);
    else if (!batch_first_) out = transpose(out, 0, 1);
    if (weights.defined()) {
      if (o.average_attn_weights) weights = mean(weights, 1);
      if (!batched) weights = squeeze(weights, 0);
    }
    return {out, weights};
  }

  index_t embed_dim_, num_heads_, kdim_, vdim_;
  T dropout_;
  bool batch_first_;
  random_generator rng_;
};

using MultiheadAttention = basic_multihead_attention<float>;
using MultiheadAttentionForwardOptions = basic_multihead_attention_forward_options<float>;

}  // namespace kiln::nn
