// kiln_kernels: the recurrent cells and the sparse-input products (include/kiln/kernels/cpu/compiled_kernels.hpp), and
// the LSTM and GRU sequences over them (include/kiln/layers/compiled_recurrent.hpp).
#include "kiln/kernels/cpu/compiled_kernels.hpp"
#include "kiln/layers/compiled_recurrent.hpp"

KILN_CPU_RECURRENT_KERNELS(KILN_INSTANTIATE_KERNEL, float)
KILN_CPU_RECURRENT_KERNELS(KILN_INSTANTIATE_KERNEL, double)
KILN_CPU_SPARSE_INPUT_KERNELS(KILN_INSTANTIATE_KERNEL)
KILN_RECURRENT_SEQUENCE_KERNELS(KILN_INSTANTIATE_KERNEL, float)
KILN_RECURRENT_SEQUENCE_KERNELS(KILN_INSTANTIATE_KERNEL, double)
