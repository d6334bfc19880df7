// model_access for dynamic-mode modules: lets kiln::Model train any nn::Module (nn::Sequential or a custom one) with
// the same compile / fit / evaluate as a static Sequential.
#pragma once

#include <concepts>
#include <limits>
#include <sstream>

#include "kiln/dynamic/nn.hpp"
#include "kiln/loss/losses.hpp"
#include "kiln/train/model_access.hpp"

namespace kiln::train {

namespace detail {
// The dynamic loss that matches each shared loss type: the same kernels static mode's train_step calls.
inline nn::Variable dynamic_loss(const loss::mse& l, const nn::Variable& out, tensor_view<const float> y) {
  return nn::mse_loss(out, nn::Variable(y.reshaped(out.shape())), l.reduce);
}
inline nn::Variable dynamic_loss(const loss::cross_entropy& l, const nn::Variable& out,
                                 tensor_view<const std::int64_t> y) {
  if (l.plain()) return nn::cross_entropy(out, y.span(), l.reduce);
  return nn::cross_entropy(out, y.span(),
                           {.reduce = l.reduce, .weight = l.weight.values(), .ignore_index = l.ignore_index,
                            .label_smoothing = l.label_smoothing});
}
inline nn::Variable dynamic_loss(const loss::nll& l, const nn::Variable& out, tensor_view<const std::int64_t> y) {
  return nn::nll_loss(out, y.span(), {.reduce = l.reduce, .weight = l.weight.values(), .ignore_index = l.ignore_index});
}
inline nn::Variable dynamic_loss(const loss::l1& l, const nn::Variable& out, tensor_view<const float> y) {
  return nn::l1_loss(out, nn::Variable(y.reshaped(out.shape())), l.reduce);
}
inline nn::Variable dynamic_loss(const loss::smooth_l1& l, const nn::Variable& out, tensor_view<const float> y) {
  return nn::smooth_l1_loss(out, nn::Variable(y.reshaped(out.shape())), l.reduce, l.beta);
}
inline nn::Variable dynamic_loss(const loss::huber& l, const nn::Variable& out, tensor_view<const float> y) {
  return nn::huber_loss(out, nn::Variable(y.reshaped(out.shape())), l.reduce, l.delta);
}
inline nn::Variable dynamic_loss(const loss::bce_with_logits& l, const nn::Variable& out, tensor_view<const float> y) {
  return nn::binary_cross_entropy_with_logits(out, nn::Variable(y.reshaped(out.shape())), l.reduce);
}
}  // namespace detail

// Any float module. Input and output sizes are whatever the module accepts: they are learnt from the data.
template <class M>
  requires std::derived_from<M, nn::basic_module<float>>
struct model_access<M> {
  static constexpr const char* mode = "dynamic";

  index_t input_size(const M&) const { return -1; }  // any: the module checks its input itself
  // 0 until a forward has shown it.
  index_t output_size(const M&) const {
    return last_.defined() && last_.shape().rank() ? last_.shape().row_size() : 0;
  }
  index_t max_batch(const M&) const { return std::numeric_limits<index_t>::max(); }

  template <class Loss, class Optimizer, class Target>
  float train_batch(M& net, tensor_view<const float> x, tensor_view<const Target> y, const Loss& loss,
                    Optimizer& opt, step_profile* profile = nullptr) {
    remember_sample_shape(x);
    if (profile) {
      // nn::train_step times a Sequential's children; other modules have no parts it could name.
      auto* sequential = dynamic_cast<nn::basic_sequential<float>*>(static_cast<nn::basic_module<float>*>(&net));
      if (!sequential)
        fail("Model::fit: a step profile needs a static model or a dynamic nn::Sequential, whose children it times; "
             "found ", net.name());
      return nn::train_step(
          *sequential, nn::Variable::borrowing(x),
          [&](const nn::Variable& out) {
            last_ = out;
            return detail::dynamic_loss(loss, out, y);
          },
          opt, *profile);
    }
    opt.zero_grad();
    last_ = net(nn::Variable::borrowing(x));
    auto l = detail::dynamic_loss(loss, last_, y);
    l.backward();
    opt.step();
    return l.item();
  }
  template <class Loss, class Target>
  float eval_batch(M& net, tensor_view<const float> x, tensor_view<const Target> y, const Loss& loss) {
    remember_sample_shape(x);
    nn::no_grad guard;
    bool was_training = net.is_training();
    net.eval();
    last_ = net(nn::Variable::borrowing(x));
    net.train(was_training);
    return detail::dynamic_loss(loss, last_, y).item();
  }
  tensor_view<const float> last_output(const M&) const { return last_.value(); }
  Tensor<float> predict(M& net, tensor_view<const float> x) {
    nn::no_grad guard;
    bool was_training = net.is_training();
    net.eval();
    auto out = net(nn::Variable::borrowing(x));
    net.train(was_training);
    return Tensor<float>(tensor_view<const float>(out.value()));
  }

  auto parameters(M& net) const { return net.parameters(); }
  weight_snapshot weights(const M& net) const {
    weight_snapshot out;
    for (auto& [name, tensor] : net.state_dict()) out.emplace_back(name, tensor);
    return out;
  }
  void set_weights(M& net, const weight_snapshot& w) const { net.load_state_dict(w); }

  // Notes under the summary's table: none in dynamic mode, which plans no memory and fuses nothing ahead of a step.
  std::vector<std::string> plan_notes(const M&) const { return {}; }
  // One row per child module; output shapes come from running one zero sample through the children, which needs a
  // sample shape seen in fit or evaluate (shown as "?" before).
  std::vector<layer_summary> summary_rows(const M& net) const {
    std::vector<layer_summary> rows;
    nn::no_grad guard;
    nn::Variable x;
    bool shapes = sample_shape_.rank() > 0;
    if (shapes) x = nn::Variable(sample_shape_);
    for (auto& [name, child] : net.named_children()) {
      kiln::shape out;
      if (shapes) {
        try {
          x = child->forward(x);
          out = x.shape();
        } catch (const error&) {
          shapes = false;
        }
      }
      rows.push_back({child->describe(), out, child->parameter_count()});
    }
    if (net.named_children().empty()) rows.push_back({net.describe(), {}, net.parameter_count()});
    return rows;
  }
  index_t trainable_parameters(const M& net) const { return count(net, true); }
  index_t non_trainable_parameters(const M& net) const { return count(net, false); }

 private:
  void remember_sample_shape(tensor_view<const float> x) { sample_shape_ = x.shape().with_batch(1); }
  static index_t count(const M& net, bool trainable) {
    index_t n = 0;
    for (auto& p : net.parameters())
      if (p.requires_grad() == trainable) n += p.shape().numel();
    return n;
  }

  nn::Variable last_;
  kiln::shape sample_shape_;
};

}  // namespace kiln::train
