// What every layer's forward and backward receive besides tensors: the batch size, the training flag, and the few
// facts of the pass some layers need.
#pragma once

#include "kiln/core/config.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/replicas.hpp"

namespace kiln {

// Per-call facts shared by all layers of one forward/backward pass.
struct layer_context {
  index_t batch = 0;
  bool training = true;
  random_generator* rng = nullptr;  // the layer's own generator, for layers that draw at run time (dropout)
  // In a backward: each layer's input is unchanged since its forward (static mode's Sequential, which owns the
  // buffers and runs the backward right after the forward), so what a forward derived from its input may serve again.
  bool input_as_in_forward = false;
  // Static mode: static_options::fuse_epilogues for the pass, as forward's `fuse` says it. A block's backward reads it
  // to lay out its layers as its forward, whose choices it depended on, did.
  bool fuse_epilogues = true;
  // Data-parallel training: the sums over the model's replicas (distributed::static_data_parallel lends them to the
  // model it wraps), for layers whose training computes across the replicas (SyncBatchNorm); null for a model alone.
  replica_reducer* replicas = nullptr;
};

// The interface of a static layer type L, bound to its input shape as L::bind<In> (see layers/dense.hpp):
//   output                      dims<...> of one output sample
//   param_count                 trainable elements in the flat parameter buffer (weights first, PyTorch's order)
//   buffer_count (optional)     non-trainable state (running statistics) in the flat buffer of buffers
//   scratch_per_sample          per-sample memory kept from forward to backward (pre-activations, masks, statistics)
//   aliases_input               the output is the input buffer under another shape (Flatten): no copy, no memory
//   draws_at_run_time (optional) true for layers that draw random numbers in training (dropout): the Sequential gives
//                               each such layer a generator of its own, the k-th on stream runtime_stream_base + k
//   init(params, rng), init_buffers(buffers) (optional)
//   forward<Policy>(params, buffers, x, y, scratch, ctx, fuse)
//   backward<Policy>(params, x, y, dy, dx or null, dparams, scratch, ctx)   dy may be overwritten
//   parameter_tensors(), buffer_tensors() (optional)   names, shapes and offsets for state_dict
//   description()                                        the summary's name for the layer

}  // namespace kiln
