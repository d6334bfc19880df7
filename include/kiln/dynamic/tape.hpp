// The autograd tape: a thread-local list of entries, one per differentiable op, appended as the ops run
// (docs/design.md, "Dynamic mode"). An entry is a plain struct (a function pointer, the output, up to four inputs, two
// small saved numbers) in a vector whose capacity is kept, so recording costs no allocation after warm-up and no
// std::function; the ops that must save more (a permutation, an index array, a cat's inputs) add a saved_state.
//
// Lifetime: an entry holds references to its inputs but not to its output. When the output dies (the user dropped
// it and no later op used it), its entry dies too and releases its inputs, and dead entries at the end of the tape are
// popped; so a forward pass whose result is thrown away (evaluation without no_grad) leaves nothing behind, as in
// PyTorch. backward() walks the tape in reverse from the loss's entry and frees the entries it went through (the graph
// of that loss), as PyTorch does without retain_graph: other graphs recorded beside it (a generator's output whose
// discriminator loss used a detached copy) stay differentiable, and a later backward that would have to go through a
// freed part raises an error instead of dropping the gradient that should have flowed there.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/dynamic/grad_mode.hpp"
#include "kiln/dynamic/node.hpp"

namespace kiln::nn::detail {

template <class T>
struct tape_entry;
// An op's backward: reads entry.out->grad and adds into (or writes) its inputs' gradients.
template <class T>
using backward_function = void (*)(const tape_entry<T>&);

// What an op saves for its backward beyond an entry's inline fields (a list of dimensions, a permutation, an index
// array, the inputs of a cat past the fourth, a custom function's context). The entry owns it; `inputs` holds
// references, released with it, to further inputs, which backward() checks as it checks in[].
template <class T>
struct saved_state {
  saved_state() = default;
  saved_state(const saved_state&) = delete;
  saved_state& operator=(const saved_state&) = delete;
  virtual ~saved_state() {
    for (auto* n : inputs) release(n);
  }
  // Takes a reference to n and keeps it until this state dies.
  void keep_input(variable_node<T>* n) {
    retain(n);
    inputs.push_back(n);
  }
  std::vector<variable_node<T>*> inputs;
};

template <class T>
struct tape_entry {
  backward_function<T> backward = nullptr;
  variable_node<T>* out = nullptr;  // not owned; null once the entry is dead
  variable_node<T>* in[4] = {};     // owned references; unused slots are null
  T scalar = T(0);                  // a saved number (a slope, a scale)
  int aux = 0;                      // a saved integer (a dimension)
  int owner = -1;                   // the profiled part that recorded it (dynamic/step_profile.hpp), or -1
  saved_state<T>* saved = nullptr;  // owned; null for the ops whose inline fields suffice
};

// Told when each entry's backward is done, during a profiled backward (dynamic/step_profile.hpp).
class backward_observer {
 public:
  virtual void entry_done(int owner) = 0;

 protected:
  ~backward_observer() = default;
};

// Told during a backward when the gradient of each of a set of leaves is final: no entry left to walk takes that leaf
// as an input. Data-parallel training (distributed/dynamic_data_parallel.hpp) starts reducing those gradients while
// the rest of the backward runs, as PyTorch's DDP does from its gradient hooks. A leaf that this loss's graph does not
// use is told of at the end.
template <class T>
class gradient_ready_listener {
 public:
  // The leaves watched, in the listener's own order: gradient_ready(i) refers to the i-th.
  virtual std::span<variable_node<T>* const> watched_leaves() const = 0;
  virtual void gradient_ready(std::size_t index) = 0;

 protected:
  ~gradient_ready_listener() = default;
};

// Seeds backward() at a one-element root: a leaf's gradient accumulates the 1, an op's output is set to it, and a
// root without a gradient gets one.
template <class T>
void seed_gradient(variable_node<T>* root) {
  if (!root->grad) write_value(allocate_grad(root, false), T(1));
  else if (root->is_leaf) {
    materialize_grad(root);  // one element: a lazy zero_grad's zero, then the same add as for any leaf
    write_value(root->grad, read_value(static_cast<const T*>(root->grad)) + T(1));
  } else {
    write_value(root->grad, T(1));
  }
}

template <class T>
class tape {
 public:
  tape() { entries_.reserve(256); }
  tape(const tape&) = delete;
  tape& operator=(const tape&) = delete;
  ~tape() {
    clear();
    destroyed() = true;
  }

