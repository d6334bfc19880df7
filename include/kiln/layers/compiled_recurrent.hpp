// The recurrent layers' share of the compiled mode (core/compiled_kernels.hpp): the forward and backward through
// time of LSTM and GRU on the CPU policy, for float and double, which static mode's layers and dynamic mode's
// recurrent op both call. A program that links kiln::kernels takes them from the library (src/kernels/recurrent.cpp).
#pragma once

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/layers/gru.hpp"
#include "kiln/layers/lstm.hpp"
#include "kiln/layers/recurrent.hpp"
#include "kiln/policy.hpp"

#define KILN_RECURRENT_SEQUENCE_KERNELS(X, T)               \
  X(kiln::rnn_forward, kiln::lstm_cell, kiln::policy::cpu, T)  \
  X(kiln::rnn_backward, kiln::lstm_cell, kiln::policy::cpu, T) \
  X(kiln::rnn_forward, kiln::gru_cell, kiln::policy::cpu, T)   \
  X(kiln::rnn_backward, kiln::gru_cell, kiln::policy::cpu, T)

#if defined(KILN_COMPILED_KERNELS)
KILN_RECURRENT_SEQUENCE_KERNELS(KILN_EXTERN_KERNEL, float)
KILN_RECURRENT_SEQUENCE_KERNELS(KILN_EXTERN_KERNEL, double)
#endif
