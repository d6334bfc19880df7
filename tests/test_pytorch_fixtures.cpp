// Layers, losses, optimizers and a whole static training step against PyTorch's numbers (tests/fixtures, made by
// tests/fixtures/generate.py), at relative error <= 1e-5 in float32.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "fixture.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using kiln::test::check_close;
using kiln::test::fixture;
using P = policy::cpu;

namespace {
// Joins two strings without operator+ on a literal, which trips GCC 12's false -Wrestrict warning at -O3.
std::string join(std::string head, const std::string& tail) {
  head += tail;
  return head;
}
}  // namespace

TEST_CASE("Linear forward and backward match PyTorch") {
  for (std::string name : {"linear", "linear_nobias"}) {
    CAPTURE(name);
    fixture f(name);
    auto x = f.f32("x"), w = f.f32("weight"), dy = f.f32("dy");
    bool has_bias = f.has("bias");
    Tensor<float> b = has_bias ? f.f32("bias") : Tensor<float>();
    index_t batch = x.extent(0), in = x.extent(1), out = w.extent(0);
    Tensor<float> y(shape{batch, out}), dx(x.shape()), dw(w.shape()), db(shape{out});
    dense_forward<P>(x.data(), w.data(), has_bias ? b.data() : nullptr, y.data(), batch, in, out);
    check_close(y, f.f32("y"), "y");
    dense_backward<P>(x.data(), w.data(), dy.data(), dx.data(), dw.data(), has_bias ? db.data() : nullptr, batch, in,
                      out, false);
    check_close(dx, f.f32("dx"), "dx");
    check_close(dw, f.f32("dweight"), "dweight");
    if (has_bias) check_close(db, f.f32("dbias"), "dbias");
  }
}

TEST_CASE("activations match PyTorch") {
  struct entry {
    const char* name;
    activation kind;
  };
  for (auto [name, kind] : {entry{"relu", activation::relu}, entry{"leaky_relu", activation::leaky_relu},
                            entry{"gelu", activation::gelu}, entry{"sigmoid", activation::sigmoid},
                            entry{"tanh", activation::tanh}}) {
    CAPTURE(name);
    fixture f(name);
    float slope = f.has("slope") ? f.scalar("slope") : 0.01f;
    auto x = f.f32("x"), dy = f.f32("dy");
    Tensor<float> y(x.shape()), dx(x.shape());
    P::activation_forward(kind, x.data(), y.data(), x.numel(), slope);
    check_close(y, f.f32("y"), "y");
    P::activation_backward(kind, x.data(), y.data(), dy.data(), dx.data(), x.numel(), slope);
    check_close(dx, f.f32("dx"), "dx");
  }
}

TEST_CASE("softmax and log-softmax over an explicit dim match PyTorch") {
  for (std::string name : {"softmax_dim0", "softmax_dim1", "log_softmax_dim0", "log_softmax_dim1",
                           "log_softmax_dim2_rank3", "softmax_dim1_rank3"}) {
    CAPTURE(name);
    fixture f(name);
    bool log = name.starts_with("log");
    int dim = static_cast<int>(f.scalar("dim"));
    auto x = f.f32("x"), dy = f.f32("dy");
    Tensor<float> y(x.shape()), dx(x.shape());
    softmax_forward<P>(x.data(), y.data(), x.shape(), dim, log);
    check_close(y, f.f32("y"), "y");
    softmax_backward<P>(y.data(), dy.data(), dx.data(), x.shape(), dim, log);
    check_close(dx, f.f32("dx"), "dx");
  }
}

TEST_CASE("losses match PyTorch") {
  for (std::string reduce : {"mean", "sum"}) {
    reduction r = reduce == "mean" ? reduction::mean : reduction::sum;
    {
      fixture f(join("mse_", reduce));
      auto in = f.f32("input"), target = f.f32("target");
      Tensor<float> grad(in.shape());
      float loss = P::mse(in.data(), target.data(), in.numel(), r, grad.data());
      check_close(std::span<const float>(&loss, 1), f.f32("loss"), "mse loss");
      check_close(grad, f.f32("dinput"), "mse grad");
    }
    {
      fixture f(join("cross_entropy_", reduce));
      auto logits = f.f32("input");
      auto labels = f.i64("labels");
      Tensor<float> grad(logits.shape());
      float loss = P::softmax_cross_entropy(logits.data(), labels.data(), logits.extent(0), logits.extent(1), r,
                                            grad.data());
      check_close(std::span<const float>(&loss, 1), f.f32("loss"), "cross-entropy loss");
      check_close(grad, f.f32("dinput"), "cross-entropy grad");
    }
    {
      fixture f(join("bce_with_logits_", reduce));
      auto logits = f.f32("input"), target = f.f32("target");
      Tensor<float> grad(logits.shape());
      float loss = P::bce_with_logits(logits.data(), target.data(), logits.numel(), r, grad.data());
      check_close(std::span<const float>(&loss, 1), f.f32("loss"), "bce loss");
      check_close(grad, f.f32("dinput"), "bce grad");
    }
  }
}

