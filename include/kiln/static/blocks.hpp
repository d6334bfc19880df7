// Graph blocks of static mode, usable wherever a layer is (in a Sequential and in each other):
//   kiln::Chain<Layers...>                      the layers one after another (a sub-chain: no policy, no input)
//   kiln::Residual<Layers...>                   y = x + f(x), f the chain of Layers
//   kiln::Residual<Shortcut<S...>, Layers...>   y = s(x) + f(x), s the chain of S (for a change of shape)
//   kiln::Add<Branches...>                      y = the branches' outputs summed (each a layer or a Chain)
//   kiln::Concat<Axis, Branches...>             y = the branches' outputs joined along Axis of the sample
// Each is a layer of layers/layer_contract.hpp: its bind plans its sub-layers' parameters, buffers and activations
// inside its own slices and scratch, runs them in order forward and in reverse backward, and adds or joins what its
// branches give. Shapes are checked at compile time. state_dict names follow the PyTorch modules of the same nesting
// (dynamic/modules/blocks.hpp): "body.<i>.", "shortcut.<i>." and "<branch>.<i>." before each sub-layer's own names,
// with <i> counting a layer with a fused activation as two modules, as Sequential does. Initial weights are drawn
// from one stream per sub-layer with parameters, in order, as dynamic mode's modules draw theirs.
//
// Inside a block, a chain runs as the Sequential does: the fusion rules (static/fusion_rules.hpp) choose how each of
// its positions runs. Layers that draw at run time (Dropout) take generators of their own, in order across the
// branches (B::runtime_generator_count), on the streams dynamic mode's modules of the same nesting take.
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
#include "kiln/static/block_chains.hpp"
#include "kiln/static/layer_traits.hpp"
#include "kiln/static/shape_check.hpp"

