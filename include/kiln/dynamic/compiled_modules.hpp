// The dynamic mode's share of the compiled mode (core/compiled_kernels.hpp): the module classes, the autograd tape
// and the functional ops with their backward entries, for float and double on the default dynamic policy. They depend
// on the element type only, so a program that links kiln::kernels takes them from the library instead of compiling
// them in each translation unit; src/kernels/dynamic_*.cpp instantiate these lists.
//
// Entries of KILN_DYNAMIC_FUNCTIONS follow the kernel contract of core/compiled_kernels.hpp (one specialisation named,
// not inline). Entries of KILN_DYNAMIC_CLASSES are class templates: an explicit instantiation declaration of a class
// keeps every member out of the program except what the optimiser inlines, and members defined in the class stay
// available for inlining, so small accessors cost nothing. Small helpers the ops call many times (node_of,
// make_output, retain, release) are left out of the lists for the same reason.
//
// Only for the default policy: a program that sets KILN_DYNAMIC_POLICY compiles its dynamic mode itself.
#pragma once

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/layers/compiled_recurrent.hpp"
#include "kiln/optim/compiled_optimizers.hpp"

#define KILN_DYNAMIC_CLASSES(X, T)                      \
  X(kiln::nn::detail::tape, T)                          \
  X(kiln::nn::basic_variable, T)                        \
  X(kiln::nn::basic_module, T)                          \
  X(kiln::nn::basic_sequential, T)                      \
  X(kiln::nn::basic_linear, T)                          \
  X(kiln::nn::basic_relu, T)                            \
  X(kiln::nn::basic_leaky_relu, T)                      \
  X(kiln::nn::basic_gelu, T)                            \
  X(kiln::nn::basic_sigmoid, T)                         \
  X(kiln::nn::basic_tanh, T)                            \
  X(kiln::nn::basic_identity, T)                        \
  X(kiln::nn::basic_flatten, T)                         \
  X(kiln::nn::basic_unflatten, T)                       \
  X(kiln::nn::basic_embedding, T)                       \
  X(kiln::nn::basic_softmax_module, T, false)           \
  X(kiln::nn::basic_softmax_module, T, true)            \
  X(kiln::nn::basic_conv2d, T)                          \
  X(kiln::nn::basic_max_pool2d, T)                      \
  X(kiln::nn::basic_avg_pool2d, T)                      \
  X(kiln::nn::basic_adaptive_avg_pool2d, T)             \
  X(kiln::nn::basic_global_avg_pool2d, T)               \
  X(kiln::nn::basic_batch_norm, T)                      \
  X(kiln::nn::basic_batch_norm1d, T)                    \
  X(kiln::nn::basic_batch_norm2d, T)                    \
  X(kiln::nn::basic_layer_norm, T)                      \
  X(kiln::nn::basic_dropout, T)                         \
  X(kiln::nn::basic_recurrent, kiln::lstm_cell, T)      \
  X(kiln::nn::basic_recurrent, kiln::gru_cell, T)       \
  X(kiln::nn::basic_lstm, T)                            \
  X(kiln::nn::basic_gru, T)                             \
  X(kiln::nn::basic_multihead_attention, T)             \
  X(kiln::nn::basic_transformer_encoder_layer, T)       \
  X(kiln::nn::basic_causal_transformer_layer, T)        \
  X(kiln::nn::basic_transformer_encoder, T)             \
  X(kiln::nn::basic_sinusoidal_positional_encoding, T)  \
  X(kiln::nn::basic_learned_positional_embedding, T)

