// variable_node: the shared state behind a dynamic-mode Variable handle (its value, gradient and autograd links),
// with an intrusive, non-atomic reference count. Handles are copied several times per op, so the count is a plain
// int: a graph and the handles into it belong to one thread, as the tape that records it does.
#pragma once

#include <cstring>
#include <new>

#include "kiln/core/shape.hpp"
#include "kiln/dynamic/allocator.hpp"
#include "kiln/dynamic/policy.hpp"

namespace kiln::nn::detail {

// ---- where values live ----------------------------------------------------------------------------------------------
// Values, gradients and scratch live where dynamic_policy computes: host blocks from the caching allocator above for
// the CPU policy, device memory from the policy's own caching allocator for a GPU policy (KILN_DYNAMIC_POLICY).
// Nodes themselves are always host memory. The helpers below are the only places dynamic mode touches a value from
// the host; on the CPU each is the plain memory operation it replaces.

template <class P = dynamic_policy>
storage_block allocate_tensor_storage(std::size_t bytes) {
  if constexpr (P::host_accessible) {
    return allocate_storage(bytes);
  } else {
    if (bytes == 0) return {};
    const auto block = P::allocate_bytes(bytes);
    return {block.data, block.bytes};
  }
}
template <class P = dynamic_policy>
void free_tensor_storage(storage_block block) {
  if constexpr (P::host_accessible) free_storage(block);
  else if (block.data) P::free_bytes(block.data, block.bytes);
}
// Sets n elements to zero.
template <class T, class P = dynamic_policy>
void zero_values(T* data, index_t n) {
  if (n <= 0) return;
  if constexpr (P::host_accessible) std::memset(data, 0, static_cast<std::size_t>(n) * sizeof(T));
  else P::fill(data, T(0), n);
}
// Copies n elements from host memory into a value.
template <class T, class P = dynamic_policy>
void copy_values_from_host(const T* host, T* data, index_t n) {
  if (n <= 0) return;
  if constexpr (P::host_accessible) std::memcpy(data, host, static_cast<std::size_t>(n) * sizeof(T));
  else P::upload(host, data, n);
}
// Copies n elements of a value into host memory (on a GPU: waits for the work queued before).
template <class T, class P = dynamic_policy>
void copy_values_to_host(const T* data, T* host, index_t n) {
  if (n <= 0) return;
  if constexpr (P::host_accessible) std::memcpy(host, data, static_cast<std::size_t>(n) * sizeof(T));
  else P::download(data, host, n);
}
// One element: a loss, or the seed of backward().
template <class T, class P = dynamic_policy>
T read_value(const T* data) {
  if constexpr (P::host_accessible) {
    return *data;
  } else {
    T value;
    P::download(data, &value, 1);
    return value;
  }
}
// (On a GPU a one-element fill: a kernel launch that neither waits nor needs a staging buffer.)
template <class T, class P = dynamic_policy>
void write_value(T* data, T value) {
  if constexpr (P::host_accessible) *data = value;
  else P::fill(data, value, 1);
}

template <class T>
struct variable_node {
  int refs = 1;
  int creator = -1;            // index of the tape entry that produced this value, -1 for none (or no longer)
  bool requires_grad = false;  // for a parameter also its trainable flag, which the optimizer reads
  bool is_leaf = true;         // made by the user or a module rather than by an op
  bool graph_freed = false;    // an op made it, and backward() or clear_tape() has freed the graph behind it
  kiln::shape shape;
  T* value = nullptr;
  T* grad = nullptr;                       // null until a gradient reaches it (or, for parameters, registration)
  // zero_grad cleared the gradient without writing it: it reads as zeros, and the first kernel to produce it writes
  // instead of adding (materialize_grad fills the zeros for whoever reads it first).
  bool grad_pending_zero = false;
  storage_block value_block, grad_block;  // what value and grad were allocated as (value_block empty when aliasing)
  variable_node* storage_owner = nullptr;  // holds a reference when value lives in another node's storage
  storage_block self_block;                // the node's own memory, from the same cache as tensor storage
  variable_node* next_to_destroy = nullptr;  // links the nodes that destroy_node has yet to destroy
};

// Called when a node that an op produced dies: the tape drops its entry (defined in tape.hpp).
template <class T>
void forget_creator(variable_node<T>* n);

template <class T>
KILN_ALWAYS_INLINE void retain(variable_node<T>* n) {
  if (n) ++n->refs;
}

// Destroying a node releases what it holds (its creator's inputs, the node whose storage it shares), which can
// destroy more nodes in turn: a chain as long as the ops recorded in a loop (acc = acc + x, 100000 times). Nodes that
// die while another is being destroyed wait on a list that the outermost call works through, so the stack stays flat.
template <class T>
struct destruction_queue {
  variable_node<T>* head = nullptr;
  bool running = false;
};
template <class T>
destruction_queue<T>& pending_destruction() {
  static thread_local destruction_queue<T> queue;
  return queue;
}

template <class T>
void destroy_node(variable_node<T>* n) {
  auto& queue = pending_destruction<T>();
  if (queue.running) {
    n->next_to_destroy = queue.head;
    queue.head = n;
    return;
  }
  queue.running = true;
  while (n) {
    if (n->creator >= 0) forget_creator(n);
    free_tensor_storage(n->grad_block);
    free_tensor_storage(n->value_block);
    variable_node<T>* owner = n->storage_owner;
    storage_block self = n->self_block;
    n->~variable_node();
    free_storage(self);
    if (owner && --owner->refs == 0) destroy_node(owner);
    n = queue.head;
    if (n) queue.head = n->next_to_destroy;
  }
  queue.running = false;
}

template <class T>
KILN_ALWAYS_INLINE void release(variable_node<T>* n) {
  if (n && --n->refs == 0) destroy_node(n);
}

// A node of the given shape with uninitialised value storage (or none, when the caller aliases another's).
template <class T>
variable_node<T>* make_node(const kiln::shape& s, bool requires_grad, bool is_leaf, bool allocate_value = true) {
  storage_block self = allocate_storage(sizeof(variable_node<T>));
  auto* n = new (self.data) variable_node<T>;
  n->self_block = self;
  n->shape = s;
  n->requires_grad = requires_grad;
  n->is_leaf = is_leaf;
  if (allocate_value) {
    n->value_block = allocate_tensor_storage(static_cast<std::size_t>(s.numel()) * sizeof(T));
    n->value = static_cast<T*>(n->value_block.data);
  }
  return n;
}

// Allocates the node's gradient buffer, uninitialised (the caller writes every element) or zero-filled.
template <class T>
T* allocate_grad(variable_node<T>* n, bool zero) {
  std::size_t bytes = static_cast<std::size_t>(n->shape.numel()) * sizeof(T);
  n->grad_block = allocate_tensor_storage(bytes);
  n->grad = static_cast<T*>(n->grad_block.data);
  if (zero) zero_values(n->grad, n->shape.numel());
  return n->grad;
}
// Writes the zeros that a lazy zero_grad left pending, so that the gradient can be read or added to.
template <class T>
void materialize_grad(variable_node<T>* n) {
  if (!n->grad_pending_zero) return;
  n->grad_pending_zero = false;
  zero_values(n->grad, n->shape.numel());
}
// Whether zero_grad may leave this node's gradient pending rather than fill it: a leaf whose gradient is its own
// (not a view into another node's, as a recurrent module's parameters are into its flat array, whose kernels
// accumulate into the whole).
template <class T>
bool lazy_zero_grad(const variable_node<T>* n) {
  return n->is_leaf && !n->storage_owner;
}
template <class T>
void free_grad(variable_node<T>* n) {
  free_tensor_storage(n->grad_block);
  n->grad_block = {};
  n->grad = nullptr;
  n->grad_pending_zero = false;
}

// Scratch memory for one backward computation, returned to the cache when it goes out of scope.
template <class T>
class scratch_buffer {
 public:
  explicit scratch_buffer(index_t count)
      : block_(allocate_tensor_storage(static_cast<std::size_t>(count) * sizeof(T))) {}
  scratch_buffer(const scratch_buffer&) = delete;
  scratch_buffer& operator=(const scratch_buffer&) = delete;
  ~scratch_buffer() { free_tensor_storage(block_); }
  T* data() const { return static_cast<T*>(block_.data); }

 private:
  storage_block block_;
};

}  // namespace kiln::nn::detail
