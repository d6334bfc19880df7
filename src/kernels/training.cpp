// kiln_kernels: the data loaders over data held in memory (include/kiln/data/compiled_loaders.hpp) and the training
// loop's fit and evaluate over them (include/kiln/train/compiled_training.hpp).
#include "kiln/data/compiled_loaders.hpp"
#include "kiln/train/compiled_training.hpp"

KILN_DATA_LOADER_CLASSES(KILN_INSTANTIATE_CLASS)
KILN_TRAINING_LOOP_FUNCTIONS(KILN_INSTANTIATE_OVERLOAD, std::int64_t)
KILN_TRAINING_LOOP_FUNCTIONS(KILN_INSTANTIATE_OVERLOAD, float)
