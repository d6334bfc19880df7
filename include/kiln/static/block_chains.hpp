// The chains inside static mode's blocks (static/blocks.hpp): a chain of layers planned in the block's slices of the
// flat buffers and in its scratch (block_detail::chain), run forward and backward with the fusion rules choosing how
// each position runs, as the Sequential's executor runs its own; and several chains side by side, a block's branches
// (block_detail::branch_table), with each branch's offsets, init streams and run-time generators.
#pragma once

#include <array>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/random.hpp"
#include "kiln/core/static_shape.hpp"
#include "kiln/layers/layer_context.hpp"
#include "kiln/layers/parameter_info.hpp"
#include "kiln/static/fusion_rules.hpp"
#include "kiln/static/fusion_schedule.hpp"
#include "kiln/static/layer_traits.hpp"

namespace kiln {

template <class... Layers>
struct Chain;

namespace block_detail {

constexpr index_t aligned(index_t n) { return (n + 15) / 16 * 16; }

using detail::buffer_count_of;
using detail::has_buffers;
using detail::runtime_generators_of;
using detail::torch_modules;

// The layers of a chain bound one after another from In.
template <class In, class... Layers>
struct bound_chain;
template <class In>
struct bound_chain<In> {
  using output = In;
  using binds = std::tuple<>;
  using layers = std::tuple<>;
};
template <class In, class L, class... Rest>
struct bound_chain<In, L, Rest...> {
  using B = typename L::template bind<In>;
  using next = bound_chain<typename B::output, Rest...>;
  using output = typename next::output;
  using binds = decltype(std::tuple_cat(std::declval<std::tuple<B>>(), std::declval<typename next::binds>()));
  using layers = decltype(std::tuple_cat(std::declval<std::tuple<L>>(), std::declval<typename next::layers>()));
};

// A chain's plan: per sub-layer, its parameter and buffer offsets (parameters 16-aligned), and per sample its
// activation, gradient and scratch offsets in the chain's scratch.
template <class In, class... Layers>
struct chain {
  using plan = bound_chain<In, Layers...>;
  using output = typename plan::output;
  static constexpr std::size_t count = sizeof...(Layers);
  template <std::size_t I>
  using bind_at = std::tuple_element_t<I, typename plan::binds>;
  template <std::size_t I>
  using layer_at = std::tuple_element_t<I, typename plan::layers>;
  template <std::size_t I>
  using input_at = std::conditional_t<I == 0, In, typename bind_at<(I > 0 ? I - 1 : 0)>::output>;

  template <std::size_t... I>
  static constexpr auto offsets(std::index_sequence<I...>) {
    struct table {
      index_t param[count + 1] = {}, buffer[count + 1] = {}, activation[count + 1] = {}, gradient[count + 1] = {},
              scratch[count + 1] = {};
      std::uint64_t stream[count + 1] = {};
      std::size_t generator[count + 1] = {};
    } t;
    index_t p = 0, b = 0, s = 0;
    std::uint64_t st = 0;
    std::size_t g = 0;
    ((t.param[I] = p, p += aligned(bind_at<I>::param_count), t.buffer[I] = b, b += buffer_count_of<bind_at<I>>(),
      t.stream[I] = st, st += detail::init_streams<bind_at<I>>(), t.generator[I] = g,
      g += runtime_generators_of<bind_at<I>>(),
      t.activation[I] = s, s += bind_at<I>::aliases_input ? 0 : bind_at<I>::output::size,
      t.gradient[I] = s, s += bind_at<I>::aliases_input ? 0 : bind_at<I>::output::size,
      t.scratch[I] = s, s += bind_at<I>::scratch_per_sample), ...);
    t.param[count] = p;
    t.buffer[count] = b;
    t.activation[count] = t.gradient[count] = t.scratch[count] = s;
    t.stream[count] = st;
    t.generator[count] = g;
    return t;
  }
  static constexpr auto table = offsets(std::make_index_sequence<count>{});
  static constexpr index_t param_count = table.param[count];
  static constexpr index_t buffer_count = table.buffer[count];
  static constexpr index_t scratch_per_sample = table.scratch[count];
  static constexpr std::uint64_t init_stream_count = table.stream[count];
  static constexpr std::size_t runtime_generator_count = table.generator[count];
  static constexpr index_t parameter_values = []<std::size_t... I>(std::index_sequence<I...>) {
    return (index_t{0} + ... + detail::parameter_values_of<bind_at<I>>());
  }(std::make_index_sequence<count>{});

