// kiln: the umbrella header. Includes both modes, every layer, loss and optimizer.
#pragma once

#include "kiln/core/init.hpp"
#include "kiln/core/random.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/core/threads.hpp"
#include "kiln/layers/activation.hpp"
#include "kiln/layers/dense.hpp"
#include "kiln/layers/flatten.hpp"
#include "kiln/layers/gru.hpp"
#include "kiln/layers/lstm.hpp"
#include "kiln/layers/softmax.hpp"
#include "kiln/loss/losses.hpp"
#include "kiln/optim/adam.hpp"
#include "kiln/optim/sgd.hpp"
#include "kiln/policy.hpp"
#include "kiln/static/sequential.hpp"
