// The models the weights and checkpoint targets load into: a small static Sequential and the same layers as a
// dynamic nn::Sequential, each made from a fixed seed, and the means to check that a refused load changed nothing.
#pragma once

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

namespace kiln_fuzz {

using static_model = kiln::Sequential<kiln::policy::cpu, kiln::Input<4>, kiln::Dense<3, kiln::ReLU>, kiln::Dense<2>>;

inline static_model make_static_model() { return static_model(8, 1); }
inline auto make_dynamic_model() {
  kiln::manual_seed(1);
  return kiln::nn::Sequential(kiln::nn::Linear(4, 3), kiln::nn::ReLU(), kiln::nn::Linear(3, 2));
}

// One training step of the dynamic model on a fixed batch, so that its optimizer has state to save and to restore.
template <class M, class O>
void dynamic_step(M& model, O& optimizer) {
  kiln::nn::Variable x(kiln::Tensor<float>(kiln::shape{8, 4}, 0.5f)), y(kiln::Tensor<float>(kiln::shape{8, 2}, 0.25f));
  optimizer.zero_grad();
  kiln::nn::mse_loss(model(x), y).backward();
  optimizer.step();
}

// The bytes of every tensor of a state dict, with its name: equal exactly when the two dicts are bit for bit equal.
template <class M>
std::string state_bytes(const M& model) {
  std::string out;
  for (const auto& [name, tensor] : model.state_dict()) {
    out += name;
    out += '\0';
    out.append(reinterpret_cast<const char*>(tensor.data()), static_cast<std::size_t>(tensor.numel()) * sizeof(float));
  }
  return out;
}

}  // namespace kiln_fuzz
