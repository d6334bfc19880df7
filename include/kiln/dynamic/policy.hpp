// The backend policy that dynamic mode's ops call. One alias, so that every op and module reaches the kernels the
// same way the static mode does (static Sequential<kiln::policy::cpu, ...> calls the same functions).
#pragma once

#include "kiln/policy.hpp"

#ifndef KILN_DYNAMIC_POLICY
#define KILN_DYNAMIC_POLICY ::kiln::policy::cpu
// The compiled mode holds the dynamic mode for this policy only (dynamic/compiled_modules.hpp).
#define KILN_DYNAMIC_POLICY_IS_DEFAULT 1
#endif

namespace kiln::nn {

// The policy behind every dynamic-mode op; define KILN_DYNAMIC_POLICY before including kiln to pick another. For the
// GPU, ::kiln::policy::cuda with kiln/policy_cuda.cuh included first, in a .cu file: values and gradients then live
// in device memory (node.hpp), and the choice holds for the whole program (one definition of each op).
using dynamic_policy = KILN_DYNAMIC_POLICY;

}  // namespace kiln::nn
