// MultiheadSelfAttention<Heads, Causal>: static mode's multi-head self-attention over a sequence, as
// torch.nn.MultiheadAttention(E, Heads, batch_first=True) called with query = key = value = x and no mask (with Causal,
// under the causal mask, as is_causal with generate_square_subsequent_mask), and as dynamic mode's
// nn::MultiheadAttention one-argument forward: the same parameters under the same names (in_proj_weight,
// in_proj_bias, out_proj.weight, out_proj.bias), the same initialisation from the same streams, the same kernels, so
// the same bits. A sample is [L, E]; the output has its shape. No dropout on the attention weights.
//   using Net = kiln::Sequential<kiln::policy::cpu, kiln::Input<17, 64>, kiln::MultiheadSelfAttention<4>, ...>;
//
// The computation, for each sample, H = Heads heads of D = E / H features (every product the Dense layer's kernels,
// the attention the tiled kernel of kernels/cpu/attention.hpp, which never holds more than a tile of the scores):
//   qkv = x in_proj_weight^T + in_proj_bias                 [L, 3E]: q, k, v side by side
//   q, k, v -> heads [H, L, D] each; o = softmax(q k^T / sqrt(D)) v per head (the causal cut under Causal)
//   merged = the heads side by side again                    [L, E]
//   y = merged out_proj.weight^T + out_proj.bias
// Scratch, each region n samples long: qkv [L, 3E] (in the backward: the merged output's gradient and its heads',
// then qkv's gradient), q k v by head [3, H, L, D], o by head [H, L, D], the log-sum-exp [H, L], merged [L, E], and
// the gradients of q k v by head [3, H, L, D].
#pragma once

#include <cmath>
#include <string>
#include <vector>

#include "kiln/core/init.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/core/tensor_init.hpp"
#include "kiln/kernels/attention_dispatch.hpp"
#include "kiln/layers/dense.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"

namespace kiln {

template <index_t Heads, bool Causal = false>
struct MultiheadSelfAttention {
  static_assert(Heads >= 1, "kiln::MultiheadSelfAttention<Heads>: expected at least one head");
  static constexpr const char* name = "MultiheadSelfAttention";
  static constexpr bool is_activation = false;

  template <class In>
  static constexpr bool accepts = In::rank == 2 && sequence_extent<In>(1) % Heads == 0;
  static constexpr const char* requirement =
      "a sequence [L, E] whose width E the number of heads divides (Input<L, E>, or the output of a layer per "
      "position such as TimeDistributed<Dense<E>>)";

  template <class In>
  struct bind {
    static constexpr index_t length = sequence_extent<In>(0);
    static constexpr index_t width = sequence_extent<In>(1);
    static constexpr index_t head_dim = width / Heads > 0 ? width / Heads : 1;
    using output = In;
    static constexpr index_t in_weight = 3 * width * width, in_bias = 3 * width, out_weight = width * width;
    static constexpr index_t param_count = in_weight + in_bias + out_weight + width;
    static constexpr std::uint64_t init_stream_count = 2;  // the module's own, then out_proj's (a Linear)

    // Scratch regions, in values per sample.
    static constexpr index_t sequence = length * width;
    static constexpr index_t qkv_size = 3 * sequence, heads_size = 3 * sequence, out_size = sequence,
                             lse_size = Heads * length, merged_size = sequence, grads_size = 3 * sequence;
    static constexpr index_t scratch_per_sample =
        qkv_size + heads_size + out_size + lse_size + merged_size + grads_size;
    static constexpr bool aliases_input = false;

    // nn::MultiheadAttention's: xavier_uniform_ on in_proj_weight and zeros in in_proj_bias from this layer's stream,
    // then out_proj as a Linear from the next stream, its bias zeroed.
    template <class T>
    static void init(T* params, random_generator& rng) {
      init::xavier_uniform(std::span<T>(params, in_weight), width, 3 * width, rng, T(1));
      for (index_t i = 0; i < in_bias; ++i) params[in_weight + i] = T(0);
      const auto base = rng.state();
      random_generator out_proj(base.seed, base.stream + 1);
      T* w = params + in_weight + in_bias;
      dense_init<T>({w, static_cast<std::size_t>(out_weight)}, {w + out_weight, static_cast<std::size_t>(width)},
                    width, out_proj);
      for (index_t i = 0; i < width; ++i) w[out_weight + i] = T(0);
    }

