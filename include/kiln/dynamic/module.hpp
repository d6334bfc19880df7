// basic_module<T> (Module for float): the base of every dynamic-mode layer and of user models, as torch.nn.Module.
// A module owns named parameters (trainable Variables), named buffers (state that is saved but not trained, such as
// running statistics) and named child modules; it walks them recursively for parameters(), state_dict(), train()...
// with PyTorch's dotted names ("encoder.fc1.weight"), so checkpoints map one to one onto PyTorch's.
//
// Copying a module is shallow: the copy shares parameters and children with the original (handles are references).
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/dynamic/variable.hpp"

namespace kiln::nn {

template <class T>
class basic_module {
 public:
  using value_type = T;
  using variable = basic_variable<T>;
  using module_ptr = std::shared_ptr<basic_module>;
  // An ordered list of (dotted name, tensor): parameters then buffers, module by module, as PyTorch orders them.
  using state_dict_type = std::vector<std::pair<std::string, Tensor<T>>>;

  basic_module() = default;
  basic_module(const basic_module&) = default;
  basic_module(basic_module&&) noexcept = default;
  basic_module& operator=(const basic_module&) = default;
  basic_module& operator=(basic_module&&) noexcept = default;
  virtual ~basic_module() = default;

  // The computation; modules with several inputs add their own overloads beside it.
  virtual variable forward(const variable& x) = 0;
  variable operator()(const variable& x) { return forward(x); }

  // The class name ("Linear"), its arguments ("in_features=784, out_features=128"), and both together on one line.
  virtual std::string name() const { return "Module"; }
  virtual std::string extra_repr() const { return {}; }
  virtual std::string describe() const { return name() + "(" + extra_repr() + ")"; }
  // The module tree, indented as PyTorch prints it.
  std::string to_string() const {
    if (children_.empty()) return describe();
    std::string s = name() + "(";
    if (auto extra = extra_repr(); !extra.empty()) s += "\n  " + extra;
    for (const auto& [child_name, child] : children_) {
      std::string sub = child->to_string();
      for (std::size_t at = sub.find('\n'); at != std::string::npos; at = sub.find('\n', at + 1)) sub.insert(at + 1, "  ");
      s += "\n  (" + child_name + "): " + sub;
    }
    return s + "\n)";
  }

  // A trainable parameter initialised with value: requires_grad, and a zero gradient allocated now (optimizers keep
  // pointers to it, so it is never reallocated).
  variable register_parameter(const std::string& name, const Tensor<T>& value, bool requires_grad = true) {
    check_new_name(name, "register_parameter");
    variable v(value, requires_grad);
    v.ensure_grad();
    parameters_.emplace_back(name, v);
    return v;
  }
  // State saved in state_dict() but not trained (no gradient).
  variable register_buffer(const std::string& name, const Tensor<T>& value) {
    check_new_name(name, "register_buffer");
    variable v(value, false);
    buffers_.emplace_back(name, v);
    return v;
  }
  // A child module, shared with the caller.
  template <class M>
    requires std::derived_from<M, basic_module>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    check_new_name(name, "register_module");
    if (!module) fail("register_module: the module registered as '", name, "' is null");
    children_.emplace_back(name, module);
    return module;
  }
  // A child module given by value: moved into shared ownership; the returned pointer reaches it.
  template <class M>
    requires std::derived_from<std::remove_cvref_t<M>, basic_module>
  std::shared_ptr<std::remove_cvref_t<M>> register_module(const std::string& name, M&& module) {
    return register_module(name, std::make_shared<std::remove_cvref_t<M>>(std::forward<M>(module)));
  }