  static bool& destroyed() {
    static thread_local bool flag = false;
    return flag;
  }
  static tape& instance() {
    static thread_local tape t;
    return t;
  }

  // Appends an entry; takes references to the inputs. out must be a fresh node produced by the op.
  void record(backward_function<T> fn, variable_node<T>* out, variable_node<T>* a, variable_node<T>* b = nullptr,
              variable_node<T>* c = nullptr, T scalar = T(0), int aux = 0, variable_node<T>* d = nullptr) {
    retain(a);
    retain(b);
    retain(c);
    retain(d);
    if (entries_.size() == entries_.capacity()) compact();
    out->creator = static_cast<int>(entries_.size());
    entries_.push_back(tape_entry<T>{fn, out, {a, b, c, d}, scalar, aux, owner_});
  }
  // The same, with state the backward reads (the entry takes ownership of it).
  void record(backward_function<T> fn, variable_node<T>* out, std::unique_ptr<saved_state<T>> saved,
              variable_node<T>* a = nullptr, variable_node<T>* b = nullptr, T scalar = T(0), int aux = 0) {
    if (entries_.size() == entries_.capacity()) compact();
    retain(a);
    retain(b);
    out->creator = static_cast<int>(entries_.size());
    entries_.push_back(tape_entry<T>{fn, out, {a, b, nullptr, nullptr}, scalar, aux, owner_, saved.release()});
  }

  // The output of entry `index` died: drop the entry, release its inputs, pop dead entries off the end.
  void forget(int index) {
    auto& e = entries_[static_cast<std::size_t>(index)];
    variable_node<T>* inputs[4] = {e.in[0], e.in[1], e.in[2], e.in[3]};
    saved_state<T>* saved = std::exchange(e.saved, nullptr);
    e.out = nullptr;
    e.in[0] = e.in[1] = e.in[2] = e.in[3] = nullptr;
    for (auto* n : inputs) release(n);  // may come back into forget() for earlier entries
    delete saved;
    pop_dead_entries();
  }

  // Back-propagates from root (which holds one element, requires grad and was made by an op), then frees the entries
  // it went through, unless retain_graph keeps them for another backward. An entry whose output got no gradient is not
  // part of this loss's graph and stays.
  // A listener is told when each of its leaves' gradients is final (see gradient_ready_listener).
  void backward(variable_node<T>* root, bool retain_graph = false, gradient_ready_listener<T>* listener = nullptr) {
    struct free_at_exit {
      tape* self;
      int top;
      ~free_at_exit() {
        self->seeded_root_ = nullptr;
        self->retaining_graph_ = false;
        self->free_walked(top);
      }
    } guard{this, root->creator};
    retaining_graph_ = retain_graph;
    seed_gradient(root);
    seeded_root_ = root->is_leaf ? nullptr : root;
    leaf_readiness readiness(entries_, root->creator, listener);
    for (int i = root->creator; i >= 0; --i) {
      readiness.passed(i + 1);
      auto& e = entries_[static_cast<std::size_t>(i)];
      if (!e.out || !e.out->grad) continue;  // dead, or not part of this loss's graph
      for (auto* n : e.in)
        if (n && n->graph_freed && n->requires_grad) fail_freed(n);
      if (e.saved)
        for (auto* n : e.saved->inputs)
          if (n->graph_freed && n->requires_grad) fail_freed(n);
      e.backward(e);
      if (observer_) observer_->entry_done(e.owner);
      // Consumed (every user of this value came later on the tape): its gradient goes. So does its graph, whose
      // inputs free_walked releases once the walk is over (releasing now could destroy a value the walk has yet to
      // reach), unless retain_graph keeps the entry for a later backward, which starts again from no gradients on
      // the values in between. The inputs checked above all come from earlier entries, so none is marked freed
      // before it is read.
      if (!e.out->is_leaf) free_grad(e.out);
      if (retain_graph) continue;
      variable_node<T>* out = std::exchange(e.out, nullptr);
      out->creator = -1;
      out->graph_freed = true;
    }
    readiness.passed(-1);
  }

