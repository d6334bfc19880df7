// Keras-style training: compile / fit / evaluate / predict / summary, metrics, callbacks, history files.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;

namespace {
// Two Gaussian blobs per class in 4-D: separable but not trivially.
struct blobs {
  Tensor<float> x;
  Tensor<std::int64_t> y;
};
blobs make_blobs(index_t n, std::uint64_t seed) {
  random_generator rng(seed);
  blobs b{Tensor<float>(shape{n, 4}), Tensor<std::int64_t>(shape{n})};
  for (index_t i = 0; i < n; ++i) {
    std::int64_t label = static_cast<std::int64_t>(rng.below(3));
    b.y[i] = label;
    for (int j = 0; j < 4; ++j) b.x.at(i, j) = rng.normal<float>() * 0.7f + (j == label ? 2.0f : 0.0f);
  }
  return b;
}
std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
using Net = Sequential<policy::cpu, Input<4>, Dense<16, ReLU>, Dense<3>>;
}  // namespace

TEST_CASE("fit lowers the loss and evaluate reports loss and metrics") {
  auto train = make_blobs(600, 1), test = make_blobs(300, 2);
  Net net(32, 7);
  Model model(net);
  model.compile(optim::Adam({.lr = 1e-2}), loss::cross_entropy{}, {metric::accuracy, metric::top_k_accuracy(2)});
  auto before = model.evaluate(test.x, test.y);
  auto history = model.fit(train.x, train.y,
                           {.epochs = 5, .batch_size = 32, .validation_data = labelled_data{test.x, test.y}, .verbose = 0});
  REQUIRE(history.size() == 5);
  auto losses = history.series("loss");
  CHECK(losses.back() < losses.front());
  auto after = model.evaluate(test.x, test.y);
  CHECK(after.loss < before.loss);
  CHECK(after["accuracy"] > 0.85);
  CHECK(after["top2_accuracy"] >= after["accuracy"]);
  CHECK(history.series("val_accuracy").back() == doctest::Approx(after["accuracy"]));
  CHECK(model.timing().steps == 5 * 19);
  auto predictions = model.predict(test.x);
  CHECK(predictions.shape() == shape{300, 3});
}

TEST_CASE("metrics compute what they say") {
  float out[] = {0.1f, 0.7f, 0.2f, 0.5f, 0.3f, 0.2f, 0.1f, 0.2f, 0.7f};
  std::int64_t labels[] = {1, 1, 0};
  metric::accumulator acc(metric::accuracy), top2(metric::top_k_accuracy(2));
  acc.update({out, 3, 3, labels, nullptr});
  top2.update({out, 3, 3, labels, nullptr});
  CHECK(acc.result() == doctest::Approx(1.0 / 3));
  CHECK(top2.result() == doctest::Approx(2.0 / 3));
  float pred[] = {1, 2, 3, 4}, target[] = {1, 0, 3, 6};
  metric::accumulator mse(metric::mse), mae(metric::mae);
  mse.update({pred, 2, 2, nullptr, target});
  mae.update({pred, 2, 2, nullptr, target});
  CHECK(mse.result() == doctest::Approx((0 + 4 + 0 + 4) / 4.0));
  CHECK(mae.result() == doctest::Approx((0 + 2 + 0 + 2) / 4.0));
  CHECK_THROWS_AS(mse.update({pred, 2, 2, labels, nullptr}), kiln::error);
}

namespace {
// Outputs that predict the given classes: a 1 at the predicted class, 0 elsewhere.
std::vector<float> one_hot_outputs(const std::vector<int>& predicted, int classes) {
  std::vector<float> out(predicted.size() * static_cast<std::size_t>(classes), 0.0f);
  for (std::size_t i = 0; i < predicted.size(); ++i) out[i * static_cast<std::size_t>(classes) + predicted[i]] = 1;
  return out;
}
}  // namespace