  template <class Body>
  static constexpr void each(Body&& body) {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (body.template operator()<I>(), ...); }(
        std::make_index_sequence<count>{});
  }

  template <class T>
  static void init(T* params, random_generator& rng) {
    const auto base = rng.state();
    each([&]<std::size_t I>() {
      if constexpr (bind_at<I>::param_count > 0) {
        random_generator own(base.seed, base.stream + table.stream[I]);
        bind_at<I>::init(params + table.param[I], own);
      }
    });
  }
  template <class T>
  static void init_buffers(T* buffers) {
    each([&]<std::size_t I>() {
      if constexpr (has_buffers<bind_at<I>>) bind_at<I>::init_buffers(buffers + table.buffer[I]);
    });
  }

  // The chain as the fusion rules see it (static/fusion_schedule.hpp): its layers under a policy and a value type.
  template <class Policy, class V>
  struct view {
    using T = V;
    using policy = Policy;
    static constexpr std::size_t layer_count = count;
    template <std::size_t I>
    using layer = layer_at<I>;
    template <std::size_t I>
    using bound = bind_at<I>;
  };
  struct pass {
    layer_context ctx;
    bool fuse;
  };

  // One call's memory: where each sub-layer reads and writes. Sub-layer I's output is its own activation rows in
  // scratch, its input where it aliases, or its input where a forward rule passed it through; the gradient of its
  // output is the chain's dy for the last layer and its own gradient rows otherwise (those of the layer after it,
  // where that one aliases); the first computing layer writes the chain's dx (through the aliasing layers before it,
  // which change no value).
  template <class Policy, class T>
  struct runner {
    const T* params;
    T* buffers;
    T* dparams;
    T* dy;
    T* dx;
    T* scratch;
    index_t n;
    std::array<const T*, count> inputs{};
    std::array<T*, count> outputs{};
    struct layer_memory {
      const T* params;
      T* buffers;
      T* dparams;
      const T* x;
      T* y;
      T* dy;
      T* dx;
      T* scratch;
      layer_context ctx;
    };
    // Lays out the inputs and outputs for a pass whose forward made these choices (a forward rule's partner passes
    // its input through): forward lays them out so, and backward again from the same choices.
    void place(const T* x, const std::array<int, count>& forward_choices) {
      each([&]<std::size_t I>() {
        inputs[I] = I == 0 ? x : outputs[I - 1];
        outputs[I] = bind_at<I>::aliases_input || forward_choices[I] >= fusion::partner_tag
                         ? const_cast<T*>(inputs[I])
                         : scratch + table.activation[I] * n;
      });
    }
    template <std::size_t I>
    T* gradient() const {
      if constexpr (I + 1 == count) return dy;
      else if constexpr (bind_at<I + 1>::aliases_input) return gradient<I + 1>();
      else return scratch + table.gradient[I] * n;
    }
    template <std::size_t I>
    T* input_gradient() const {
      if constexpr (I <= first_computing()) return dx;
      else return gradient<I - 1>();
    }
    template <std::size_t I>
    layer_memory at(const pass& p) const {
      layer_context ctx = p.ctx;
      if constexpr (runtime_generators_of<bind_at<I>>() > 0) ctx.rng = p.ctx.rng + table.generator[I];
      return {params + table.param[I], buffers + table.buffer[I], dparams ? dparams + table.param[I] : nullptr,
              inputs[I], outputs[I], dy ? gradient<I>() : nullptr, input_gradient<I>(),
              scratch + table.scratch[I] * n, ctx};
    }
    template <std::size_t I>
    void pass_through() {
      outputs[I] = const_cast<T*>(inputs[I]);
    }
  };