#define KILN_DYNAMIC_FUNCTIONS(X, T)                             \
  X(kiln::nn::detail::destroy_node, T)                           \
  X(kiln::nn::detail::activation_backward_entry, T)              \
  X(kiln::nn::detail::add_sub_backward, T)                       \
  X(kiln::nn::detail::mul_backward, T)                           \
  X(kiln::nn::detail::scale_backward, T)                         \
  X(kiln::nn::detail::conv2d_backward_entry, T)                  \
  X(kiln::nn::detail::pool_backward_entry, T)                    \
  X(kiln::nn::detail::linear_backward, T)                        \
  X(kiln::nn::detail::matmul_backward, T)                        \
  X(kiln::nn::detail::saved_gradient_backward, T)                \
  X(kiln::nn::detail::unreduced_loss_backward, T)                \
  X(kiln::nn::detail::batch_norm_backward_entry, T)              \
  X(kiln::nn::detail::layer_norm_backward_entry, T)              \
  X(kiln::nn::detail::dropout_backward_entry, T)                 \
  X(kiln::nn::detail::rnn_select_backward, T)                    \
  X(kiln::nn::detail::rnn_backward_entry, kiln::lstm_cell, T)    \
  X(kiln::nn::detail::rnn_backward_entry, kiln::gru_cell, T)     \
  X(kiln::nn::detail::stack_states_backward, T)                  \
  X(kiln::nn::detail::spread_backward, T)                        \
  X(kiln::nn::detail::reshape_backward, T)                       \
  X(kiln::nn::detail::softmax_backward_entry, T)                 \
  X(kiln::nn::detail::unary_backward_entry, T)                   \
  X(kiln::nn::detail::binary_backward_entry, T)                  \
  X(kiln::nn::detail::where_backward_entry, T)                   \
  X(kiln::nn::detail::reduce_dims_backward, T)                   \
  X(kiln::nn::detail::permute_backward, T)                       \
  X(kiln::nn::detail::expand_backward, T)                        \
  X(kiln::nn::detail::slice_backward, T)                         \
  X(kiln::nn::detail::cat_backward, T)                           \
  X(kiln::nn::detail::index_select_backward, T)                  \
  X(kiln::nn::detail::gather_backward, T)                        \
  X(kiln::nn::detail::scatter_add_backward, T)                   \
  X(kiln::nn::detail::unary, T)                                  \
  X(kiln::nn::detail::binary, T)                                 \
  X(kiln::nn::detail::reduce_dims, T)                            \
  X(kiln::nn::detail::matmul_batched, T)                         \
  X(kiln::nn::permute, T)                                        \
  X(kiln::nn::expand, T)                                         \
  X(kiln::nn::slice, T)                                          \
  X(kiln::nn::relu, T)                                           \
  X(kiln::nn::leaky_relu, T)                                     \
  X(kiln::nn::gelu, T)                                           \
  X(kiln::nn::sigmoid, T)                                        \
  X(kiln::nn::tanh, T)                                           \
  X(kiln::nn::detail::add_sub, T)                                \
  X(kiln::nn::detail::mul_op, T)                                 \
  X(kiln::nn::conv2d, T)                                         \
  X(kiln::nn::max_pool2d, T)                                     \
  X(kiln::nn::avg_pool2d, T)                                     \
  X(kiln::nn::global_avg_pool2d, T)                              \
  X(kiln::nn::adaptive_avg_pool2d, T)                            \
  X(kiln::nn::linear, T)                                         \
  X(kiln::nn::matmul, T)                                         \
  X(kiln::nn::mse_loss, T)                                       \
  X(kiln::nn::l1_loss, T)                                        \
  X(kiln::nn::smooth_l1_loss, T)                                 \
  X(kiln::nn::huber_loss, T)                                     \
  X(kiln::nn::binary_cross_entropy_with_logits, T)               \
  X(kiln::nn::batch_norm, T)                                     \
  X(kiln::nn::layer_norm, T)                                     \
  X(kiln::nn::dropout, T)                                        \
  X(kiln::nn::rnn_op, kiln::lstm_cell, T)                        \
  X(kiln::nn::rnn_op, kiln::gru_cell, T)                         \
  X(kiln::nn::rnn_select, T)                                     \
  X(kiln::nn::stack_states, T)                                   \
  X(kiln::nn::detail::reduce_all, T)                             \
  X(kiln::nn::reshape, T)                                        \
  X(kiln::nn::flatten, T)                                        \
  X(kiln::nn::softmax, T)                                        \
  X(kiln::nn::log_softmax, T)                                    \
  X(kiln::nn::clip_grad_norm, T)                                 \
  X(kiln::nn::clip_grad_value, T)                                \
  X(kiln::nn::detail::attention_backward_entry, T)               \
  X(kiln::nn::scaled_dot_product_attention, T)                   \
  X(kiln::nn::generate_square_subsequent_mask, T)

// Member templates, which the class entries leave out: (result, member, template argument, parenthesised parameters).
#define KILN_DYNAMIC_MEMBER_TEMPLATES(X, T)                                                                \
  X(void, kiln::nn::basic_module<T>::load_state_dict, kiln::nn::basic_module<T>::state_dict_type,          \
    (const kiln::nn::basic_module<T>::state_dict_type&, bool))

#if defined(KILN_COMPILED_KERNELS) && defined(KILN_DYNAMIC_POLICY_IS_DEFAULT)
KILN_DYNAMIC_CLASSES(KILN_EXTERN_CLASS, float)
KILN_DYNAMIC_CLASSES(KILN_EXTERN_CLASS, double)
KILN_DYNAMIC_FUNCTIONS(KILN_EXTERN_KERNEL, float)
KILN_DYNAMIC_FUNCTIONS(KILN_EXTERN_KERNEL, double)
KILN_DYNAMIC_MEMBER_TEMPLATES(KILN_EXTERN_OVERLOAD, float)
KILN_DYNAMIC_MEMBER_TEMPLATES(KILN_EXTERN_OVERLOAD, double)
#endif