TEST_CASE("a confusion matrix gives precision, recall and F1 as scikit-learn defines them") {
  // Rows are labels, columns predictions: {2, 1, 0}, {0, 1, 1}, {2, 0, 2}. Classes 0..2 are predicted 4, 2 and 3
  // times and occur 3, 2 and 4 times; a fourth output never wins and no label is 3.
  std::vector<std::int64_t> labels{0, 0, 0, 1, 1, 2, 2, 2, 2};
  auto out = one_hot_outputs({0, 1, 0, 1, 2, 2, 2, 0, 0}, 4);
  metric::confusion_matrix cm;
  cm.update({out.data(), 5, 4, labels.data(), nullptr});  // two batches add up
  cm.update({out.data() + 20, 4, 4, labels.data() + 5, nullptr});
  REQUIRE(cm.classes() == 4);
  CHECK(cm.total() == 9);
  CHECK(cm.count(0, 0) == 2);
  CHECK(cm.count(0, 1) == 1);
  CHECK(cm.count(2, 0) == 2);
  CHECK(cm.count(1, 0) == 0);
  CHECK(cm.support(2) == 4);
  CHECK(cm.predictions(0) == 4);
  CHECK(cm.precision(0) == doctest::Approx(2.0 / 4));
  CHECK(cm.recall(0) == doctest::Approx(2.0 / 3));
  CHECK(cm.f1(0) == doctest::Approx(4.0 / 7));
  CHECK(cm.precision(2) == doctest::Approx(2.0 / 3));
  CHECK(cm.recall(2) == doctest::Approx(2.0 / 4));
  CHECK(cm.precision(3) == 0.0);  // never predicted: 0, not NaN
  CHECK(cm.accuracy() == doctest::Approx(5.0 / 9));
  // Class 3 occurs nowhere, so the averages leave it out.
  CHECK(cm.precision(metric::average::macro) == doctest::Approx((0.5 + 0.5 + 2.0 / 3) / 3));
  CHECK(cm.recall(metric::average::macro) == doctest::Approx((2.0 / 3 + 0.5 + 0.5) / 3));
  CHECK(cm.f1(metric::average::macro) == doctest::Approx(23.0 / 42));
  CHECK(cm.precision(metric::average::weighted) == doctest::Approx((3 * 0.5 + 2 * 0.5 + 4 * 2.0 / 3) / 9));
  CHECK(cm.recall(metric::average::weighted) == doctest::Approx(5.0 / 9));
  CHECK(cm.f1(metric::average::micro) == doctest::Approx(5.0 / 9));
  CHECK_THROWS_WITH_AS(cm.precision(metric::average::binary), doctest::Contains("2 classes, found 4"), kiln::error);

  std::string report = cm.report({"zero", "one", "two", "three"});
  CHECK(report.find("precision") != std::string::npos);
  CHECK(report.find("   three    0.0000    0.0000    0.0000         0") != std::string::npos);
  CHECK(report.find("macro avg") != std::string::npos);
  CHECK(report.find("0.5556         9") != std::string::npos);  // accuracy
  CHECK_THROWS_WITH_AS(cm.report({"a"}), doctest::Contains("expected 4 class names, found 1"), kiln::error);

  cm.reset();
  CHECK(cm.total() == 0);
  CHECK(cm.count(0, 0) == 0);
}

