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

#include <memory>
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
  void backward(variable_node<T>* root, bool retain_graph = false) {
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
    for (int i = root->creator; i >= 0; --i) {
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