  // Drops every entry; their outputs become values whose graph is gone.
  void clear() {
    for (auto& e : entries_)
      if (e.out) {
        e.out->creator = -1;
        e.out->graph_freed = true;
      }
    // Releasing may destroy nodes, which no longer point at the tape, so the vector is stable during this loop.
    for (auto& e : entries_) {
      for (auto*& n : e.in) release(std::exchange(n, nullptr));
      delete std::exchange(e.saved, nullptr);
    }
    entries_.clear();
  }

  std::size_t size() const { return entries_.size(); }
  // Whether the backward under way keeps the graph for another one: an op whose backward would consume what its
  // forward saved must then work on a copy.
  bool retaining_graph() const { return retaining_graph_; }
  // Profiling (dynamic/step_profile.hpp): the owner that entries recorded from now on carry, and who is told as each
  // entry's backward finishes (nullptr: nobody).
  void set_owner(int owner) { owner_ = owner; }
  void set_observer(backward_observer* observer) { observer_ = observer; }
  // The gradient of a one-element value n (a loss, a sum) as its backward reads it: when n is the root of the
  // backward() under way, the seed 1 without reading it (on a GPU, a copy to the host and a wait).
  T scalar_gradient(const variable_node<T>* n) const {
    return n == seeded_root_ ? T(1) : read_value(static_cast<const T*>(n->grad));
  }

 private:
  // An entry that refers to nothing any more: its output died or backward freed it, and its inputs are released.
  static bool holds_nothing(const tape_entry<T>& e) {
    return !e.out && !e.in[0] && !e.in[1] && !e.in[2] && !e.in[3] && !e.saved;
  }
  void pop_dead_entries() {
    while (!entries_.empty() && holds_nothing(entries_.back())) entries_.pop_back();
  }

  // After backward's walk over entries [0, top]: releases the inputs of the entries it freed, and drops the gradients
  // that an aborted walk (an error) left on values it had yet to reach. Releasing can destroy values and so forget()
  // entries further down, which pops the end of the tape: hence the index check, and the entries still holding
  // inputs count as alive there until their turn comes.
  void free_walked(int top) {
    for (int i = top; i >= 0; --i) {
      if (static_cast<std::size_t>(i) >= entries_.size()) continue;
      auto& e = entries_[static_cast<std::size_t>(i)];
      if (e.out) {
        if (e.out->grad && !e.out->is_leaf) free_grad(e.out);
        continue;
      }
      variable_node<T>* inputs[4] = {e.in[0], e.in[1], e.in[2], e.in[3]};
      saved_state<T>* saved = std::exchange(e.saved, nullptr);
      e.in[0] = e.in[1] = e.in[2] = e.in[3] = nullptr;
      for (auto* n : inputs) release(n);
      delete saved;
    }
    pop_dead_entries();
  }

  // Squeezes out dead entries that are not at the end (an older graph is still alive above them) when the vector is
  // full, so that a graph kept alive across training steps does not make the tape grow by a step's worth each step.
  // Growing the capacity when few are dead keeps the scans amortised O(1) per record.
  void compact() {
    std::size_t kept = 0;
    for (auto& e : entries_) {
      if (holds_nothing(e)) continue;
      if (e.out) e.out->creator = static_cast<int>(kept);
      entries_[kept++] = e;
    }
    entries_.resize(kept);
    if (kept * 2 > entries_.capacity()) entries_.reserve(entries_.capacity() * 2);
  }