TEST_CASE("precision, recall and F1 metrics: binary for one output, macro for several") {
  // One output: a positive logit predicts class 1. Labels 1 1 0 0 0, predictions 1 0 1 0 1: one true positive, two
  // false positives, one false negative.
  float logits[] = {2.0f, -1.0f, 0.5f, -3.0f, 1.0f};
  std::int64_t labels[] = {1, 1, 0, 0, 0};
  metric::accumulator p(metric::precision()), r(metric::recall()), f(metric::f1_score());
  for (auto* m : {&p, &r, &f}) m->update({logits, 5, 1, labels, nullptr});
  CHECK(p.name() == "precision");
  CHECK(f.name() == "f1");
  CHECK(p.result() == doctest::Approx(1.0 / 3));
  CHECK(r.result() == doctest::Approx(1.0 / 2));
  CHECK(f.result() == doctest::Approx(0.4));
  p.reset();
  CHECK(p.result() == 0.0);

  std::vector<std::int64_t> classes{0, 0, 0, 1, 1, 2, 2, 2, 2};
  auto out = one_hot_outputs({0, 1, 0, 1, 2, 2, 2, 0, 0}, 3);
  metric::accumulator macro(metric::f1_score()), weighted(metric::precision(metric::average::weighted));
  macro.update({out.data(), 9, 3, classes.data(), nullptr});
  weighted.update({out.data(), 9, 3, classes.data(), nullptr});
  CHECK(macro.result() == doctest::Approx(23.0 / 42));
  CHECK(weighted.name() == "precision_weighted");
  CHECK(weighted.result() == doctest::Approx((3 * 0.5 + 2 * 0.5 + 4 * 2.0 / 3) / 9));

  float values[] = {1, 2};
  CHECK_THROWS_WITH_AS(r.update({values, 2, 1, nullptr, values}), doctest::Contains("expected integer labels"),
                       kiln::error);
  metric::accumulator binary(metric::recall(metric::average::binary));
  CHECK_THROWS_WITH_AS(binary.update({out.data(), 9, 3, classes.data(), nullptr}),
                       doctest::Contains("one or two outputs, found 3"), kiln::error);
  std::int64_t bad[] = {0, 5};
  metric::confusion_matrix cm(3);
  CHECK_THROWS_WITH_AS(cm.update({out.data(), 2, 3, bad, nullptr}), doctest::Contains("found 5 at sample 1"),
                       kiln::error);
  CHECK_THROWS_WITH_AS(cm.update({out.data(), 2, 4, classes.data(), nullptr}),
                       doctest::Contains("3 classes, found a batch of width 4"), kiln::error);
}

TEST_CASE("Model::confusion_matrix and the F1 metric during fit") {
  auto train = make_blobs(600, 1), test = make_blobs(300, 2);
  Net net(32, 7);
  Model model(net);
  model.compile(optim::Adam({.lr = 1e-2}), loss::cross_entropy{}, {metric::accuracy, metric::f1_score()});
  auto history = model.fit(train.x, train.y, {.epochs = 3, .batch_size = 32,
                                              .validation_data = labelled_data{test.x, test.y}, .verbose = 0});
  auto cm = model.confusion_matrix(test.x, test.y, 64);
  CHECK(cm.total() == 300);
  CHECK(cm.classes() == 3);
  auto scores = model.evaluate(test.x, test.y);
  CHECK(cm.accuracy() == doctest::Approx(scores["accuracy"]));
  CHECK(cm.f1(metric::average::macro) == doctest::Approx(scores["f1"]));
  CHECK(history.series("val_f1").back() == doctest::Approx(scores["f1"]));
  long long class_one = 0;
  for (index_t i = 0; i < 300; ++i) class_one += test.y[i] == 1;
  CHECK(cm.support(1) == class_one);

  Tensor<std::int64_t> bad = test.y;
  bad[7] = 3;
  CHECK_THROWS_WITH_AS(model.confusion_matrix(test.x, bad),
                       doctest::Contains("found 3 for sample 7 of the data set"), kiln::error);
}

