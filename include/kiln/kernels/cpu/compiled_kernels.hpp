// The CPU kernels that the compiled mode (core/compiled_kernels.hpp) keeps in the library kiln_kernels: the entries
// that layers, both modes, losses and optimizers reach through a CPU policy, for float and double. Each list is an
// X-macro of (function, template arguments...); what an entry calls (micro-kernels, AMX tiles, packing) comes along
// in the library and is not listed. src/kernels/*.cpp instantiate the lists, one file per group so the library builds
// in parallel; a program that defines KILN_COMPILED_KERNELS sees them as extern templates.
//
// An entry added here must satisfy the contract in core/compiled_kernels.hpp: in particular a member defined in its
// class is marked KILN_KERNEL.
#pragma once

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/policy.hpp"

// The GEMM's entries: every product of every layer, on every route (direct, narrow, blocked, AMX, bfloat16).
#define KILN_CPU_GEMM_KERNELS(X, T)                     \
  X(kiln::kernels::cpu::gemm, T)                        \
  X(kiln::kernels::cpu::gemm_prepacked_b, T)            \
  X(kiln::kernels::cpu::pack_gemm_b, T)                 \
  X(kiln::kernels::cpu::packed_gemm_b_scratch, T)       \
  X(kiln::kernels::cpu::gemm_part, T)

// Element-wise kernels, reductions, softmax, losses and optimizer updates.
#define KILN_CPU_ELEMENTWISE_KERNELS(X, T)                                       \
  X(kiln::kernels::cpu::elementwise_kernels::activation_forward, T)              \
  X(kiln::kernels::cpu::elementwise_kernels::activation_backward, T)             \
  X(kiln::kernels::cpu::elementwise_kernels::add_row_bias, T)                    \
  X(kiln::kernels::cpu::elementwise_kernels::add, T)                             \
  X(kiln::kernels::cpu::elementwise_kernels::subtract, T)                        \
  X(kiln::kernels::cpu::elementwise_kernels::multiply, T)                        \
  X(kiln::kernels::cpu::elementwise_kernels::scale, T)                           \
  X(kiln::kernels::cpu::elementwise_kernels::scale_rows, T)                      \
  X(kiln::kernels::cpu::elementwise_kernels::axpy, T)                            \
  X(kiln::kernels::cpu::elementwise_kernels::accumulate, T)                      \
  X(kiln::kernels::cpu::elementwise_kernels::copy, T)                            \
  X(kiln::kernels::cpu::elementwise_kernels::copy_rows, T)                       \
  X(kiln::kernels::cpu::elementwise_kernels::fill_rows, T)                       \
  X(kiln::kernels::cpu::elementwise_kernels::accumulate_rows, T)                 \
  X(kiln::kernels::cpu::elementwise_kernels::fill, T)                            \
  X(kiln::kernels::cpu::reduce_kernels::sum_rows, T)                             \
  X(kiln::kernels::cpu::reduce_kernels::sum_rows_part, T)                        \
  X(kiln::kernels::cpu::reduce_kernels::sum, T)                                  \
  X(kiln::kernels::cpu::reduce_kernels::sum_abs, T)                              \
  X(kiln::kernels::cpu::reduce_kernels::sum_squares, T)                          \
  X(kiln::kernels::cpu::softmax_kernels::softmax_forward, T)                     \
  X(kiln::kernels::cpu::softmax_kernels::softmax_backward, T)                    \
  X(kiln::kernels::cpu::loss_kernels::mse, T)                                    \
  X(kiln::kernels::cpu::loss_kernels::nll, T)                                    \
  X(kiln::kernels::cpu::loss_kernels::l1_loss, T)                                \
  X(kiln::kernels::cpu::loss_kernels::bce_with_logits, T)                        \
  X(kiln::kernels::cpu::loss_kernels::mse_elements, T)                           \
  X(kiln::kernels::cpu::loss_kernels::l1_loss_elements, T)                       \
  X(kiln::kernels::cpu::loss_kernels::bce_with_logits_elements, T)               \
  X(kiln::kernels::cpu::loss_kernels::nll_rows, T)                               \
  X(kiln::kernels::cpu::loss_kernels::class_loss_scale, T)                       \
  X(kiln::kernels::cpu::optim_kernels::sgd_update, T)                            \
  X(kiln::kernels::cpu::optim_kernels::adam_update, T)                           \
  X(kiln::kernels::cpu::optim_kernels::rmsprop_update, T)                        \
  X(kiln::kernels::cpu::optim_kernels::adagrad_update, T)                        \
  X(kiln::kernels::cpu::optim_kernels::regularize_gradient, T)