  // For a backward with a listener: the lowest entry (the last the walk reaches) that takes each watched leaf as an
  // input, and the leaves in the order the walk finishes them. passed(i) tells the listener of the leaves no entry
  // below i reads, once the walk has done every entry from i up.
  class leaf_readiness {
   public:
    leaf_readiness(const std::vector<tape_entry<T>>& entries, int top, gradient_ready_listener<T>* listener)
        : listener_(listener) {
      if (!listener) return;
      const auto leaves = listener->watched_leaves();
      last_use_.assign(leaves.size(), -1);
      for (int i = top; i >= 0; --i) {
        const auto& e = entries[static_cast<std::size_t>(i)];
        auto note = [&](const variable_node<T>* n) {
          if (!n || !n->is_leaf) return;
          for (std::size_t k = 0; k < leaves.size(); ++k)
            if (leaves[k] == n) last_use_[k] = i;
        };
        for (const auto* n : e.in) note(n);
        if (e.saved)
          for (const auto* n : e.saved->inputs) note(n);
      }
      order_.resize(leaves.size());
      for (std::size_t k = 0; k < order_.size(); ++k) order_[k] = k;
      std::sort(order_.begin(), order_.end(), [&](std::size_t a, std::size_t b) {
        return last_use_[a] != last_use_[b] ? last_use_[a] > last_use_[b] : a < b;
      });
    }
    void passed(int i) {
      while (listener_ && next_ < order_.size() && last_use_[order_[next_]] >= i)
        listener_->gradient_ready(order_[next_++]);
    }

   private:
    gradient_ready_listener<T>* listener_;
    std::vector<int> last_use_;
    std::vector<std::size_t> order_;
    std::size_t next_ = 0;
  };

  [[noreturn]] static void fail_freed(const variable_node<T>* n) {
    fail("Variable::backward: this loss depends on a value of shape ", n->shape,
         " whose graph was freed by an earlier backward() (or clear_tape()), so no gradient can flow back through it; "
         "compute the value again for this loss, or detach() it where it should act as a constant");
  }

  std::vector<tape_entry<T>> entries_;
  variable_node<T>* seeded_root_ = nullptr;
  bool retaining_graph_ = false;
  int owner_ = -1;
  backward_observer* observer_ = nullptr;
};

template <class T>
void forget_creator(variable_node<T>* n) {
  int index = n->creator;
  n->creator = -1;
  if (!tape<T>::destroyed()) tape<T>::instance().forget(index);
}

// Where an op's backward puts one input's gradient: data is null when the input needs none; accumulate says whether
// to add to what is there (a gradient already arrived from another use, or a leaf's .grad) or to write it fresh.
template <class T>
struct grad_target {
  T* data = nullptr;
  bool accumulate = false;
};
template <class T>
KILN_ALWAYS_INLINE grad_target<T> grad_target_for(variable_node<T>* n) {
  if (!n || !n->requires_grad) return {};
  if (n->grad) {
    if (!n->grad_pending_zero) return {n->grad, true};
    n->grad_pending_zero = false;  // cleared by zero_grad: this gradient is written, not added
    return {n->grad, false};
  }
  return {allocate_grad(n, false), false};
}
// The same, for kernels that can only add (the weight gradient of dense_backward): a fresh buffer is zero-filled.
template <class T>
KILN_ALWAYS_INLINE T* zeroed_grad_for(variable_node<T>* n) {
  if (!n || !n->requires_grad) return nullptr;
  if (n->grad) {
    materialize_grad(n);
    return n->grad;
  }
  return allocate_grad(n, true);
}

// Runs compute(destination) for a gradient target: straight into the gradient when it is fresh, else into scratch
// that is then added with Policy::accumulate. Kernels with an accumulate flag of their own do not need this.
template <class Policy, class T, class Compute>
void write_or_add(const grad_target<T>& target, index_t count, Compute&& compute) {
  if (!target.data) return;
  if (!target.accumulate) {
    compute(target.data);
  } else {
    scratch_buffer<T> scratch(count);
    compute(scratch.data());
    Policy::accumulate(scratch.data(), target.data, count);
  }
}

}  // namespace kiln::nn::detail