    template <class Policy, class T>
    static void forward(const T* params, T*, const T* x, T* y, T* scratch, const layer_context& ctx, bool) {
      static_assert(Policy::host_accessible || kernels::has_attention_kernel<Policy, T>,
                    "kiln::MultiheadSelfAttention: this policy has no attention kernel of its own");
      const index_t n = ctx.batch, rows = n * length;
      const regions<T> r(scratch, n);
      dense_forward<Policy>(x, params, params + in_weight, r.qkv, rows, width, 3 * width);
      split_heads<Policy>(r.qkv, r.heads, n);
      const kernels::cpu::attention_problem<T> p = problem<Policy>(r, n);
      kernels::attention_kernel<Policy, T>::forward(p, r.out, r.lse);
      merge_one<Policy>(r.out, r.merged, n, width, 0);
      dense_forward<Policy>(r.merged, out_weight_of(params), out_bias_of(params), y, rows, width, width);
    }

    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      const index_t n = ctx.batch, rows = n * length;
      const regions<T> r(scratch, n);
      T* dmerged = r.qkv;                         // qkv itself is not read again: its heads are
      T* dout = r.qkv + n * sequence;
      dense_backward<Policy>(r.merged, out_weight_of(params), dy, dmerged, out_weight_of(dparams),
                             out_bias_of(dparams), rows, width, width, false);
      split_one<Policy>(dmerged, dout, n, width, 0);
      const kernels::cpu::attention_problem<T> p = problem<Policy>(r, n);
      const index_t part = n * sequence;
      const kernels::cpu::attention_grad<T> dq{r.grads, false}, dk{r.grads + part, false},
          dv{r.grads + 2 * part, false};
      kernels::attention_kernel<Policy, T>::backward(p, r.out, r.lse, dout, dq, dk, dv);
      T* dqkv = r.qkv;  // the merged output's gradient and its heads' are used up
      merge_one<Policy>(r.grads, dqkv, n, 3 * width, 0);
      merge_one<Policy>(r.grads + part, dqkv, n, 3 * width, width);
      merge_one<Policy>(r.grads + 2 * part, dqkv, n, 3 * width, 2 * width);
      dense_backward<Policy>(x, params, dqkv, dx, dparams, dparams + in_weight, rows, width, 3 * width, false);
    }

    static std::vector<static_parameter_info> parameter_tensors() {
      return {{"in_proj_weight", shape{3 * width, width}, 0},
              {"in_proj_bias", shape{3 * width}, in_weight},
              {"out_proj.weight", shape{width, width}, in_weight + in_bias},
              {"out_proj.bias", shape{width}, in_weight + in_bias + out_weight}};
    }
    static std::string description() {
      return std::string("MultiheadSelfAttention(") + std::to_string(Heads) + " heads" + (Causal ? ", causal)" : ")");
    }

   private:
    template <class T>
    struct regions {
      T *qkv, *heads, *out, *lse, *merged, *grads;
      regions(T* scratch, index_t n)
          : qkv(scratch),
            heads(qkv + n * qkv_size),
            out(heads + n * heads_size),
            lse(out + n * out_size),
            merged(lse + n * lse_size),
            grads(merged + n * merged_size) {}
    };
    template <class P>
    static const P* out_weight_of(const P* params) {
      return params + in_weight + in_bias;
    }
    template <class P>
    static P* out_weight_of(P* params) {
      return params + in_weight + in_bias;
    }
    template <class P>
    static const P* out_bias_of(const P* params) {
      return params + in_weight + in_bias + out_weight;
    }
    template <class P>
    static P* out_bias_of(P* params) {
      return params + in_weight + in_bias + out_weight;
    }

    // [n, L, cols] columns [first, first + E) -> [n, H, L, D]: one strided copy of L rows of D values per sample and
    // head (the policy's copy_rows, so device memory too).
    template <class Policy, class T>
    static void split_one(const T* from, T* to, index_t n, index_t cols, index_t first) {
      for (index_t s = 0; s < n; ++s)
        for (index_t h = 0; h < Heads; ++h)
          Policy::copy_rows(length, head_dim, from + s * length * cols + first + h * head_dim, cols,
                            to + (s * Heads + h) * length * head_dim, head_dim);
    }
    // [n, H, L, D] -> [n, L, cols] columns [first, first + E).
    template <class Policy, class T>
    static void merge_one(const T* from, T* to, index_t n, index_t cols, index_t first) {
      for (index_t s = 0; s < n; ++s)
        for (index_t h = 0; h < Heads; ++h)
          Policy::copy_rows(length, head_dim, from + (s * Heads + h) * length * head_dim, head_dim,
                            to + s * length * cols + first + h * head_dim, cols);
    }
    template <class Policy, class T>
    static void split_heads(const T* qkv, T* heads, index_t n) {
      for (index_t part = 0; part < 3; ++part)
        split_one<Policy>(qkv, heads + part * n * sequence, n, 3 * width, part * width);
    }

    template <class Policy, class T>
    static kernels::cpu::attention_problem<T> problem(const regions<T>& r, index_t n) {
      kernels::cpu::attention_problem<T> p;
      p.q = r.heads;
      p.k = r.heads + n * sequence;
      p.v = r.heads + 2 * n * sequence;
      p.batch = n * Heads;
      p.queries = p.keys = length;
      p.head_dim = p.value_dim = head_dim;
      p.scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(head_dim)));
      p.causal = Causal;
      p.precision = kernels::product_precision_of<Policy>();
      return p;
    }
  };
};

}  // namespace kiln
