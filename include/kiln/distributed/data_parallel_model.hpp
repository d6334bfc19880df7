// Model::fit across processes: kiln::Model over a static_data_parallel model trains it as it trains the model alone,
// with each rank on its shard of every epoch, the gradients averaged over the ranks at every step, the epoch's logs
// summed over the ranks (every rank sees the same), and the progress bar and the callbacks' files on rank 0:
//
//   distributed::process_group group;
//   Net net(32, 42);
//   distributed::static_data_parallel ddp(net, group);
//   Model model(ddp);
//   model.compile(optim::Adam({.lr = 1e-3}), loss::cross_entropy{}, {metric::accuracy});
//   model.fit(train, {.epochs = 5, .batch_size = 32, .seed = 42});   // 32 a rank: a batch of 64 on two
//
// Everything but the training step and the distribution is the model's own (train::model_access<Net>).
#pragma once

#include <vector>

#include "kiln/distributed/static_data_parallel.hpp"
#include "kiln/train/model_access.hpp"

namespace kiln::train {

template <class Net>
struct model_access<distributed::static_data_parallel<Net>> {
  using net_type = distributed::static_data_parallel<Net>;
  using own = model_access<Net>;
  static constexpr const char* mode = own::mode;

  static index_t input_size(const net_type& d) { return own::input_size(d.model()); }
  static index_t output_size(const net_type& d) { return own::output_size(d.model()); }
  static shape input_shape(const net_type& d) { return own::input_shape(d.model()); }
  static bool is_other_layout(const shape& s, int first) { return own::is_other_layout(s, first); }
  static index_t max_batch(const net_type& d) { return own::max_batch(d.model()); }

  // One data-parallel step: this rank's batch, the gradients averaged over the ranks, the optimizer's step. A step
  // profile is not taken across processes.
  template <class Loss, class Optimizer, class Target>
  static float train_batch(net_type& d, tensor_view<const float> x, tensor_view<const Target> y, const Loss& loss,
                           Optimizer& opt, step_profile* profile = nullptr) {
    if (profile) fail("Model::fit: a step profile is not taken across processes; profile one process");
    return d.train_step(x, y, loss, opt);
  }
  template <class Loss, class Target>
  static float eval_batch(net_type& d, tensor_view<const float> x, tensor_view<const Target> y, const Loss& loss) {
    return own::eval_batch(d.model(), x, y, loss);
  }
  static tensor_view<const float> last_output(net_type& d) { return own::last_output(d.model()); }
  static Tensor<float> predict(net_type& d, tensor_view<const float> x) { return own::predict(d.model(), x); }
  static auto parameters(net_type& d) { return own::parameters(d.model()); }
  static weight_snapshot weights(const net_type& d) { return own::weights(d.model()); }
  static void set_weights(net_type& d, const weight_snapshot& w) { own::set_weights(d.model(), w); }
  static std::vector<layer_summary> summary_rows(const net_type& d) { return own::summary_rows(d.model()); }
  static std::vector<std::string> plan_notes(const net_type& d) { return own::plan_notes(d.model()); }
  static index_t trainable_parameters(const net_type& d) { return own::trainable_parameters(d.model()); }
  static index_t non_trainable_parameters(const net_type& d) { return own::non_trainable_parameters(d.model()); }
  static train::distribution& distribution(net_type& d) { return d.distribution(); }
};

}  // namespace kiln::train
