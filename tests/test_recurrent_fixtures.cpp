// nn::LSTM and nn::GRU against PyTorch (tests/fixtures/{lstm,gru}_*.txt, made by tests/fixtures/generate.py): output,
// h_n, c_n and every gradient (input, initial states, every weight) for 1 and 2 layers, one and two directions,
// batch first or not, with and without initial states, at relative error <= 1e-5 in float32. The static layer runs
// the same rnn_forward / rnn_backward; it is checked against the batch-first cases without initial states.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "fixture.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
using kiln::test::check_close;
using kiln::test::fixture;

namespace {

std::string join(std::string head, const std::string& tail) {
  head += tail;
  return head;
}

std::vector<std::string> case_names(const char* kind) {
  std::vector<std::string> names;
  for (int layers : {1, 2})
    for (bool bi : {false, true})
      for (bool bf : {false, true})
        for (bool state : {false, true}) {
          std::string n = kind;
          n += "_l";
          n += std::to_string(layers);
          if (bi) n += "_bi";
          if (bf) n += "_bf";
          if (state) n += "_state";
          names.push_back(n);
        }
  return names;
}

template <class Module>
void check_case(const std::string& name) {
  constexpr bool is_lstm = std::is_same_v<Module, nn::LSTM>;
  CAPTURE(name);
  fixture f(name);
  nn::rnn_options o;
  o.num_layers = name.find("_l2") != std::string::npos ? 2 : 1;
  o.bidirectional = name.find("_bi") != std::string::npos;
  o.batch_first = name.find("_bf") != std::string::npos;
  bool with_state = f.has("h0");
  Module rnn(3, 4, o);
  nn::Module::state_dict_type dict;
  for (auto& [pname, p] : rnn.named_parameters()) dict.emplace_back(pname, f.f32(pname));
  rnn.load_state_dict(dict);
  nn::Variable x(f.f32("x"), true);
  nn::Variable h0, c0;
  if (with_state) {
    h0 = nn::Variable(f.f32("h0"), true);
    if (is_lstm) c0 = nn::Variable(f.f32("c0"), true);
  }
  nn::Variable output, h_n, c_n;
  if constexpr (is_lstm) {
    auto [out, state] = with_state ? rnn(x, {h0, c0}) : rnn(x);
    output = out;
    h_n = std::get<0>(state);
    c_n = std::get<1>(state);
  } else {
    auto [out, h] = with_state ? rnn(x, h0) : rnn(x);
    output = out;
    h_n = h;
  }
  check_close(output.tensor(), f.f32("output"), "output");
  check_close(h_n.tensor(), f.f32("h_n"), "h_n");
  if (is_lstm) check_close(c_n.tensor(), f.f32("c_n"), "c_n");
  auto loss = nn::add(nn::sum(nn::mul(output, nn::Variable(f.f32("dout")))),
                      nn::sum(nn::mul(h_n, nn::Variable(f.f32("dh_n")))));
  if (is_lstm) loss = nn::add(loss, nn::sum(nn::mul(c_n, nn::Variable(f.f32("dc_n")))));
  loss.backward();
  check_close(Tensor<float>(tensor_view<const float>(x.grad())), f.f32("dx"), "dx");
  if (with_state) {
    check_close(Tensor<float>(tensor_view<const float>(h0.grad())), f.f32("dh0"), "dh0");
    if (is_lstm) check_close(Tensor<float>(tensor_view<const float>(c0.grad())), f.f32("dc0"), "dc0");
  }
  for (auto& [pname, p] : rnn.named_parameters()) {
    std::string key = join("grad.", pname);
    check_close(Tensor<float>(tensor_view<const float>(p.grad())), f.f32(key), key.c_str());
  }
}

// The static layer (AllSteps, batch first, zero initial states) on the same numbers: output and parameter gradients
// through the layer's bind, as a Sequential calls it.
template <class Layer, class Module>
void check_static_case(const std::string& name) {
  CAPTURE(name);
  fixture f(name);
  using B = typename Layer::template bind<dims<5, 3>>;
  std::vector<float> params(static_cast<std::size_t>(B::param_count)), grads(params.size());
  for (const auto& info : B::parameter_tensors()) {
    auto t = f.f32(info.name);
    std::copy(t.span().begin(), t.span().end(), params.begin() + info.offset);
  }
  auto x = f.f32("x");
  const index_t batch = x.extent(0);
  std::vector<float> scratch(static_cast<std::size_t>(B::scratch_per_sample * batch));
  Tensor<float> y(f.f32("output").shape()), dx(x.shape());
  layer_context ctx{batch, true, nullptr};
  B::template forward<policy::cpu>(params.data(), static_cast<float*>(nullptr), x.data(), y.data(), scratch.data(), ctx, true);
  check_close(y, f.f32("output"), "static output");
  // The fixture's loss also reaches h_n; the static layer sees only the output's gradient, so compare against the
  // dynamic module given the output gradient alone.
  auto dout = f.f32("dout");
  B::template backward<policy::cpu>(params.data(), x.data(), y.data(), dout.data(), dx.data(), grads.data(),
                                    scratch.data(), ctx);
  nn::rnn_options o{.num_layers = B::dims.num_layers, .batch_first = true, .bidirectional = B::dims.bidirectional};
  Module rnn(3, 4, o);
  nn::Module::state_dict_type dict;
  for (auto& [pname, p] : rnn.named_parameters()) dict.emplace_back(pname, f.f32(pname));
  rnn.load_state_dict(dict);
  nn::Variable xv(x, true);
  auto out = rnn.forward(xv);
  nn::sum(nn::mul(out, nn::Variable(dout))).backward();
  check_close(dx.span(), Tensor<float>(tensor_view<const float>(xv.grad())), "static dx");
  for (const auto& info : B::parameter_tensors()) {
    for (auto& [pname, p] : rnn.named_parameters())
      if (pname == info.name)
        check_close(std::span<const float>(grads.data() + info.offset, static_cast<std::size_t>(info.shape.numel())),
                    Tensor<float>(tensor_view<const float>(p.grad())), info.name.c_str());
  }
}

}  // namespace

TEST_CASE("nn::LSTM matches PyTorch: outputs, states and every gradient") {
  for (const auto& name : case_names("lstm")) check_case<nn::LSTM>(name);
}

TEST_CASE("nn::GRU matches PyTorch: outputs, states and every gradient") {
  for (const auto& name : case_names("gru")) check_case<nn::GRU>(name);
}

TEST_CASE("static kiln::LSTM / kiln::GRU match PyTorch's output and the dynamic module's gradients") {
  check_static_case<LSTM<4>, nn::LSTM>("lstm_l1_bf");
  check_static_case<LSTM<4, 2, true>, nn::LSTM>("lstm_l2_bi_bf");
  check_static_case<GRU<4>, nn::GRU>("gru_l1_bf");
  check_static_case<GRU<4, 2, true>, nn::GRU>("gru_l2_bi_bf");
}