namespace kiln {

template <class... Layers>
struct Chain;
template <class... Layers>
struct Shortcut {};

namespace block_detail {

// Fails with a static_assert naming the block and both shapes (the compiler prints the template arguments) when a
// residual's body does not keep the shape it is added to.
template <class Block, class Body, class Added>
struct residual_fits {
  static constexpr bool value = std::is_same_v<Body, Added>;
  static_assert(value,
                "kiln::Residual: the body's output (Body) differs from the shape it is added to (Added, the input or "
                "the shortcut's output): add a kiln::Shortcut<...> as the first argument that changes the shape as "
                "the body does (for images Conv2D<C, 1, conv_options{.stride = S}> and BatchNorm2d; for vectors Dense)");
};
// The same for the branches of an Add or a Concat: First is the first branch's output, Other another's.
template <class Block, int Branch, class First, class Other>
struct branches_fit {
  static constexpr bool value = std::is_same_v<First, Other>;
  static_assert(value, "kiln::Add: branch Branch gives a sample of shape Other, branch 0 of shape First; the branches "
                       "of an Add must give the same shape");
};
template <class Block, int Axis, int Branch, class First, class Other>
struct concat_fits {
  static constexpr bool value = [] {
    if constexpr (First::rank != Other::rank || Axis < 1 || Axis > First::rank) {
      return false;
    } else {
      for (int d = 0; d < First::rank; ++d)
        if (d != Axis - 1 && First::extents[std::size_t(d)] != Other::extents[std::size_t(d)]) return false;
      return true;
    }
  }();
  static_assert(value, "kiln::Concat: branch Branch gives a sample of shape Other, branch 0 of shape First; they must "
                       "agree outside Axis (1 is the first dimension of a sample: the channels of an image)");
};

// D with extent Axis (0-based within the sample) replaced by Value.
template <class D, int Axis, index_t Value, class Seq = std::make_index_sequence<std::size_t(D::rank)>>
struct with_extent;
template <index_t... E, int Axis, index_t Value, std::size_t... I>
struct with_extent<dims<E...>, Axis, Value, std::index_sequence<I...>> {
  using type = dims<(int(I) == Axis ? Value : dims<E...>::extents[I])...>;
};

template <class In, class... Layers>
struct residual_parts {
  using body = chain<In, Layers...>;
  using shortcut = void;
};
template <class In, class... S, class... Layers>
struct residual_parts<In, Shortcut<S...>, Layers...> {
  using body = chain<In, Layers...>;
  using shortcut = chain<In, S...>;
};



// What Add and Concat share: their branches as chains, planned side by side.
template <class In, class... Branches>
struct branches_of {
  using table = branch_table<typename as_chain<In, Branches>::type...>;
  using first = typename std::tuple_element_t<0, std::tuple<typename as_chain<In, Branches>::type...>>::output;
  // Runs every branch; out[b] is where branch b's output is.
  template <class Policy, class T>
  static void forward(const T* params, T* buffers, const T* x, T* scratch, const layer_context& ctx, bool fuse,
                      const T** out) {
    const index_t n = ctx.batch;
    table::each([&]<std::size_t I, class C>() {
      out[I] = C::template forward<Policy>(params + table::table.param[I], buffers + table::table.buffer[I], x,
                                          scratch + table::table.scratch[I] * n, table::template context<I>(ctx),
                                          fuse);
    });
  }
  // Back-propagates branch b from dys[b] (overwritten); dx (overwritten, or null) gets the sum over the branches,
  // each but the first through dx_scratch.
  template <class Policy, class T>
  static void backward(const T* params, const T* x, T* const* dys, T* dx, T* dx_scratch, T* dparams, T* scratch,
                       const layer_context& ctx) {
    const index_t n = ctx.batch;
    table::each([&]<std::size_t I, class C>() {
      T* into = (I == 0 || !dx) ? dx : dx_scratch;
      C::template backward<Policy>(params + table::table.param[I], x, dys[I], into, dparams + table::table.param[I],
                                   scratch + table::table.scratch[I] * n, table::template context<I>(ctx));
      if (I > 0 && dx) Policy::accumulate(static_cast<const T*>(dx_scratch), dx, n * In::size);
    });
  }
  static std::string description() {
    std::string d;
    table::each([&]<std::size_t I, class C>() { d += (I ? "; " : "") + C::description(); });
    return d;
  }
};


// What every block's bind says of its branches (a branch_table): their parameters, buffers and init streams side by
// side, and their tensors' names under the block's prefixes (Prefixes::get(): "body.", "shortcut.", or "0.", "1.").
template <class Branches, class Prefixes>
struct branch_members {
  static constexpr std::size_t branch_count = Branches::count;
  static constexpr index_t param_count = Branches::table.param[branch_count];
  static constexpr index_t parameter_values = Branches::parameter_values;
  static constexpr index_t buffer_count = Branches::table.buffer[branch_count];
  static constexpr std::uint64_t init_stream_count = Branches::table.stream[branch_count];
  // The branches' own scratch, per sample; a block plans what it needs after it.
  static constexpr index_t branch_scratch = Branches::table.scratch[branch_count];
  static constexpr bool aliases_input = false;
  // The generators of the layers inside that draw at run time (Dropout), in branch order: ctx.rng points to the first.
  static constexpr std::size_t runtime_generator_count = Branches::table.generator[branch_count];
  static constexpr bool draws_at_run_time = runtime_generator_count > 0;