TEST_CASE("EarlyStopping stops and restores the best weights") {
  auto train = make_blobs(200, 3), test = make_blobs(100, 4);
  Net net(32, 9);
  Model model(net);
  // A learning rate this large makes validation loss bounce, so patience runs out.
  model.compile(optim::SGD({.lr = 3.0}), loss::cross_entropy{});
  auto stopper = std::make_shared<train::EarlyStopping>(
      train::EarlyStopping::options{.monitor = "val_loss", .patience = 1, .restore_best_weights = true});
  auto checkpoint = std::make_shared<train::ModelCheckpoint>();
  auto history = model.fit(train.x, train.y,
                           {.epochs = 40, .batch_size = 32, .validation_data = labelled_data{test.x, test.y},
                            .callbacks = {stopper, checkpoint}, .verbose = 0});
  REQUIRE(stopper->stopped_epoch() >= 0);
  CHECK(history.size() == static_cast<std::size_t>(stopper->stopped_epoch() + 1));
  CHECK(history.size() < 40);
  // The restored weights give the best validation loss seen.
  CHECK(model.evaluate(test.x, test.y).loss == doctest::Approx(stopper->best_value()).epsilon(1e-5));
  CHECK(checkpoint->best_epoch() == stopper->best_epoch());
}

TEST_CASE("learning-rate schedules and ReduceLROnPlateau") {
  auto train = make_blobs(64, 5);
  Net net(32, 1);
  Model model(net);
  model.compile(optim::Adam({.lr = 0.1}), loss::cross_entropy{});
  auto step = std::make_shared<train::LearningRateScheduler>(train::LearningRateScheduler::step(2, 0.5));
  auto h = model.fit(train.x, train.y, {.epochs = 5, .batch_size = 32, .callbacks = {step}, .verbose = 0});
  auto lrs = h.series("lr");
  CHECK(lrs[0] == doctest::Approx(0.1));
  CHECK(lrs[2] == doctest::Approx(0.05));
  CHECK(lrs[4] == doctest::Approx(0.025));
  auto cosine = train::LearningRateScheduler::cosine(4, 0.0);
  Net net2(32, 1);
  Model model2(net2);
  model2.compile(optim::SGD({.lr = 1.0}), loss::cross_entropy{});
  auto cos_cb = std::make_shared<train::LearningRateScheduler>(cosine);
  auto h2 = model2.fit(train.x, train.y, {.epochs = 5, .batch_size = 32, .callbacks = {cos_cb}, .verbose = 0});
  CHECK(h2.series("lr")[2] == doctest::Approx(0.5));
  CHECK(h2.series("lr")[4] == doctest::Approx(0.0));
  // A monitored quantity that never improves: the rate drops after each patience window.
  Net net3(32, 1);
  Model model3(net3);
  model3.compile(optim::SGD({.lr = 1.0}), loss::cross_entropy{});
  auto never = std::make_shared<train::LambdaCallback>();
  never->epoch_end = [](int, train::logs& l, train::training_control&) { l.set("flat", 1.0); };
  auto plateau = std::make_shared<train::ReduceLROnPlateau>(
      train::ReduceLROnPlateau::options{.monitor = "flat", .factor = 0.5, .patience = 2});
  auto h3 = model3.fit(train.x, train.y, {.epochs = 5, .batch_size = 32, .callbacks = {never, plateau}, .verbose = 0});
  CHECK(h3.series("lr")[0] == doctest::Approx(1.0));
  CHECK(h3.series("lr")[2] == doctest::Approx(0.5));
  CHECK(h3.series("lr")[4] == doctest::Approx(0.25));
}