  // Parameters with dotted names, this module's first, then each child's (each parameter once, even if shared).
  std::vector<std::pair<std::string, variable>> named_parameters(bool recurse = true) const {
    std::vector<std::pair<std::string, variable>> out;
    std::unordered_set<const void*> seen;
    collect(out, seen, "", recurse, &basic_module::parameters_);
    return out;
  }
  std::vector<variable> parameters(bool recurse = true) const { return values_of(named_parameters(recurse)); }
  std::vector<std::pair<std::string, variable>> named_buffers(bool recurse = true) const {
    std::vector<std::pair<std::string, variable>> out;
    std::unordered_set<const void*> seen;
    collect(out, seen, "", recurse, &basic_module::buffers_);
    return out;
  }
  std::vector<variable> buffers(bool recurse = true) const { return values_of(named_buffers(recurse)); }
  const std::vector<std::pair<std::string, module_ptr>>& named_children() const { return children_; }
  std::vector<module_ptr> children() const {
    std::vector<module_ptr> out;
    for (const auto& c : children_) out.push_back(c.second);
    return out;
  }

  // Calls fn on every descendant, children before their parent, then on this module, as torch.nn.Module.apply: the
  // usual way to initialise a model's layers by kind (dynamic_cast to the module type, then kiln::nn::init).
  template <class Fn>
  basic_module& apply(Fn&& fn) {
    for (auto& c : children_) c.second->apply(fn);
    fn(*this);
    return *this;
  }

  // Training mode (the default) or evaluation mode, for this module and every descendant.
  virtual void train(bool on = true) {
    training_ = on;
    for (auto& c : children_) c.second->train(on);
  }
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Zero-fills every parameter's gradient, recursively, without allocating.
  void zero_grad() {
    for (auto& p : parameters_) p.second.zero_grad();
    for (auto& c : children_) c.second->zero_grad();
  }

  // The number of parameter elements, recursively.
  index_t parameter_count() const {
    index_t n = 0;
    for (const auto& p : named_parameters()) n += p.second.numel();
    return n;
  }

  // Copies of every parameter and buffer under PyTorch's names.
  KILN_KERNEL state_dict_type state_dict() const {
    state_dict_type dict;
    for_each_state("", [&](const std::string& key, const variable& v) {
      dict.emplace_back(key, v.tensor());
    });
    return dict;
  }
  // Loads parameters and buffers by name from any range of (name, Tensor<T>) pairs (a state_dict_type, a std::map).
  // Everything is checked first: a shape mismatch, and with strict a missing or unexpected name, throws kiln::error
  // naming each offending key (and both shapes), and leaves the module unchanged.
  template <class Dict>
  KILN_KERNEL void load_state_dict(const Dict& dict, bool strict = true) {
    std::map<std::string, const Tensor<T>*> given;
    std::vector<std::string> problems;
    for (const auto& [key, tensor] : dict)
      if (!given.emplace(key, &tensor).second) problems.push_back("duplicate key '" + key + "'");
    std::vector<std::pair<variable, const Tensor<T>*>> copies;
    std::unordered_set<std::string> used;
    for_each_state("", [&](const std::string& key, const variable& v) {
      auto it = given.find(key);
      if (it == given.end()) {
        if (strict) problems.push_back("missing key '" + key + "' (expected shape " + v.shape().str() + ")");
        return;
      }
      used.insert(key);
      if (it->second->shape() != v.shape()) {
        problems.push_back("shape mismatch for '" + key + "': expected " + v.shape().str() + " (the module's), found " +
                           it->second->shape().str() + " (the state dict's)");
        return;
      }
      copies.emplace_back(v, it->second);
    });
    if (strict)
      for (const auto& [key, tensor] : given)
        if (!used.count(key))
          problems.push_back("unexpected key '" + key + "' (shape " + tensor->shape().str() + ")");
    if (!problems.empty()) {
      std::string message = "load_state_dict into " + name() + ": ";
      for (std::size_t i = 0; i < problems.size(); ++i) message += (i ? "; " : "") + problems[i];
      fail(message);
    }
    for (auto& [v, tensor] : copies) detail::copy_values_from_host(tensor->data(), v.data(), tensor->numel());
  }

