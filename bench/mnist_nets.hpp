// The static models of the ladder's MNIST and Fashion-MNIST workloads (bench/ladder.cpp), shared with
// bench/thread_scaling so that both measure the same networks.
#pragma once

#include "../examples/resnet_net.hpp"
#include "kiln/kiln.hpp"

namespace kiln::bench {

// mnist_mlp: 784 -> 128 ReLU -> 10, on the default policy, whose kernels dynamic mode's rungs call too (the ladder
// refuses to time rungs whose losses differ).
using mnist_mlp_net = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;
// mnist_cnn: examples/mnist_cnn's network without its dropout.
using mnist_cnn_net = Sequential<policy::cpu, Input<1, 28, 28>, Conv2D<32, 3>, ReLU, Conv2D<64, 3>, ReLU, MaxPool2D<2>,
                                 Flatten, Dense<128, ReLU>, Dense<10>>;
// lstm: each image as 28 rows of 28 pixels into LSTM(128), its final hidden state into Dense 10.
using lstm_net = Sequential<policy::cpu, Input<28, 28>, FinalState<LSTM<128>>, Dense<10>>;

// resnet: examples/resnet_fashion's network (examples/resnet_net.hpp).
using resnet_net = examples::static_resnet<>;

}  // namespace kiln::bench