  // Runs the chain on x (n samples); returns where its output is (scratch, or x when every layer aliases). Each
  // position runs as the fusion rules choose for the pass.
  template <class Policy, class T>
  static const T* forward(const T* params, T* buffers, const T* x, T* scratch, const layer_context& ctx, bool fuse) {
    using G = view<Policy, T>;
    const pass p{ctx, fuse};
    runner<Policy, T> r{params, buffers, nullptr, nullptr, nullptr, scratch, ctx.batch};
    const auto choices = fusion::choose<G, fusion::forward_rules, +1>(p);
    r.place(x, choices);
    each([&]<std::size_t I>() {
      if constexpr (!bind_at<I>::aliases_input) {
        if (!fusion::run<G, fusion::forward_rules, I>(choices[I], r, p)) {
          const auto m = r.template at<I>(p);
          bind_at<I>::template forward<Policy>(m.params, m.buffers, m.x, m.y, m.scratch, m.ctx, fuse);
        }
      }
    });
    return r.outputs[count - 1];
  }

  // Back-propagates dy (the gradient of the chain's output; it may be overwritten) into dx (the gradient of x,
  // overwritten, or null when none is wanted) and dparams (overwritten), right after forward with the same context:
  // ctx.fuse_epilogues says what forward's `fuse` said, so the forward's choices are made again.
  template <class Policy, class T>
  static void backward(const T* params, const T* x, T* dy, T* dx, T* dparams, T* scratch, const layer_context& ctx) {
    using G = view<Policy, T>;
    runner<Policy, T> r{params, nullptr, dparams, dy, dx, scratch, ctx.batch};
    r.place(x, fusion::choose<G, fusion::forward_rules, +1>(pass{ctx, ctx.fuse_epilogues}));
    const pass p{ctx, ctx.fuse_epilogues};
    const auto choices = fusion::choose<G, fusion::backward_rules, -1>(p);
    [&]<std::size_t... R>(std::index_sequence<R...>) {
      (backward_one<count - 1 - R, Policy>(choices[count - 1 - R], r, p), ...);
    }(std::make_index_sequence<count>{});
  }
  static constexpr std::size_t first_computing() {
    std::size_t first = count;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((first = (first == count && !bind_at<I>::aliases_input) ? I : first), ...);
    }(std::make_index_sequence<count>{});
    return first;
  }
  template <std::size_t I, class Policy, class T>
  static void backward_one(int choice, runner<Policy, T>& r, const pass& p) {
    using B = bind_at<I>;
    if constexpr (!B::aliases_input) {
      if (!fusion::run<view<Policy, T>, fusion::backward_rules, I>(choice, r, p)) {
        const auto m = r.template at<I>(p);
        B::template backward<Policy>(m.params, m.x, m.y, m.dy, m.dx, m.dparams, m.scratch, m.ctx);
      }
    }
  }

  // The fusions a pass of this chain makes, one line each, its positions named "<prefix><module index> <layer>", and
  // those inside the blocks it holds.
  template <class Policy, class T>
  static void fusions(const layer_context& ctx, bool fuse, const std::string& prefix, std::vector<std::string>& out) {
    using G = view<Policy, T>;
    std::vector<std::string> labels;
    int torch_index = 0;
    each([&]<std::size_t I>() {
      labels.push_back(prefix + std::to_string(torch_index) + " " + bind_at<I>::description());
      torch_index += torch_modules<layer_at<I>>();
    });
    fusion::describe<fusion::forward_rules>(fusion::choose<G, fusion::forward_rules, +1>(pass{ctx, fuse}), labels,
                                            out);
    layer_context backward_ctx = ctx;
    backward_ctx.input_as_in_forward = true;
    fusion::describe<fusion::backward_rules>(fusion::choose<G, fusion::backward_rules, -1>(pass{backward_ctx, fuse}),
                                             labels, out);
    torch_index = 0;
    each([&]<std::size_t I>() {
      if constexpr (requires { &bind_at<I>::template fusions<Policy, T>; })
        bind_at<I>::template fusions<Policy, T>(ctx, fuse, prefix + std::to_string(torch_index) + ".", out);
      torch_index += torch_modules<layer_at<I>>();
    });
  }

