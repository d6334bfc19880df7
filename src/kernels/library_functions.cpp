// kiln_kernels: the one definition of every KILN_LIBRARY_FUNCTION (include/kiln/core/compiled_kernels.hpp), the
// functions that are not templates: the data readers, the JSON parser, the safetensors format, atomic file writes, the CPU's thread
// balance and the fused kernels' steps. Their headers define them where KILN_LIBRARY_DEFINITIONS is defined.
#define KILN_LIBRARY_DEFINITIONS
#include "kiln/data/find_data.hpp"
#include "kiln/data/idx.hpp"
#include "kiln/data/mnist.hpp"
#include "kiln/io/atomic_file.hpp"
#include "kiln/io/json.hpp"
#include "kiln/io/regular_file.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/io/safetensors_format.hpp"
#include "kiln/kernels/cpu/fused_mlp.hpp"
#include "kiln/kernels/cpu/head_backward.hpp"
#include "kiln/kernels/cpu/thread_balance.hpp"