  template <class T>
  static void init(T* params, random_generator& rng) {
    Branches::init(params, rng);
  }
  template <class T>
  static void init_buffers(T* buffers) {
    Branches::init_buffers(buffers);
  }
  static std::vector<static_parameter_info> parameter_tensors() { return Branches::tensors(false, Prefixes::get()); }
  // The fusions inside the block, one line each, the positions under the block's names ("1.body.0 Conv2D(...) +
  // 1.body.1 ReLU: ...").
  template <class Policy, class T>
  static void fusions(const layer_context& ctx, bool fuse, const std::string& prefix, std::vector<std::string>& out) {
    Branches::template fusions<Policy, T>(ctx, fuse, prefix, Prefixes::get(), out);
  }
  static std::vector<static_parameter_info> buffer_tensors() { return Branches::tensors(true, Prefixes::get()); }
};

// The names a block gives its branches.
struct chain_prefixes {
  static std::vector<std::string> get() { return {""}; }
};
struct residual_prefixes {
  static std::vector<std::string> get() { return {"body.", "shortcut."}; }
};
template <std::size_t N>
struct numbered_prefixes {
  static std::vector<std::string> get() {
    std::vector<std::string> p;
    for (std::size_t i = 0; i < N; ++i) p.push_back(std::to_string(i) + ".");
    return p;
  }
};

// What a block's own type says: it is not an activation and takes what its layers take (its bind checks them).
struct block_layer {
  static constexpr bool is_activation = false;
  template <class In>
  static constexpr bool accepts = true;
};

// A residual block's parts on input In: the body, the shortcut (the identity when absent: an empty chain) and both
// as a branch_table.
template <class In, class... Layers>
struct residual_plan {
  using parts = residual_parts<In, Layers...>;
  using body = typename parts::body;
  static constexpr bool has_shortcut = !std::is_void_v<typename parts::shortcut>;
  using shortcut = std::conditional_t<has_shortcut, typename parts::shortcut, chain<In>>;
  using branches = std::conditional_t<has_shortcut, branch_table<body, shortcut>, branch_table<body>>;
};

}  // namespace block_detail

// Chain<Layers...>: its layers one after another, as one layer.
template <class... Layers>
struct Chain : block_detail::block_layer {
  static_assert(sizeof...(Layers) > 0, "kiln::Chain: expected at least one layer");
  static constexpr const char* name = "Chain";
  static constexpr const char* requirement = "what its first layer accepts";

  template <class In>
  struct bind : block_detail::branch_members<block_detail::branch_table<block_detail::chain<In, Layers...>>,
                                             block_detail::chain_prefixes> {
    using body = block_detail::chain<In, Layers...>;
    using output = typename body::output;
    static constexpr index_t scratch_per_sample = body::scratch_per_sample;

    template <class Policy, class T>
    static void forward(const T* params, T* buffers, const T* x, T* y, T* scratch, const layer_context& ctx,
                        bool fuse) {
      const T* out = body::template forward<Policy>(params, buffers, x, scratch, ctx, fuse);
      Policy::copy(out, y, ctx.batch * output::size);
    }
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      body::template backward<Policy>(params, x, dy, dx, dparams, scratch, ctx);
    }
    static std::string description() { return "Chain(" + body::description() + ")"; }
  };
};

// Residual<Layers...>: y = x + f(x); Residual<Shortcut<S...>, Layers...>: y = s(x) + f(x).
template <class... Layers>
struct Residual : block_detail::block_layer {
  static constexpr const char* name = "Residual";
  static constexpr const char* requirement = "what its body accepts";

