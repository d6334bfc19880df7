// Dynamic mode's tensor ops on the GPU: the op table of tests/op_table.hpp (every op, every sample of
// tests/fixtures/ops/) with dynamic mode built on policy::cuda, so every value, gradient and kernel is on the device.
// Outputs and input gradients against PyTorch's, at ten times the CPU's tolerance: cuBLAS and the atomic additions of
// a broadcast operand's gradient sum in other orders than the CPU kernels.
#define KILN_DYNAMIC_POLICY ::kiln::policy::cuda
#include "kiln/policy_cuda.cuh"
// policy_cuda.cuh first: the dynamic headers name the policy.

#include <doctest/doctest.h>

#include "../op_table.hpp"

static_assert(std::is_same_v<nn::dynamic_policy, kiln::policy::cuda>, "this test builds dynamic mode on policy::cuda");

TEST_CASE("op table on the GPU: float outputs and gradients match PyTorch") {
  for_each_sample([](const op_entry& e, const fixture& fx, const std::string& name, const std::string& where) {
    check_float_sample(e, fx, name, where, 10);
  });
}
