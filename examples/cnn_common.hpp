// What the CNN examples share: image data as (N, 1, 28, 28), training with kiln::Model in either mode, and the
// RESULT line.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "kiln/train.hpp"
#include "mnist_common.hpp"

namespace kiln::examples {

struct cnn_outcome {
  double test_acc = 0, train_s = 0, step_us = 0;
};

// Gives every image a channel dimension: (N, 28, 28) -> (N, 1, 28, 28), as convolutions take NCHW.
inline void add_channel_dim(mnist_data& d) {
  for (auto* set : {&d.train, &d.test}) {
    auto& f = set->features();
    f.reshape(shape{f.extent(0), 1, f.extent(1), f.extent(2)});
  }
}

// Adam(1e-3), batch 64, cross-entropy, optional augmentation and callbacks (a learning-rate schedule); evaluation on the test set, and with class names a
// per-class report of precision, recall and F1 from the test set's confusion matrix.
template <class Net>
cnn_outcome fit_cnn(Net& net, const mnist_data& d, int epochs, std::uint64_t seed,
                    data::transform_fn<float> transform = {}, double lr = 1e-3,
                    const std::vector<std::string>& class_names = {},
                    std::vector<std::shared_ptr<train::callback>> callbacks = {}) {
  Model model(net);
  model.compile(optim::Adam({.lr = lr}), loss::cross_entropy{}, {metric::accuracy});
  model.summary();
  auto start = std::chrono::steady_clock::now();
  model.fit(d.train, {.epochs = epochs,
                     .batch_size = 64,
                     .callbacks = std::move(callbacks),
                     .seed = seed,
                     .transform = std::move(transform)});
  double train_s = seconds_since(start);
  auto test = model.evaluate(d.test);
  std::printf("test loss %.4f, test accuracy %.4f\n", test.loss, test["accuracy"]);
  if (!class_names.empty()) std::printf("%s", model.confusion_matrix(d.test).report(class_names).c_str());
  return {test["accuracy"], train_s, model.timing().step_microseconds()};
}

inline void print_result(const char* example, const std::string& mode, int epochs, const cnn_outcome& r) {
  std::printf("RESULT example=%s mode=%s epochs=%d test_acc=%.4f train_s=%.3f step_us=%.2f\n", example, mode.c_str(),
              epochs, r.test_acc, r.train_s, r.step_us);
}

}  // namespace kiln::examples
