// kiln: the umbrella header of both modes. It includes
//   - static mode: kiln::Sequential, Input and every layer (Dense, Conv2D, pooling, BatchNorm, SyncBatchNorm,
//     LayerNorm, Dropout, Flatten, Softmax, LSTM, GRU, the activations), the options, and kiln::fused_mlp_trainer on
//     the CPU policies;
//   - dynamic mode: kiln/dynamic/nn.hpp, all of it (nn::Variable and autograd, the functional ops, nn::Module and the
//     nn modules);
//   - what both modes share: Tensor, the random generator and initialisers, threads, the CPU policies, the losses
//     (kiln::loss), the optimizers and learning-rate schedulers (kiln::optim).
// Not included, each a header of its own: kiln/train.hpp (Keras-style kiln::Model, metrics, callbacks),
// kiln/data/data.hpp (readers, datasets, data_loader; needs zlib), kiln/io.hpp (safetensors, checkpoints, ONNX), and
// the GPU policies, kiln/policy_cuda.cuh (from a .cu file; define KILN_DYNAMIC_POLICY before this header to run
// dynamic mode on one).
#pragma once

#include "kiln/core/init.hpp"
#include "kiln/core/tensor_init.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/layers/activation.hpp"
#include "kiln/layers/avgpool2d.hpp"
#include "kiln/layers/batchnorm.hpp"
#include "kiln/layers/conv2d.hpp"
#include "kiln/layers/dense.hpp"
#include "kiln/layers/dropout.hpp"
#include "kiln/layers/embedding.hpp"
#include "kiln/layers/flatten.hpp"
#include "kiln/layers/global_avg_pool2d.hpp"
#include "kiln/layers/layernorm.hpp"
#include "kiln/layers/maxpool2d.hpp"
#include "kiln/layers/positional_embedding.hpp"
#include "kiln/layers/self_attention.hpp"
#include "kiln/layers/gru.hpp"
#include "kiln/layers/lstm.hpp"
#include "kiln/layers/softmax.hpp"
#include "kiln/layers/sync_batch_norm.hpp"
#include "kiln/layers/time_distributed.hpp"
#include "kiln/layers/tokens.hpp"
#include "kiln/layers/transformer_encoder_layer.hpp"
#include "kiln/loss/losses.hpp"
#include "kiln/optim/adagrad.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/optim/lr_scheduler.hpp"
#include "kiln/optim/rmsprop.hpp"
#include "kiln/optim/sgd.hpp"
#include "kiln/policy.hpp"
#include "kiln/static/blocks.hpp"
#include "kiln/static/fused_mlp.hpp"
#include "kiln/static/sequential.hpp"
#include "kiln/layers/compiled_recurrent.hpp"
#include "kiln/optim/compiled_optimizers.hpp"