TEST_CASE("history and CSVLogger write well-formed CSV and SVG files") {
  auto train = make_blobs(128, 6);
  Net net(32, 2);
  Model model(net);
  model.compile(optim::Adam({.lr = 1e-2}), loss::cross_entropy{}, {metric::accuracy});
  auto dir = std::filesystem::temp_directory_path() / "kiln_test_train";
  std::filesystem::create_directories(dir);
  auto logger = std::make_shared<train::CSVLogger>((dir / "log.csv").string());
  auto h = model.fit(train.x, train.y,
                     {.epochs = 3, .batch_size = 32, .validation_split = 0.25, .callbacks = {logger}, .verbose = 0});
  h.write_csv((dir / "history.csv").string());
  h.write_svg((dir / "history.svg").string());
  std::string csv = read_text(dir / "history.csv");
  std::istringstream lines(csv);
  std::string header, line;
  std::getline(lines, header);
  CHECK(header.rfind("epoch,loss,accuracy,val_loss,val_accuracy", 0) == 0);
  int rows = 0;
  auto commas = std::count(header.begin(), header.end(), ',');
  while (std::getline(lines, line)) {
    ++rows;
    CHECK(std::count(line.begin(), line.end(), ',') == commas);
  }
  CHECK(rows == 3);
  CHECK(read_text(dir / "log.csv").rfind("epoch,loss,accuracy,val_loss", 0) == 0);
  std::string svg = read_text(dir / "history.svg");
  CHECK(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(svg.find("val_loss") != std::string::npos);
  CHECK(std::count(svg.begin(), svg.end(), '<') == std::count(svg.begin(), svg.end(), '>'));
  std::filesystem::remove_all(dir);
}

TEST_CASE("summary lists layers, shapes and parameter totals; errors are clear") {
  using Mnist = Sequential<policy::cpu, Input<28, 28>, Flatten, Dense<128, ReLU>, Dense<10>>;
  Mnist net(64);
  Model model(net);
  std::ostringstream out;
  model.summary(out);
  std::string text = out.str();
  CHECK(text.find("Dense+ReLU") != std::string::npos);
  CHECK(text.find("(None, 128)") != std::string::npos);
  CHECK(text.find("(None, 784)") != std::string::npos);
  CHECK(text.find("Total params: 101770") != std::string::npos);
  CHECK(text.find("Non-trainable params: 0") != std::string::npos);
  Tensor<float> x(shape{10, 28, 28});
  Tensor<std::int64_t> y(shape{10});
  CHECK_THROWS_WITH_AS(model.fit(x, y), doctest::Contains("compile"), kiln::error);
  model.compile(optim::Adam(), loss::cross_entropy{});
  CHECK_THROWS_WITH_AS(model.fit(x, y, {.batch_size = 100}), doctest::Contains("maximum batch"), kiln::error);
  Tensor<float> wrong(shape{10, 27, 28});
  CHECK_THROWS_AS(model.fit(wrong, y), kiln::error);
  Tensor<float> values(shape{10, 10});
  CHECK_THROWS_WITH_AS(model.fit(x, values, {.verbose = 0}), doctest::Contains("integer class labels"), kiln::error);
}

TEST_CASE("progress bar line shows steps, bar and values") {
  std::ostringstream sink;
  train::progress_bar bar(sink, false);
  bar.begin_epoch(1, 2, 10);
  train::logs l;
  l.set("loss", 0.5);
  std::string line = bar.line(5, l, false);
  CHECK(line.rfind(" 5/10 [===============>", 0) == 0);
  CHECK(line.find("ETA") != std::string::npos);
  CHECK(line.find("loss: 0.5000") != std::string::npos);
  CHECK(sink.str() == "Epoch 1/2\n");
}

TEST_CASE("the same Model interface trains a dynamic module") {
  auto train = make_blobs(600, 1), test = make_blobs(300, 2);
  kiln::manual_seed(7);
  auto net = nn::Sequential(nn::Linear(4, 16), nn::ReLU(), nn::Linear(16, 3));
  Model model(net);
  model.compile(optim::Adam(), loss::cross_entropy{}, {metric::accuracy});
  auto history = model.fit(train.x, train.y, {.epochs = 5, .batch_size = 32, .verbose = 0});
  auto after = model.evaluate(test.x, test.y);
  CHECK(after["accuracy"] > 0.85);
  std::ostringstream out;
  model.summary(out);
  CHECK(out.str().find("Linear(in_features=4, out_features=16)") != std::string::npos);
  CHECK(out.str().find("(None, 16)") != std::string::npos);
  CHECK(out.str().find("Total params: 131") != std::string::npos);
  CHECK(model.predict(test.x).shape() == shape{300, 3});
  auto cm = model.confusion_matrix(test.x, test.y);
  CHECK(cm.total() == 300);
  CHECK(cm.accuracy() == doctest::Approx(after["accuracy"]));
}

TEST_CASE("Model::fit gives the same history in static and dynamic mode") {
  auto train = make_blobs(256, 8);
  Net static_net(32, 21);
  kiln::manual_seed(21);
  auto dynamic_net = nn::Sequential(nn::Linear(4, 16), nn::ReLU(), nn::Linear(16, 3));
  Model a(static_net);
  Model b(dynamic_net);
  a.compile(optim::Adam({.lr = 1e-2}), loss::cross_entropy{}, {metric::accuracy});
  b.compile(optim::Adam({.lr = 1e-2}), loss::cross_entropy{}, {metric::accuracy});
  auto ha = a.fit(train.x, train.y, {.epochs = 3, .batch_size = 32, .verbose = 0, .seed = 4});
  auto hb = b.fit(train.x, train.y, {.epochs = 3, .batch_size = 32, .verbose = 0, .seed = 4});
  CHECK(ha.series("loss") == hb.series("loss"));
  CHECK(ha.series("accuracy") == hb.series("accuracy"));
}

TEST_CASE("fit and evaluate refuse data they cannot use") {
  auto train = make_blobs(100, 1);
  Net net(32, 7);
  Model model(net);
  model.compile(optim::Adam({.lr = 1e-2}), loss::cross_entropy{});
  // Fewer labels than inputs once read past the labels' end; more were silently ignored.
  Tensor<std::int64_t> fewer(shape{50}), more(shape{150});
  CHECK_THROWS_WITH_AS(model.fit(train.x, fewer, {.verbose = 0}), doctest::Contains("as many targets as inputs (100)"),
                       kiln::error);
  CHECK_THROWS_AS(model.fit(train.x, more, {.verbose = 0}), kiln::error);
  // No samples: a loss over nothing read as 0, a perfect score to EarlyStopping.
  Tensor<float> no_x(shape{0, 4});
  Tensor<std::int64_t> no_y(shape{0});
  CHECK_THROWS_WITH_AS(model.evaluate(no_x, no_y), doctest::Contains("at least one sample"), kiln::error);
  CHECK_THROWS_AS(model.fit(no_x, no_y, {.verbose = 0}), kiln::error);
  CHECK_THROWS_AS(model.fit(train.x, train.y, {.validation_data = labelled_data{no_x, no_y}, .verbose = 0}),
                  kiln::error);
  CHECK_THROWS_WITH_AS(metric::top_k_accuracy(0), doctest::Contains("k >= 1"), kiln::error);
  // A validation split outside [0, 1), NaN included, was ignored below 0.
  for (double split : {-0.5, std::nan(""), 1.0})
    CHECK_THROWS_WITH_AS(model.fit(train.x, train.y, {.validation_split = split, .verbose = 0}),
                         doctest::Contains("validation_split in [0, 1)"), kiln::error);
}

TEST_CASE("a class label outside the model's outputs is named by its sample, in fit and evaluate") {
  auto data = make_blobs(200, 3);
  data.y[137] = 3;  // the model has 3 outputs
  Net net(32, 7);
  Model model(net);
  model.compile(optim::Adam({.lr = 1e-2}), loss::cross_entropy{});
  // evaluate reads in batches of 64: sample 137 is row 9 of its batch, which the loss alone would have named.
  CHECK_THROWS_WITH_AS(model.evaluate(data.x, data.y, 64),
                       doctest::Contains("expected class labels in [0, 3) for the model's 3 outputs, found 3 for "
                                         "sample 137 of the data set"),
                       kiln::error);
  // fit draws the batches shuffled; the error still names the sample.
  CHECK_THROWS_WITH_AS(model.fit(data.x, data.y, {.batch_size = 32, .verbose = 0}),
                       doctest::Contains("found 3 for sample 137 of the data set"), kiln::error);
  data.y[137] = -1;
  CHECK_THROWS_WITH_AS(model.evaluate(data.x, data.y), doctest::Contains("found -1 for sample 137"), kiln::error);
  // The same in dynamic mode, once the model's output size is known (before, the loss's own check stops it).
  kiln::manual_seed(3);
  auto dynamic_net = nn::Sequential(nn::Linear(4, 16), nn::ReLU(), nn::Linear(16, 3));
  Model dynamic_model(dynamic_net);
  dynamic_model.compile(optim::Adam(), loss::cross_entropy{});
  CHECK_THROWS_AS(dynamic_model.evaluate(data.x, data.y, 64), kiln::error);
  CHECK_THROWS_WITH_AS(dynamic_model.evaluate(data.x, data.y, 64), doctest::Contains("for sample 137"), kiln::error);
}

TEST_CASE("channels-last images are refused by a static model's checks, flat rows and reshapes are not") {
  using Cnn = Sequential<policy::cpu, Input<3, 4, 4>, Conv2D<2, 3>, Flatten, Dense<2>>;
  Cnn net(8, 5);
  Tensor<float> nhwc(shape{8, 4, 4, 3}, 0.25f), nchw(shape{8, 3, 4, 4}, 0.25f), flat(shape{8, 48}, 0.25f);
  Tensor<std::int64_t> labels(shape{8}, {0, 1, 0, 1, 0, 1, 0, 1});
  optim::Adam opt;
  CHECK_THROWS_WITH_AS(net.train_step(nhwc.view(), labels.view(), loss::cross_entropy{}, opt),
                       doctest::Contains("found [8, 4, 4, 3] (the same number of values per sample, in another "
                                         "layout: channels last?"),
                       kiln::error);
  CHECK(std::isfinite(net.train_step(nchw.view(), labels.view(), loss::cross_entropy{}, opt)));
  CHECK(std::isfinite(net.train_step(flat.view(), labels.view(), loss::cross_entropy{}, opt)));
  // Model::fit and evaluate hand the net flat rows, so they check the layout themselves.
  Model model(net);
  model.compile(optim::Adam(), loss::cross_entropy{});
  CHECK_THROWS_WITH_AS(model.fit(nhwc, labels, {.verbose = 0}),
                       doctest::Contains("expected samples of shape [3, 4, 4], found [8, 4, 4, 3] (with the batch "
                                         "first)"),
                       kiln::error);
  CHECK_THROWS_AS(model.evaluate(nhwc, labels), kiln::error);
  CHECK(std::isfinite(model.evaluate(nchw, labels).loss));
  CHECK(std::isfinite(model.evaluate(flat, labels).loss));
  data::tensor_dataset<float, std::int64_t> images_last(nhwc, labels);
  CHECK_THROWS_WITH_AS(model.fit(images_last, {.verbose = 0}), doctest::Contains("channels last?"), kiln::error);
}

TEST_CASE("fit with a step profile trains as without one, in static and dynamic mode") {
  auto train = make_blobs(256, 8);
  auto history_of = [&](auto& net, step_profile* profile) {
    Model model(net);
    model.compile(optim::Adam({.lr = 1e-2}), loss::cross_entropy{}, {metric::accuracy});
    return model.fit(train.x, train.y, {.epochs = 2, .batch_size = 32, .verbose = 0, .seed = 4, .profile = profile});
  };
  Net plain_static(32, 21), profiled_static(32, 21);
  kiln::manual_seed(21);
  auto plain_dynamic = nn::Sequential(nn::Linear(4, 16), nn::ReLU(), nn::Linear(16, 3));
  kiln::manual_seed(21);
  auto profiled_dynamic = nn::Sequential(nn::Linear(4, 16), nn::ReLU(), nn::Linear(16, 3));
  step_profile static_profile, dynamic_profile;
  const auto expected = history_of(plain_static, nullptr);
  const auto found_static = history_of(profiled_static, &static_profile);
  const auto plain_dynamic_history = history_of(plain_dynamic, nullptr);
  const auto found_dynamic = history_of(profiled_dynamic, &dynamic_profile);
  CHECK(found_static.series("loss") == expected.series("loss"));
  CHECK(found_static.series("accuracy") == expected.series("accuracy"));
  CHECK(plain_dynamic_history.series("loss") == expected.series("loss"));
  CHECK(found_dynamic.series("loss") == expected.series("loss"));
  CHECK(found_dynamic.series("accuracy") == expected.series("accuracy"));
  CHECK(static_profile.steps == 16);  // 2 epochs of 8 batches
  CHECK(dynamic_profile.steps == 16);
  CHECK(static_profile.layers.size() == 2);
  CHECK(dynamic_profile.layers.size() == 3);
  CHECK(dynamic_profile.backward_seconds[0] > 0);
  std::ostringstream table;
  print_comparison(table, static_profile, "static", dynamic_profile, "dynamic");
  CHECK(table.str().find("backward, all layers") != std::string::npos);

  // A dynamic model that is not a Sequential has no children to time.
  kiln::manual_seed(5);
  nn::Linear single(4, 3);
  Model model(single);
  model.compile(optim::Adam(), loss::cross_entropy{});
  step_profile unused;
  CHECK_THROWS_WITH_AS(model.fit(train.x, train.y, {.verbose = 0, .profile = &unused}),
                       doctest::Contains("a step profile needs a static model or a dynamic nn::Sequential"),
                       kiln::error);
  // Without one, it trains.
  CHECK(std::isfinite(model.fit(train.x, train.y, {.verbose = 0}).series("loss").back()));
}

TEST_CASE("evaluate leaves a static model in the mode it found it") {
  auto test = make_blobs(40, 2);
  Net net(32, 7);
  Model model(net);
  model.compile(optim::Adam({.lr = 1e-2}), loss::cross_entropy{});
  net.eval();
  model.evaluate(test.x, test.y);
  CHECK_FALSE(net.is_training());
  net.train();
  model.evaluate(test.x, test.y);
  CHECK(net.is_training());
}

TEST_CASE("EarlyStopping's patience counts epochs as Keras does, and a stop after a batch ends the epoch there") {
  auto train = make_blobs(64, 5);
  Net net(32, 1);
  Model model(net);
  model.compile(optim::SGD({.lr = 0.0}), loss::cross_entropy{});
  // The monitored value improves at epoch 0 only: Keras stops at epoch `patience`.
  auto monitored = std::make_shared<train::LambdaCallback>();
  monitored->epoch_end = [](int epoch, train::logs& l, train::training_control&) {
    l.set("m", epoch == 0 ? 1.0 : 2.0);
  };
  for (int patience : {0, 1, 2, 3}) {
    auto stopper = std::make_shared<train::EarlyStopping>(train::EarlyStopping::options{.monitor = "m",
                                                                                       .patience = patience});
    auto history =
        model.fit(train.x, train.y, {.epochs = 10, .batch_size = 16, .callbacks = {monitored, stopper}, .verbose = 0});
    CHECK(stopper->stopped_epoch() == std::max(1, patience));
    CHECK(history.size() == static_cast<std::size_t>(std::max(1, patience) + 1));
  }
  auto stop_now = std::make_shared<train::LambdaCallback>();
  long long batches = 0;
  stop_now->batch_end = [&](long long, const train::logs&, train::training_control& c) {
    ++batches;
    if (batches == 2) c.request_stop();
  };
  auto history = model.fit(train.x, train.y, {.epochs = 3, .batch_size = 16, .callbacks = {stop_now}, .verbose = 0});
  CHECK(batches == 2);
  CHECK(history.size() == 1);
}