  // Sub-layer parameter (or buffer) tensors, named "<prefix><module index>.<name>", offsets within the chain's slice.
  static void named_tensors(std::vector<static_parameter_info>& out, const std::string& prefix, bool buffers) {
    int torch_index = 0;
    each([&]<std::size_t I>() {
      using B = bind_at<I>;
      if constexpr (requires { B::parameter_tensors(); }) {
        if (!buffers)
          for (auto info : B::parameter_tensors()) {
            info.name = prefix + std::to_string(torch_index) + "." + info.name;
            info.offset += table.param[I];
            out.push_back(info);
          }
      }
      if constexpr (has_buffers<B>) {
        if (buffers)
          for (auto info : B::buffer_tensors()) {
            info.name = prefix + std::to_string(torch_index) + "." + info.name;
            info.offset += table.buffer[I];
            out.push_back(info);
          }
      }
      torch_index += torch_modules<layer_at<I>>();
    });
  }
  static std::string description() {
    std::string d;
    each([&]<std::size_t I>() { d += (I ? ", " : "") + bind_at<I>::description(); });
    return d;
  }
};

template <class In, class L>
struct as_chain {
  using type = chain<In, L>;
};
template <class In, class... Layers>
struct as_chain<In, Chain<Layers...>> {
  using type = chain<In, Layers...>;
};

// Parameters, buffers, init streams and per-sample scratch of several chains side by side (the branches of a block),
// and each chain's offsets within them.
template <class... Chains>
struct branch_table {
  static constexpr std::size_t count = sizeof...(Chains);
  static constexpr auto make() {
    struct table {
      index_t param[count + 1] = {}, buffer[count + 1] = {}, scratch[count + 1] = {};
      std::uint64_t stream[count + 1] = {};
      std::size_t generator[count + 1] = {};
    } t;
    index_t p = 0, b = 0, s = 0;
    std::uint64_t st = 0;
    std::size_t g = 0, i = 0;
    ((t.param[i] = p, t.buffer[i] = b, t.scratch[i] = s, t.stream[i] = st, t.generator[i] = g,
      p += aligned(Chains::param_count), b += Chains::buffer_count, s += Chains::scratch_per_sample,
      st += Chains::init_stream_count, g += Chains::runtime_generator_count, ++i),
     ...);
    t.param[count] = p;
    t.buffer[count] = b;
    t.scratch[count] = s;
    t.stream[count] = st;
    t.generator[count] = g;
    return t;
  }
  static constexpr auto table = make();
  static constexpr index_t parameter_values = (index_t{0} + ... + Chains::parameter_values);
  // Branch I's context: the block's, with the branch's first generator where its layers draw.
  template <std::size_t I>
  static layer_context context(const layer_context& ctx) {
    layer_context own = ctx;
    if (own.rng) own.rng += table.generator[I];
    return own;
  }

  template <class Body>
  static void each(Body&& body) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (body.template operator()<I, std::tuple_element_t<I, std::tuple<Chains...>>>(), ...);
    }(std::make_index_sequence<count>{});
  }
  template <class T>
  static void init(T* params, random_generator& rng) {
    const auto base = rng.state();
    each([&]<std::size_t I, class C>() {
      random_generator own(base.seed, base.stream + table.stream[I]);
      C::init(params + table.param[I], own);
    });
  }
  template <class T>
  static void init_buffers(T* buffers) {
    each([&]<std::size_t I, class C>() { C::init_buffers(buffers + table.buffer[I]); });
  }
  // The fusions each branch's chain makes, under the block's prefix and the branch's own ("1.body.").
  template <class Policy, class T>
  static void fusions(const layer_context& ctx, bool fuse, const std::string& prefix,
                      const std::vector<std::string>& branch_prefixes, std::vector<std::string>& out) {
    each([&]<std::size_t I, class C>() {
      C::template fusions<Policy, T>(context<I>(ctx), fuse, prefix + branch_prefixes[I], out);
    });
  }
  static std::vector<static_parameter_info> tensors(bool buffers, const std::vector<std::string>& prefixes) {
    std::vector<static_parameter_info> out;
    each([&]<std::size_t I, class C>() {
      const std::size_t first = out.size();
      C::named_tensors(out, prefixes[I], buffers);
      for (std::size_t k = first; k < out.size(); ++k) out[k].offset += buffers ? table.buffer[I] : table.param[I];
    });
    return out;
  }
};


}  // namespace block_detail

}  // namespace kiln
