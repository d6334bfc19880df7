// kiln's dynamic mode (PyTorch-like), all of it: Variable and autograd, the functional ops, Module and the nn modules.
//   #include "kiln/dynamic/nn.hpp"
//   kiln::manual_seed(42);
//   auto model = kiln::nn::Sequential(kiln::nn::Flatten(), kiln::nn::Linear(784, 128), kiln::nn::ReLU(),
//                                     kiln::nn::Linear(128, 10));
//   kiln::optim::Adam opt(model.parameters(), {.lr = 1e-3});
//   opt.zero_grad(); auto loss = kiln::nn::cross_entropy(model(x), labels); loss.backward(); opt.step();
#pragma once

#include "kiln/dynamic/allocator.hpp"
#include "kiln/dynamic/function.hpp"
#include "kiln/dynamic/grad_clip.hpp"
#include "kiln/dynamic/functional/activation.hpp"
#include "kiln/dynamic/functional/arithmetic.hpp"
#include "kiln/dynamic/functional/broadcast.hpp"
#include "kiln/dynamic/functional/conv.hpp"
#include "kiln/dynamic/functional/indexing.hpp"
#include "kiln/dynamic/functional/linear.hpp"
#include "kiln/dynamic/functional/loss.hpp"
#include "kiln/dynamic/functional/matmul.hpp"
#include "kiln/dynamic/functional/normalization.hpp"
#include "kiln/dynamic/functional/pointwise.hpp"
#include "kiln/dynamic/functional/recurrent.hpp"
#include "kiln/dynamic/functional/reduce.hpp"
#include "kiln/dynamic/functional/shape.hpp"
#include "kiln/dynamic/functional/softmax.hpp"
#include "kiln/dynamic/grad_mode.hpp"
#include "kiln/dynamic/init.hpp"
#include "kiln/dynamic/module.hpp"
#include "kiln/dynamic/modules/activation.hpp"
#include "kiln/dynamic/modules/conv.hpp"
#include "kiln/dynamic/modules/embedding.hpp"
#include "kiln/dynamic/modules/flatten.hpp"
#include "kiln/dynamic/modules/linear.hpp"
#include "kiln/dynamic/modules/normalization.hpp"
#include "kiln/dynamic/modules/pooling.hpp"
#include "kiln/dynamic/modules/recurrent.hpp"
#include "kiln/dynamic/modules/sequential.hpp"
#include "kiln/dynamic/modules/softmax.hpp"
#include "kiln/dynamic/step_profile.hpp"
#include "kiln/dynamic/variable.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/optim/sgd.hpp"
#include "kiln/dynamic/compiled_modules.hpp"