  template <class In>
  struct bind : block_detail::branch_members<typename block_detail::residual_plan<In, Layers...>::branches,
                                             block_detail::residual_prefixes> {
    using plan = block_detail::residual_plan<In, Layers...>;
    using body = typename plan::body;
    using shortcut = typename plan::shortcut;
    using branches = typename plan::branches;
    static constexpr bool has_shortcut = plan::has_shortcut;
    using added = std::conditional_t<has_shortcut, typename shortcut::output, In>;
    static_assert(block_detail::residual_fits<Residual, typename body::output, added>::value);
    using output = typename body::output;
    // The branches' scratch, then a copy of dy for the shortcut and the body's input gradient.
    static constexpr index_t own_scratch = bind::branch_scratch;
    static constexpr index_t scratch_per_sample = own_scratch + (has_shortcut ? output::size : 0) + In::size;
    template <class Policy, class T>
    static void forward(const T* params, T* buffers, const T* x, T* y, T* scratch, const layer_context& ctx,
                        bool fuse) {
      const index_t n = ctx.batch;
      const auto& t = branches::table;
      const T* f = body::template forward<Policy>(params, buffers, x, scratch, ctx, fuse);
      const T* s = x;
      if constexpr (has_shortcut)
        s = shortcut::template forward<Policy>(params + t.param[1], buffers + t.buffer[1], x, scratch + t.scratch[1] * n,
                                               branches::template context<1>(ctx), fuse);
      Policy::add(s, f, y, n * output::size);
    }
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      const index_t n = ctx.batch;
      const auto& t = branches::table;
      T* dy_copy = scratch + own_scratch * n;
      T* body_dx = dy_copy + (has_shortcut ? output::size * n : 0);
      if constexpr (has_shortcut) Policy::copy(static_cast<const T*>(dy), dy_copy, n * output::size);
      else if (dx) Policy::copy(static_cast<const T*>(dy), dx, n * In::size);  // the identity's share
      body::template backward<Policy>(params, x, dy, dx ? body_dx : nullptr, dparams, scratch, ctx);
      if constexpr (has_shortcut)
        shortcut::template backward<Policy>(params + t.param[1], x, dy_copy, dx, dparams + t.param[1],
                                            scratch + t.scratch[1] * n, branches::template context<1>(ctx));
      if (dx) Policy::accumulate(static_cast<const T*>(body_dx), dx, n * In::size);
    }
    static std::string description() {
      std::string d = "Residual(" + body::description();
      if constexpr (has_shortcut) d += "; shortcut " + shortcut::description();
      return d + ")";
    }
  };
};
// Add<Branches...>: the branches (each a layer or a Chain) on the same input, their outputs summed.
template <class... Branches>
struct Add : block_detail::block_layer {
  static_assert(sizeof...(Branches) > 0, "kiln::Add: expected at least one branch");
  static constexpr const char* name = "Add";
  static constexpr const char* requirement = "what every branch accepts";

  template <class In>
  struct bind : block_detail::branch_members<typename block_detail::branches_of<In, Branches...>::table,
                                             block_detail::numbered_prefixes<sizeof...(Branches)>> {
    using of = block_detail::branches_of<In, Branches...>;
    using branches = typename of::table;
    using output = typename of::first;
    static constexpr bool fits = []<std::size_t... I>(std::index_sequence<I...>) {
      return (true && ... &&
              block_detail::branches_fit<Add, int(I), output,
                                         typename block_detail::as_chain<In, Branches>::type::output>::value);
    }(std::make_index_sequence<sizeof...(Branches)>{});
    static_assert(fits);
    static constexpr std::size_t count = sizeof...(Branches);
    static constexpr index_t own_scratch = bind::branch_scratch;
    // The branches' scratch, then a copy of dy for each branch but the last, and one input gradient.
    static constexpr index_t scratch_per_sample = own_scratch + index_t(count - 1) * output::size + In::size;
    template <class Policy, class T>
    static void forward(const T* params, T* buffers, const T* x, T* y, T* scratch, const layer_context& ctx,
                        bool fuse) {
      const index_t n = ctx.batch * output::size;
      const T* out[count];
      of::template forward<Policy>(params, buffers, x, scratch, ctx, fuse, out);
      if constexpr (count == 1) {
        Policy::copy(out[0], y, n);
      } else {
        Policy::add(out[0], out[1], y, n);
        for (std::size_t b = 2; b < count; ++b) Policy::accumulate(out[b], y, n);
      }
    }
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      const index_t n = ctx.batch;
      T* dys[count];
      T* copies = scratch + own_scratch * n;
      for (std::size_t b = 0; b + 1 < count; ++b) {  // every branch gets dy; each may overwrite its own
        dys[b] = copies + index_t(b) * output::size * n;
        Policy::copy(static_cast<const T*>(dy), dys[b], n * output::size);
      }
      dys[count - 1] = dy;
      of::template backward<Policy>(params, x, dys, dx, copies + index_t(count - 1) * output::size * n, dparams,
                                    scratch, ctx);
    }
    static std::string description() { return "Add(" + of::description() + ")"; }
  };
};

