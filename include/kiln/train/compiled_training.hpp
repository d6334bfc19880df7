// The training loop's share of the compiled mode (core/compiled_kernels.hpp): train::training_loop's fit and evaluate
// over data held in memory, with integer class labels or real-valued targets, which every kiln::Model of either mode
// runs whatever its model. A program that links kiln::kernels takes them from the library
// (src/kernels/training.cpp); fit over any other data::dataset is compiled in the program, as in header-only mode.
#pragma once

#include <cstdint>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/data/labelled_data.hpp"
#include "kiln/train/training_loop.hpp"

// Entries: (result, member function, template argument, parenthesised parameter types), for target type T.
#define KILN_TRAINING_LOOP_FUNCTIONS(X, T)                                                                      \
  X(kiln::train::history, kiln::train::training_loop::fit, T,                                                   \
    (kiln::labelled_data<T>, kiln::fit_options<T>))                                                             \
  X(kiln::train::history, kiln::train::training_loop::fit_loader, kiln::labelled_data<T>,                       \
    (const kiln::labelled_data<T>&, const kiln::fit_options<T>&))                                               \
  X(kiln::evaluation, kiln::train::training_loop::evaluate, T, (kiln::labelled_data<T>, kiln::index_t))         \
  X(void, kiln::train::training_loop::check_data, T, (const kiln::labelled_data<T>&, const char*) const)

#if defined(KILN_COMPILED_KERNELS)
KILN_TRAINING_LOOP_FUNCTIONS(KILN_EXTERN_OVERLOAD, std::int64_t)
KILN_TRAINING_LOOP_FUNCTIONS(KILN_EXTERN_OVERLOAD, float)
#endif
