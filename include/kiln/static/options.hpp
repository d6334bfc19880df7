// static_options: the switches of a static model that the cost-of-dynamism ladder turns on one at a time.
#pragma once

namespace kiln {

// Run-time switches of a static Sequential. The defaults are the fastest; turning one off keeps every number the
// same (fusion: within float rounding, usually bit for bit) and measures what that feature buys.
struct static_options {
  // Apply Dense layers' activations inside the GEMM's epilogue, let a Conv2D apply the activation layer after it to
  // each sample's output while it is in cache, let a MaxPool2D run the backward of the activation layer before it on
  // each plane while it is in cache, and let a Dense layer over a Dense with a fused ReLU take that ReLU's backward
  // into the one pass of its own two backward products, instead of each as a pass of its own over memory.
  bool fuse_epilogues = true;
  // Hand the optimizer one slot for the whole flat parameter buffer instead of one per parameter tensor.
  bool flat_parameters = true;
};

}  // namespace kiln
