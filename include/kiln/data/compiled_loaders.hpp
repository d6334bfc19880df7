// The data loader's share of the compiled mode (core/compiled_kernels.hpp): data_loader over the data sets held in
// memory that Model::fit and the examples use, float features with integer labels or real targets. A program that
// links kiln::kernels takes them from the library (src/kernels/training.cpp); a loader over any other data set is
// compiled in the program, as in header-only mode.
#pragma once

#include <cstdint>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/data/data_loader.hpp"
#include "kiln/data/dataset.hpp"
#include "kiln/data/labelled_data.hpp"

#define KILN_DATA_LOADER_CLASSES(X)                                      \
  X(kiln::data::data_loader, kiln::data::tensor_dataset<float, std::int64_t>) \
  X(kiln::data::data_loader, kiln::data::tensor_dataset<float, float>)        \
  X(kiln::data::data_loader, kiln::labelled_data<std::int64_t>)               \
  X(kiln::data::data_loader, kiln::labelled_data<float>)

#if defined(KILN_COMPILED_KERNELS)
KILN_DATA_LOADER_CLASSES(KILN_EXTERN_CLASS)
#endif