// Softmax cross-entropy's two overloads (plain, and with class weights, ignored labels and label smoothing); entries
// of KILN_EXTERN_OVERLOAD.
#define KILN_CPU_OVERLOADED_KERNELS(X, T)                                                                        \
  X(T, kiln::kernels::cpu::loss_kernels::softmax_cross_entropy, T,                                               \
    (const T*, const std::int64_t*, kiln::index_t, kiln::index_t, kiln::reduction, T*, T))                       \
  X(T, kiln::kernels::cpu::loss_kernels::softmax_cross_entropy, T,                                               \
    (const T*, const std::int64_t*, kiln::index_t, kiln::index_t, kiln::reduction,                               \
     const kiln::kernels::class_loss_options<T>&, T*, T))

// A convolution's forward and backward on one policy's GEMM.
#define KILN_CPU_CONVOLUTIONS(X, Policy, T)                       \
  X(kiln::kernels::cpu::conv_kernels::conv2d_forward, Policy, T)  \
  X(kiln::kernels::cpu::conv_kernels::conv2d_backward, Policy, T)

// Convolution (on the CPU policies' own GEMM), pooling, normalisation and dropout.
#define KILN_CPU_CNN_KERNELS(X, T)                                                           \
  X(kiln::kernels::cpu::conv_kernels::im2col, T)                                             \
  X(kiln::kernels::cpu::conv_kernels::col2im, T)                                             \
  KILN_CPU_CONVOLUTIONS(X, kiln::policy::cpu, T)                                             \
  X(kiln::kernels::cpu::conv_kernels::add_channel_bias, T)                                   \
  X(kiln::kernels::cpu::conv_kernels::sum_channels, T)                                       \
  X(kiln::kernels::cpu::pooling_kernels::max_pool_forward, T)                                \
  X(kiln::kernels::cpu::pooling_kernels::max_pool_backward, T)                               \
  X(kiln::kernels::cpu::pooling_kernels::max_pool_activated_backward, T)                     \
  X(kiln::kernels::cpu::pooling_kernels::avg_pool_forward, T)                                \
  X(kiln::kernels::cpu::pooling_kernels::avg_pool_backward, T)                               \
  X(kiln::kernels::cpu::pooling_kernels::global_avg_pool_forward, T)                         \
  X(kiln::kernels::cpu::pooling_kernels::global_avg_pool_backward, T)                        \
  X(kiln::kernels::cpu::normalization_kernels::batch_norm_forward_train, T)                  \
  X(kiln::kernels::cpu::normalization_kernels::batch_norm_count_batch, T)                    \
  X(kiln::kernels::cpu::normalization_kernels::batch_norm_forward_eval, T)                   \
  X(kiln::kernels::cpu::normalization_kernels::batch_norm_backward, T)                       \
  X(kiln::kernels::cpu::normalization_kernels::batch_norm_channel_sums, T)                   \
  X(kiln::kernels::cpu::normalization_kernels::batch_norm_channel_squares, T)                \
  X(kiln::kernels::cpu::normalization_kernels::batch_norm_forward_from_sums, T)              \
  X(kiln::kernels::cpu::normalization_kernels::batch_norm_backward_sums, T)                  \
  X(kiln::kernels::cpu::normalization_kernels::batch_norm_backward_from_sums, T)             \
  X(kiln::kernels::cpu::normalization_kernels::layer_norm_forward, T)                        \
  X(kiln::kernels::cpu::normalization_kernels::layer_norm_backward, T)                       \
  X(kiln::kernels::cpu::dropout_kernels::dropout_forward, T)                                 \
  X(kiln::kernels::cpu::dropout_kernels::dropout_backward, T)