// Concat<Axis, Branches...>: the branches on the same input, their outputs joined along Axis (PyTorch's dim: 0 is the
// batch, 1 the first dimension of a sample, such as the channels of an image).
template <int Axis, class... Branches>
struct Concat : block_detail::block_layer {
  static_assert(sizeof...(Branches) > 0, "kiln::Concat: expected at least one branch");
  static_assert(Axis >= 1, "kiln::Concat: Axis counts the batch as 0 (PyTorch's dim); join along a sample's "
                           "dimension, 1 or more");
  static constexpr const char* name = "Concat";
  static constexpr const char* requirement = "what every branch accepts";

  template <class In>
  struct bind : block_detail::branch_members<typename block_detail::branches_of<In, Branches...>::table,
                                             block_detail::numbered_prefixes<sizeof...(Branches)>> {
    using of = block_detail::branches_of<In, Branches...>;
    using branches = typename of::table;
    using first = typename of::first;
    static constexpr std::size_t count = sizeof...(Branches);
    template <std::size_t I>
    using branch_output = typename block_detail::as_chain<
        In, std::tuple_element_t<I, std::tuple<Branches...>>>::type::output;
    static constexpr bool fits = []<std::size_t... I>(std::index_sequence<I...>) {
      return (true && ... && block_detail::concat_fits<Concat, Axis, int(I), first, branch_output<I>>::value);
    }(std::make_index_sequence<count>{});
    static_assert(fits);
    // The sample seen as [outer, extent along Axis, inner].
    static constexpr int axis = Axis - 1 < first::rank ? Axis - 1 : 0;
    static constexpr index_t outer = [] {
      index_t o = 1;
      for (int d = 0; d < axis; ++d) o *= first::extents[std::size_t(d)];
      return o;
    }();
    static constexpr index_t inner = first::size / (outer * first::extents[std::size_t(axis)]);
    static constexpr index_t joined = []<std::size_t... I>(std::index_sequence<I...>) {
      return (index_t{0} + ... + branch_output<I>::extents[std::size_t(axis)]);
    }(std::make_index_sequence<count>{});
    using output = typename block_detail::with_extent<first, axis, joined>::type;
    // Values per row of the [outer, extent, inner] view that branch I fills.
    template <std::size_t I>
    static constexpr index_t width = branch_output<I>::extents[std::size_t(axis)] * inner;
    static constexpr index_t own_scratch = bind::branch_scratch;
    // The branches' scratch, then each branch's share of dy, and one input gradient.
    static constexpr index_t scratch_per_sample = own_scratch + output::size + In::size;
    template <class Policy, class T>
    static void forward(const T* params, T* buffers, const T* x, T* y, T* scratch, const layer_context& ctx,
                        bool fuse) {
      const T* out[count];
      of::template forward<Policy>(params, buffers, x, scratch, ctx, fuse, out);
      const index_t rows = ctx.batch * outer;
      index_t at = 0;
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((Policy::copy_rows(rows, width<I>, out[I], width<I>,
                            y + at, joined * inner),
          at += width<I>),
         ...);
      }(std::make_index_sequence<count>{});
    }
    template <class Policy, class T>
    static void backward(const T* params, const T* x, const T*, T* dy, T* dx, T* dparams, T* scratch,
                         const layer_context& ctx) {
      const index_t n = ctx.batch, rows = n * outer;
      T* shares = scratch + own_scratch * n;
      T* dys[count];
      index_t at = 0, offset = 0;
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((dys[I] = shares + offset, offset += n * branch_output<I>::size,
          Policy::copy_rows(rows, width<I>, static_cast<const T*>(dy) + at,
                            joined * inner, dys[I], width<I>),
          at += width<I>),
         ...);
      }(std::make_index_sequence<count>{});
      of::template backward<Policy>(params, x, dys, dx, shares + n * output::size, dparams, scratch, ctx);
    }
    static std::string description() { return "Concat(dim=" + std::to_string(Axis) + "; " + of::description() + ")"; }
  };
};

}  // namespace kiln