namespace {
// Runs 5 steps of an optimizer with PyTorch's recorded gradients and compares each step's parameters.
template <class Optimizer>
void check_optimizer_steps(const fixture& f, Optimizer& opt, Tensor<float>& param, Tensor<float>& grad) {
  for (int step = 1; step <= 5; ++step) {
    CAPTURE(step);
    auto g = f.f32(join("g", std::to_string(step)));
    std::copy(g.span().begin(), g.span().end(), grad.data());
    opt.step();
    check_close(param, f.f32(join("p", std::to_string(step))), "parameters after step");
  }
}
}  // namespace

TEST_CASE("SGD variants match PyTorch over 5 steps") {
  for (std::string name : {"sgd_momentum", "sgd_nesterov", "sgd_dampening", "sgd_plain"}) {
    CAPTURE(name);
    fixture f(name);
    auto param = f.f32("p0");
    Tensor<float> grad(param.shape());
    std::vector<optim::parameter_slot<float>> slots{{param.data(), grad.data(), param.numel(), nullptr}};
    optim::SGD opt(slots, {.lr = f.scalar("lr"),
                           .momentum = f.scalar("momentum"),
                           .dampening = f.scalar("dampening"),
                           .weight_decay = f.scalar("weight_decay"),
                           .nesterov = f.scalar("nesterov") != 0});
    check_optimizer_steps(f, opt, param, grad);
  }
}

TEST_CASE("Adam, Adam with weight decay, AMSGrad and AdamW match PyTorch over 5 steps") {
  for (std::string name : {"adam", "adam_weight_decay", "adam_amsgrad", "adamw"}) {
    CAPTURE(name);
    fixture f(name);
    auto param = f.f32("p0");
    Tensor<float> grad(param.shape());
    std::vector<optim::parameter_slot<float>> slots{{param.data(), grad.data(), param.numel(), nullptr}};
    if (name == "adamw") {
      optim::AdamW opt(slots, {.lr = f.scalar("lr"),
                               .beta1 = f.scalar("beta1"),
                               .beta2 = f.scalar("beta2"),
                               .eps = f.scalar("eps"),
                               .weight_decay = f.scalar("weight_decay")});
      check_optimizer_steps(f, opt, param, grad);
    } else {
      optim::Adam opt(slots, {.lr = f.scalar("lr"),
                              .beta1 = f.scalar("beta1"),
                              .beta2 = f.scalar("beta2"),
                              .eps = f.scalar("eps"),
                              .weight_decay = f.scalar("weight_decay"),
                              .amsgrad = f.scalar("amsgrad") != 0});
      check_optimizer_steps(f, opt, param, grad);
    }
  }
}

TEST_CASE("clip_grad_norm (2-, 1- and infinity-norm, and under max_norm) and clip_grad_value match PyTorch") {
  for (std::string name :
       {"clip_grad_norm", "clip_grad_norm_p1", "clip_grad_norm_inf", "clip_grad_norm_under", "clip_grad_value"}) {
    CAPTURE(name);
    fixture f(name);
    std::vector<Tensor<float>> grads, values;
    std::vector<optim::parameter_slot<float>> slots;
    for (int i = 0; i < 3; ++i) {
      grads.push_back(f.f32(join("g", std::to_string(i))));
      values.emplace_back(grads.back().shape());
    }
    for (int i = 0; i < 3; ++i) slots.push_back({values[i].data(), grads[i].data(), grads[i].numel()});
    const std::span<const optim::parameter_slot<float>> view(slots);
    if (name == "clip_grad_value") {
      optim::clip_grad_value<P>(view, f.scalar("clip_value"));
    } else {
      const double norm = optim::clip_grad_norm<P>(view, f.scalar("max_norm"), {.norm_type = f.scalar("norm_type")});
      CHECK(norm == doctest::Approx(f.scalar("norm")).epsilon(1e-6));
    }
    for (int i = 0; i < 3; ++i) check_close(grads[i], f.f32(join("clipped", std::to_string(i))), "clipped gradient");
  }
}

TEST_CASE("a static MLP's training step matches PyTorch: loss, gradients, parameters after Adam") {
  fixture f("mlp_step");
  using Net = Sequential<P, Input<6>, Dense<5, ReLU>, Dense<3>>;
  Net net(8);
  std::vector<std::pair<std::string, Tensor<float>>> weights;
  for (const char* name : {"0.weight", "0.bias", "2.weight", "2.bias"}) weights.emplace_back(name, f.f32(name));
  net.load_state_dict(weights);
  auto x = f.f32("x");
  auto label_values = f.i64("labels");
  Tensor<std::int64_t> labels(shape{static_cast<index_t>(label_values.size())}, std::span<const std::int64_t>(label_values));
  float loss = net.forward_backward(x, labels, loss::cross_entropy{});
  check_close(std::span<const float>(&loss, 1), f.f32("loss"), "loss");
  for (auto& info : Net::named_parameter_infos())
    check_close(net.gradient_values().subspan(info.offset, info.shape.numel()), f.f32(join("grad.", info.name)),
                info.name.c_str());
  optim::Adam opt(net.parameters(), {.lr = f.scalar("lr")});
  opt.step();
  for (auto& [name, tensor] : net.state_dict()) check_close(tensor, f.f32(join("after.", name)), name.c_str());
}
