// One parameter tensor of a fused training step (kernels/cpu/fused_mlp.hpp, kernels/cuda/fused_mlp.cuh): its values,
// gradient and Adam's two moments, each of the tensor's length, in the memory of the step's policy.
#pragma once

namespace kiln::kernels {

struct fused_parameter {
  float* value;
  float* grad;
  float* exp_avg;
  float* exp_avg_sq;
};

}  // namespace kiln::kernels