  // Where a module's initial values came from: the (seed, stream) of kiln::next_init_generator() it drew.
  struct init_origin {
    std::uint64_t seed = 0, stream = 0;
    basic_module* module = nullptr;
  };
  // The init origins of this module and its descendants, in positional (depth-first) order.
  void collect_init_origins(std::vector<init_origin>& out) {
    if (has_init_) out.push_back({init_seed_, init_stream_, this});
    for (auto& c : children_) c.second->collect_init_origins(out);
  }
  // The generators of the modules that draw at run time (dropout masks), this one's and its descendants', in
  // positional order: the k-th is on stream runtime_stream_base + k of the seed, as in a static Sequential. A
  // checkpoint saves and restores their states.
  std::vector<random_generator*> runtime_generators() {
    std::vector<random_generator*> out;
    collect_runtime_generators(out);
    return out;
  }
  void collect_runtime_generators(std::vector<random_generator*>& out) {
    if (auto* g = own_runtime_generator()) out.push_back(g);
    for (auto& c : children_) c.second->collect_runtime_generators(out);
  }
  // Re-draws this module's own parameters from stream `stream` of `seed` (modules with parameters override
  // reset_parameters; the origin is updated).
  void reinitialize_from(std::uint64_t seed, std::uint64_t stream) {
    random_generator rng(seed, stream);
    init_seed_ = seed;
    init_stream_ = stream;
    reset_parameters(rng);
  }
  // Whether this module's own parameters still hold exactly what its init stream draws, i.e. nothing (an assignment
  // through value(), load_state_dict, an optimizer step) has changed them since the draw. Writes can come through any
  // pointer, so rather than track them this draws the stream again and compares; the values found are put back
  // either way. A module that drew no stream has nothing to compare and counts as unchanged.
  bool holds_initial_values() {
    if (!has_init_) return true;
    std::vector<Tensor<T>> found;
    for (const auto& p : parameters_) found.push_back(p.second.tensor());
    random_generator rng(init_seed_, init_stream_);
    reset_parameters(rng);
    bool same = true;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const variable& v = parameters_[i].second;
      const Tensor<T> drawn = v.tensor();
      const auto bytes = static_cast<std::size_t>(v.numel()) * sizeof(T);
      if (bytes && std::memcmp(drawn.data(), found[i].data(), bytes) != 0) same = false;
      detail::copy_values_from_host(found[i].data(), v.data(), v.numel());
    }
    return same;
  }

 protected:
  // Takes kiln::next_init_generator() and remembers its stream; modules with parameters initialise from it.
  random_generator take_init_generator() {
    random_generator rng = next_init_generator();
    has_init_ = true;
    init_seed_ = rng.state().seed;
    init_stream_ = rng.state().stream;
    return rng;
  }
  // Draws this module's own parameters from rng, as its constructor did.
  virtual void reset_parameters(random_generator&) {}
  // The generator of a module that draws at run time (taken from kiln::next_runtime_generator()), or null.
  virtual random_generator* own_runtime_generator() { return nullptr; }

  // Containers (Sequential) reorder and rename their children.
  std::vector<std::pair<std::string, module_ptr>>& mutable_children() { return children_; }

  // For containers (Sequential, Residual, Add, Concat), after their children are registered. C++ evaluates function
  // arguments in an unspecified order (GCC: right to left), so in Sequential(Linear(...), ReLU(), Linear(...)) the
  // Linears may draw their init streams last-first. Python evaluates
  // left to right; to give the weights PyTorch (and a static Sequential with the same seed) would, the streams the
  // children drew are handed out again in positional order, and any module whose stream changes is redrawn.
  //
  // PyTorch's containers never change the weights of the modules it is given, so the redraw is limited to
  // children that can only be the arguments of this very call, fresh from their constructors: it happens only when
  // (a) together the children drew exactly the most recent streams of the current seed, none skipped and none drawn
  // since (anything made before them, or a module shared with another model, fails this), and (b) every child's
  // parameters still hold exactly what its stream draws (holds_initial_values: weights loaded or assigned, or
  // trained, fail this). Otherwise every child keeps its weights, whatever their order. Modules that draw at run
  // time (dropout) follow the same rule with their runtime streams and untouched positions.
  void restore_construction_order() {
    restore_init_order();
    restore_runtime_order();
  }

 private:
  void restore_init_order() {
    std::vector<typename basic_module<T>::init_origin> origins;
    collect_init_origins(origins);
    std::vector<std::uint64_t> streams;
    for (const auto& o : origins) streams.push_back(o.stream);
    std::sort(streams.begin(), streams.end());
    bool in_order = true;
    for (std::size_t i = 0; i < origins.size(); ++i) in_order = in_order && origins[i].stream == streams[i];
    if (in_order) return;
    const init_streams& drawn = global_init_streams();
    for (const auto& o : origins)
      if (o.seed != drawn.seed) return;
    if (!drawn_last(streams, drawn.next_stream, 0)) return;
    for (const auto& o : origins)
      if (!o.module->holds_initial_values()) return;
    for (std::size_t i = 0; i < origins.size(); ++i)
      if (origins[i].stream != streams[i]) origins[i].module->reinitialize_from(origins[i].seed, streams[i]);
  }
  // The same for the streams of modules that draw at run time (each keeps its position, which must still be 0).
  void restore_runtime_order() {
    auto generators = runtime_generators();
    const init_streams& drawn = global_init_streams();
    std::vector<std::uint64_t> streams;
    for (auto* g : generators) {
      if (g->state().seed != drawn.seed || g->state().position != 0) return;
      streams.push_back(g->state().stream);
    }
    std::sort(streams.begin(), streams.end());
    if (!drawn_last(streams, drawn.next_runtime_stream, runtime_stream_base)) return;
    for (std::size_t i = 0; i < generators.size(); ++i) {
      auto state = generators[i]->state();
      state.stream = streams[i];
      generators[i]->set_state(state);
    }
  }
  // Whether sorted streams are base + next - k, ..., base + next - 1: the last k of a seed's counter, no gaps.
  static bool drawn_last(const std::vector<std::uint64_t>& sorted, std::uint64_t next, std::uint64_t base) {
    if (sorted.size() > next) return false;
    const std::uint64_t first = base + next - sorted.size();
    for (std::size_t i = 0; i < sorted.size(); ++i)
      if (sorted[i] != first + i) return false;
    return true;
  }

 protected:
  void check_new_name(const std::string& name, const char* where) const {
    if (name.empty() || name.find('.') != std::string::npos)
      fail(this->name(), ".", where, ": expected a non-empty name without '.', found '", name, "'");
    auto taken = [&](const auto& list) {
      for (const auto& entry : list)
        if (entry.first == name) return true;
      return false;
    };
    if (taken(parameters_) || taken(buffers_) || taken(children_))
      fail(this->name(), ".", where, ": the name '", name, "' is already taken");
  }

 private:
  using named_list = std::vector<std::pair<std::string, variable>>;

  void collect(named_list& out, std::unordered_set<const void*>& seen, const std::string& prefix, bool recurse,
               named_list basic_module::*which) const {
    for (const auto& [n, v] : this->*which)
      if (seen.insert(v.node()).second) out.emplace_back(prefix + n, v);
    if (recurse)
      for (const auto& [n, c] : children_) c->collect(out, seen, prefix + n + ".", true, which);
  }
  static std::vector<variable> values_of(const named_list& named) {
    std::vector<variable> out;
    out.reserve(named.size());
    for (const auto& p : named) out.push_back(p.second);
    return out;
  }
  // PyTorch's state_dict order: this module's parameters, its buffers, then each child's, depth first.
  template <class Body>
  void for_each_state(const std::string& prefix, Body&& body) const {
    for (const auto& [n, v] : parameters_) body(prefix + n, v);
    for (const auto& [n, v] : buffers_) body(prefix + n, v);
    for (const auto& [n, c] : children_) c->for_each_state(prefix + n + ".", body);
  }

  named_list parameters_;
  named_list buffers_;
  std::vector<std::pair<std::string, module_ptr>> children_;
  bool training_ = true;
  bool has_init_ = false;
  std::uint64_t init_seed_ = 0, init_stream_ = 0;
};

using Module = basic_module<float>;

}  // namespace kiln::nn
