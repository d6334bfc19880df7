// The optimizers' share of the compiled mode (core/compiled_kernels.hpp): the optimizer classes on the CPU policy and
// gradient clipping, for float and double, which both modes use. A program that links kiln::kernels takes them from
// the library (src/kernels/optimizers.cpp); members defined in a class stay available for inlining.
#pragma once

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/optim/adagrad.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/optim/clip.hpp"
#include "kiln/optim/rmsprop.hpp"
#include "kiln/optim/sgd.hpp"
#include "kiln/policy.hpp"

#define KILN_OPTIMIZER_CLASSES(X, T)                        \
  X(kiln::optim::optimizer_base, T, kiln::policy::cpu)      \
  X(kiln::optim::basic_sgd, T, kiln::policy::cpu)           \
  X(kiln::optim::basic_adam, T, kiln::policy::cpu, false)   \
  X(kiln::optim::basic_adam, T, kiln::policy::cpu, true)    \
  X(kiln::optim::basic_rmsprop, T, kiln::policy::cpu)       \
  X(kiln::optim::basic_adagrad, T, kiln::policy::cpu)

#define KILN_OPTIMIZER_FUNCTIONS(X, T)                      \
  X(kiln::optim::clip_detail::power_sum, T)                 \
  X(kiln::optim::clip_detail::norm, kiln::policy::cpu, T)   \
  X(kiln::optim::grad_norm, kiln::policy::cpu, T)

#if defined(KILN_COMPILED_KERNELS)
KILN_OPTIMIZER_CLASSES(KILN_EXTERN_CLASS, float)
KILN_OPTIMIZER_CLASSES(KILN_EXTERN_CLASS, double)
KILN_OPTIMIZER_FUNCTIONS(KILN_EXTERN_KERNEL, float)
KILN_OPTIMIZER_FUNCTIONS(KILN_EXTERN_KERNEL, double)
#endif