// The convolutions of the policies that fix a precision (float only: their precision is that of float products).
#define KILN_CPU_FIXED_PRECISION_CNN_KERNELS(X)                   \
  KILN_CPU_CONVOLUTIONS(X, kiln::policy::cpu_bf16, float)         \
  KILN_CPU_CONVOLUTIONS(X, kiln::policy::cpu_bf16x3, float)

// The recurrent cells and the sparse-input products.
#define KILN_CPU_RECURRENT_KERNELS(X, T)                                                     \
  X(kiln::kernels::cpu::recurrent_kernels::lstm_cell_forward, T)                             \
  X(kiln::kernels::cpu::recurrent_kernels::lstm_cell_backward, T)                            \
  X(kiln::kernels::cpu::recurrent_kernels::gru_cell_forward, T)                              \
  X(kiln::kernels::cpu::recurrent_kernels::gru_cell_backward, T)                             \
  X(kiln::kernels::cpu::recurrent_kernels::swap_leading, T)                                  \
  X(kiln::kernels::cpu::recurrent_kernels::recurrent_dropout_forward, T)
#define KILN_CPU_SPARSE_INPUT_KERNELS(X)                                                     \
  X(kiln::kernels::cpu::sparse_input_kernels::dense_forward_sparse_input, float)             \
  X(kiln::kernels::cpu::sparse_input_kernels::dense_weight_gradient_sparse_input, float)
// The one-pass head backward of static mode's fused epilogues (head_backward.hpp): every group size its outputs take
// with 16 or 8 lanes.
#define KILN_CPU_HEAD_BACKWARD_GROUP(X, Count)              \
  X(kiln::kernels::cpu::head_backward_outputs, Count, true) \
  X(kiln::kernels::cpu::head_backward_outputs, Count, false)
#define KILN_CPU_HEAD_BACKWARD_KERNELS(X)                                                                       \
  KILN_CPU_HEAD_BACKWARD_GROUP(X, 1) KILN_CPU_HEAD_BACKWARD_GROUP(X, 2) KILN_CPU_HEAD_BACKWARD_GROUP(X, 3) \
  KILN_CPU_HEAD_BACKWARD_GROUP(X, 4) KILN_CPU_HEAD_BACKWARD_GROUP(X, 5) KILN_CPU_HEAD_BACKWARD_GROUP(X, 6) \
  KILN_CPU_HEAD_BACKWARD_GROUP(X, 7) KILN_CPU_HEAD_BACKWARD_GROUP(X, 8) KILN_CPU_HEAD_BACKWARD_GROUP(X, 9) \
  KILN_CPU_HEAD_BACKWARD_GROUP(X, 10)

// Every list, with both element types where it takes one.
#define KILN_CPU_KERNELS(X)                                                                   \
  KILN_CPU_GEMM_KERNELS(X, float)                                                             \
  KILN_CPU_GEMM_KERNELS(X, double)                                                            \
  KILN_CPU_ELEMENTWISE_KERNELS(X, float)                                                      \
  KILN_CPU_ELEMENTWISE_KERNELS(X, double)                                                     \
  KILN_CPU_CNN_KERNELS(X, float)                                                              \
  KILN_CPU_CNN_KERNELS(X, double)                                                             \
  KILN_CPU_FIXED_PRECISION_CNN_KERNELS(X)                                                     \
  KILN_CPU_RECURRENT_KERNELS(X, float)                                                        \
  KILN_CPU_RECURRENT_KERNELS(X, double)                                                       \
  KILN_CPU_SPARSE_INPUT_KERNELS(X)                                                            \
  KILN_CPU_HEAD_BACKWARD_KERNELS(X)

#if defined(KILN_COMPILED_KERNELS)
KILN_CPU_KERNELS(KILN_EXTERN_KERNEL)
KILN_CPU_OVERLOADED_KERNELS(KILN_EXTERN_OVERLOAD, float)
KILN_CPU_OVERLOADED_KERNELS(KILN_EXTERN_OVERLOAD, double)
#endif
