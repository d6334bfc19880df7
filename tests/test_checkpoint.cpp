// Checkpoints: training resumed from one gives exactly the losses of the run that was never interrupted, in both
// modes, with Adam (incl. AMSGrad), SGD with momentum, RMSprop and Adagrad; bad checkpoints are refused without
// changing anything; ModelCheckpoint writes real files.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "kiln/dynamic/nn.hpp"
#include "kiln/io/checkpoint.hpp"
#include "kiln/io/weights.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train.hpp"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// Two dropout layers: a resumed run must also continue both of their generators.
using static_net = Sequential<policy::cpu, Input<6>, Dense<16, Tanh>, Dropout<0.2>, Dense<8, ReLU>, Dropout<0.1>,
                              Dense<3>>;
nn::Sequential dynamic_net(std::uint64_t seed) {
  manual_seed(seed);
  return nn::Sequential(nn::Linear(6, 16), nn::Tanh(), nn::Dropout(0.2f), nn::Linear(16, 8), nn::ReLU(),
                        nn::Dropout(0.1f), nn::Linear(8, 3));
}

fs::path temp_path(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / "kiln_test_checkpoint";
  fs::create_directories(dir);
  return dir / name;
}

struct data_set {
  Tensor<float> x{shape{64, 6}};
  Tensor<std::int64_t> y{shape{64}};
  data_set() {
    random_generator rng(123);
    for (float& v : x.span()) v = rng.normal<float>();
    for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(3));
  }
  // A batch of 8 rows picked by the data generator (the thing a checkpoint must carry to resume the same order).
  void batch(random_generator& rng, Tensor<float>& xb, Tensor<std::int64_t>& yb) const {
    for (index_t r = 0; r < 8; ++r) {
      auto i = static_cast<index_t>(rng.below(64));
      for (index_t c = 0; c < 6; ++c) xb.at(r, c) = x.at(i, c);
      yb[r] = y[i];
    }
  }
};

// Trains steps [first, last) and appends the losses; step_fn(x, y) does one step.
template <class Step>
void train_range(const data_set& d, random_generator& rng, int first, int last, std::vector<float>& losses,
                 Step&& step_fn) {
  Tensor<float> xb(shape{8, 6});
  Tensor<std::int64_t> yb(shape{8});
  for (int s = first; s < last; ++s) {
    d.batch(rng, xb, yb);
    losses.push_back(step_fn(xb, yb));
  }
}

// A resumed run's losses against the uninterrupted run's: the same count, each the same bits.
void check_same_losses(const std::vector<float>& resumed, const std::vector<float>& uninterrupted) {
  REQUIRE(resumed.size() == uninterrupted.size());
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    CAPTURE(i);
    CHECK(resumed[i] == uninterrupted[i]);  // bit for bit
  }
}

// at: the step the checkpoint is saved at (0: before the first step, when the optimizer has no state yet).
template <class Opt, class Options>
void check_static_resume(Options options, int at = 5) {
  const int total = 12;
  data_set d;
  auto path = temp_path("static.ckpt");
  std::vector<float> uninterrupted, resumed;
  {
    static_net net(8, 42);
    Opt opt(options);
    random_generator rng(7);
    train_range(d, rng, 0, total, uninterrupted, [&](auto& x, auto& y) {
      return net.train_step(x.view(), y.view(), loss::cross_entropy{}, opt);
    });
  }
  {
    static_net net(8, 42);
    Opt opt(options);
    random_generator rng(7);
    std::vector<float> first;
    train_range(d, rng, 0, at, first, [&](auto& x, auto& y) {
      return net.train_step(x.view(), y.view(), loss::cross_entropy{}, opt);
    });
    io::save_checkpoint(path, net, opt, {.epoch = 0, .step = at, .generators = {{"data", rng.state()}}});
    resumed = first;
  }
  static_net net(8, 1234);  // different initial weights: all must come from the checkpoint
  Opt opt(options);
  auto state = io::load_checkpoint(path, net, opt);
  CHECK(state.step == at);
  CHECK(opt.steps_taken() == at);
  random_generator rng;
  rng.set_state(state.generator("data"));
  train_range(d, rng, at, total, resumed, [&](auto& x, auto& y) {
    return net.train_step(x.view(), y.view(), loss::cross_entropy{}, opt);
  });
  check_same_losses(resumed, uninterrupted);
}

template <class Opt, class Options>
void check_dynamic_resume(Options options, int at = 5) {
  const int total = 12;
  data_set d;
  auto path = temp_path("dynamic.ckpt");
  auto step = [](nn::Sequential& model, Opt& opt) {
    return [&](auto& x, auto& y) {
      opt.zero_grad();
      auto l = nn::cross_entropy(model(nn::Variable(x)), y.span());
      l.backward();
      opt.step();
      return l.item();
    };
  };
  std::vector<float> uninterrupted, resumed;
  {
    auto model = dynamic_net(42);
    Opt opt(model.parameters(), options);
    random_generator rng(7);
    train_range(d, rng, 0, total, uninterrupted, step(model, opt));
  }
  {
    auto model = dynamic_net(42);
    Opt opt(model.parameters(), options);
    random_generator rng(7);
    train_range(d, rng, 0, at, resumed, step(model, opt));
    io::save_checkpoint(path, model, opt, {.epoch = 0, .step = at, .generators = {{"data", rng.state()}}});
  }
  auto model = dynamic_net(999);
  Opt opt(model.parameters(), options);
  auto state = io::load_checkpoint(path, model, opt);
  random_generator rng;
  rng.set_state(state.generator("data"));
  train_range(d, rng, at, total, resumed, step(model, opt));
  check_same_losses(resumed, uninterrupted);
}

}  // namespace

TEST_CASE("static mode: resuming from a checkpoint reproduces the uninterrupted losses bit for bit") {
  SUBCASE("Adam") { check_static_resume<optim::Adam>(optim::adam_options{.lr = 1e-2}); }
  SUBCASE("AdamW with AMSGrad") { check_static_resume<optim::AdamW>(optim::adamw_options{.lr = 1e-2, .amsgrad = true}); }
  SUBCASE("SGD with momentum") { check_static_resume<optim::SGD>(optim::sgd_options{.lr = 0.05, .momentum = 0.9}); }
  SUBCASE("RMSprop, centered, with momentum") {
    check_static_resume<optim::RMSprop>(optim::rmsprop_options{.lr = 1e-2, .momentum = 0.9, .centered = true});
  }
  SUBCASE("Adagrad with lr_decay") {
    check_static_resume<optim::Adagrad>(
        optim::adagrad_options{.lr = 0.1, .lr_decay = 0.01, .initial_accumulator_value = 0.1});
  }
}

TEST_CASE("dynamic mode: resuming from a checkpoint reproduces the uninterrupted losses bit for bit") {
  SUBCASE("Adam") { check_dynamic_resume<optim::Adam>(optim::adam_options{.lr = 1e-2}); }
  SUBCASE("SGD with Nesterov momentum") {
    check_dynamic_resume<optim::SGD>(optim::sgd_options{.lr = 0.05, .momentum = 0.9, .nesterov = true});
  }
  SUBCASE("RMSprop with momentum and weight decay") {
    check_dynamic_resume<optim::RMSprop>(optim::rmsprop_options{.lr = 1e-2, .weight_decay = 1e-3, .momentum = 0.5});
  }
  SUBCASE("Adagrad with lr_decay") {
    check_dynamic_resume<optim::Adagrad>(optim::adagrad_options{.lr = 0.1, .lr_decay = 0.01});
  }
}

TEST_CASE("a checkpoint saved before the first step (the start of training) resumes exactly") {
  SUBCASE("static Adam") { check_static_resume<optim::Adam>(optim::adam_options{.lr = 1e-2}, 0); }
  SUBCASE("static AdamW") { check_static_resume<optim::AdamW>(optim::adamw_options{.lr = 1e-2}, 0); }
  SUBCASE("static SGD") { check_static_resume<optim::SGD>(optim::sgd_options{.lr = 0.05, .momentum = 0.9}, 0); }
  SUBCASE("dynamic Adam") { check_dynamic_resume<optim::Adam>(optim::adam_options{.lr = 1e-2}, 0); }
  SUBCASE("dynamic AdamW") { check_dynamic_resume<optim::AdamW>(optim::adamw_options{.lr = 1e-2}, 0); }
  SUBCASE("dynamic SGD") { check_dynamic_resume<optim::SGD>(optim::sgd_options{.lr = 0.05, .momentum = 0.9}, 0); }
  SUBCASE("static RMSprop") { check_static_resume<optim::RMSprop>(optim::rmsprop_options{.centered = true}, 0); }
  SUBCASE("dynamic Adagrad") {
    check_dynamic_resume<optim::Adagrad>(optim::adagrad_options{.lr = 0.1, .initial_accumulator_value = 0.1}, 0);
  }
}

TEST_CASE("checkpoints: RMSprop's and Adagrad's state under PyTorch's names, and a state the options need is refused "
          "when missing") {
  static_net net(8, 3);
  optim::RMSprop opt({.momentum = 0.9});
  Tensor<float> x(shape{8, 6}, 0.5f);
  Tensor<std::int64_t> y(shape{8}, 1);
  net.train_step(x.view(), y.view(), loss::cross_entropy{}, opt);
  auto path = temp_path("rmsprop.ckpt");
  io::save_checkpoint(path, net, opt);
  const auto file = io::read_safetensors(path);
  CHECK(*file.meta("optimizer") == "rmsprop");
  CHECK(file.find("optimizer.0.square_avg") != nullptr);
  CHECK(file.find("optimizer.0.momentum_buffer") != nullptr);
  CHECK(file.find("optimizer.0.grad_avg") == nullptr);  // not centered: no such state
  CHECK(file.find("optimizer.step") != nullptr);

  // Loaded into a centered RMSprop, which needs grad_avg after a step: refused, and nothing changes.
  static_net fresh(8, 4);
  const float before = fresh.state_dict()[0].second[0];
  optim::RMSprop centered({.momentum = 0.9, .centered = true});
  CHECK_THROWS_WITH_AS(io::load_checkpoint(path, fresh, centered),
                       doctest::Contains("slot 0 has taken 1 steps but its grad_avg is missing"), error);
  CHECK(!centered.has_parameters());
  CHECK(fresh.state_dict()[0].second[0] == before);
  // Into Adagrad: another kind of optimizer.
  optim::Adagrad adagrad;
  CHECK_THROWS_WITH_AS(io::load_checkpoint(path, fresh, adagrad),
                       doctest::Contains("it holds the state of optimizer 'rmsprop', but it is being loaded into a "
                                         "'adagrad'"),
                       error);

  optim::Adagrad saved_adagrad;
  net.train_step(x.view(), y.view(), loss::cross_entropy{}, saved_adagrad);
  io::save_checkpoint(path, net, saved_adagrad);
  const auto adagrad_file = io::read_safetensors(path);
  CHECK(*adagrad_file.meta("optimizer") == "adagrad");
  CHECK(adagrad_file.find("optimizer.0.sum") != nullptr);
}

TEST_CASE("checkpoints: nonsense counts and learning rates are refused, and a refused load changes nothing") {
  static_net net(8, 3);
  optim::Adam opt({.lr = 0.003});
  Tensor<float> x(shape{8, 6}, 0.5f);
  Tensor<std::int64_t> y(shape{8}, 1);
  net.train_step(x.view(), y.view(), loss::cross_entropy{}, opt);
  auto base = temp_path("base.ckpt");
  io::save_checkpoint(base, net, opt);
  auto with_step = [&](std::int64_t step) {
    auto file = io::read_safetensors(base);
    for (auto& t : file.tensors)
      if (t.name == "optimizer.step")
        for (std::size_t i = 0; i < t.bytes.size(); i += 8) std::memcpy(t.bytes.data() + i, &step, 8);
    return file;
  };
  auto with_meta = [&](const std::string& key, const std::string& value) {
    auto file = io::read_safetensors(base);
    file.set_meta(key, value);
    return file;
  };
  struct bad_case {
    const char* what;
    io::st_file file;
    const char* message;
  };
  const bad_case cases[] = {
      {"step INT64_MAX (step + 1 overflows)", with_step(std::numeric_limits<std::int64_t>::max()), "optimizer.0.step"},
      {"negative step", with_step(-1), "optimizer.0.step"},
      {"lr nan", with_meta("optimizer.lr", "nan"), "finite optimizer.lr"},
      {"lr inf", with_meta("optimizer.lr", "inf"), "finite optimizer.lr"},
      {"negative lr", with_meta("optimizer.lr", "-0.1"), "optimizer.lr >= 0"},
      {"negative steps_taken", with_meta("optimizer.steps_taken", "-5"), "optimizer.steps_taken"},
      {"step past 2^48", with_step((std::int64_t{1} << 48) + 1), "optimizer.0.step in [0, 2^48"},
      {"steps_taken past 2^48", with_meta("optimizer.steps_taken", "281474976710657"), "optimizer.steps_taken in [0"},
      {"generator position past 2^62 (drawing on would wrap)", with_meta("rng.data", "1 2 4611686018427387905"),
       "at most 2^62"},
      {"bad epoch", with_meta("epoch", "notanumber"), "'epoch'"},
      {"scheduler state of three words", with_meta("schedule.lr", "3 inf 0"), "'schedule.lr'"},
      {"scheduler best not a number", with_meta("schedule.lr", "3 best 0 0"), "best metric"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    auto path = temp_path("bad.ckpt");
    io::write_safetensors(path, c.file);
    static_net fresh(8, 4);
    auto before = fresh.state_dict();
    optim::Adam fresh_opt;
    CHECK_THROWS_WITH_AS(io::load_checkpoint(path, fresh, fresh_opt), doctest::Contains(c.message), error);
    CHECK(!fresh_opt.has_parameters());  // not even given the model's parameters
    CHECK(fresh_opt.lr() == optim::adam_options{}.lr);
    CHECK(fresh.state_dict()[0].second[0] == before[0].second[0]);
  }
}

TEST_CASE("checkpoints: user metadata in the checkpoint's own namespaces is refused at save time") {
  static_net net(8, 3);
  optim::Adam opt({.lr = 0.003});
  for (const char* key :
       {"rng.notes", "optimizer", "optimizer.lr", "optimizer.comment", "epoch", "step", "kiln.x", "schedule.lr"}) {
    CAPTURE(key);
    auto path = temp_path("reserved.ckpt");
    fs::remove(path);
    CHECK_THROWS_WITH_AS(io::save_checkpoint(path, net, opt, {.metadata = {{key, "v"}}}),
                         doctest::Contains("namespace"), error);
    CHECK(!fs::exists(path));
  }
  random_generator g(5);
  CHECK_THROWS_WITH_AS(io::save_checkpoint(temp_path("gen.ckpt"), net, opt, {.generators = {{"d", g.state()},
                                                                                            {"d", g.state()}}}),
                       doctest::Contains("'d' twice"), error);
  CHECK_THROWS_WITH_AS(io::save_checkpoint(temp_path("sched.ckpt"), net, opt, {.schedulers = {{"lr", {}}, {"lr", {}}}}),
                       doctest::Contains("'lr' twice"), error);
  // Keys beside the namespaces round-trip, "optimizer_comment" included.
  auto path = temp_path("user_meta.ckpt");
  io::save_checkpoint(path, net, opt, {.metadata = {{"optimizer_comment", "keep me"}, {"note", "n"}}});
  static_net other(8, 4);
  optim::Adam other_opt;
  auto state = io::load_checkpoint(path, other, other_opt);
  REQUIRE(state.meta("optimizer_comment"));
  CHECK(*state.meta("optimizer_comment") == "keep me");
  CHECK(*state.meta("note") == "n");
}

TEST_CASE("checkpoints: metadata, weights readable by load_weights, and refusals that change nothing") {
  static_net net(8, 3);
  optim::Adam opt({.lr = 0.003});
  Tensor<float> x(shape{8, 6}, 0.5f);
  Tensor<std::int64_t> y(shape{8}, 1);
  net.train_step(x.view(), y.view(), loss::cross_entropy{}, opt);
  auto path = temp_path("meta.ckpt");
  io::save_checkpoint(path, net, opt, {.epoch = 3, .step = 17, .metadata = {{"note", "hello"}}});
  auto file = io::read_safetensors(path);
  CHECK(*file.meta("kiln.format") == "checkpoint");
  CHECK(*file.meta("optimizer") == "adam");

  // load_weights reads the weights of a checkpoint.
  static_net other(8, 4);
  io::load_weights(other, path);
  CHECK(other.state_dict()[0].second[0] == net.state_dict()[0].second[0]);

  static_net fresh(8, 5);
  optim::Adam fresh_opt;
  auto state = io::load_checkpoint(path, fresh, fresh_opt);
  CHECK(state.epoch == 3);
  CHECK(state.step == 17);
  CHECK(*state.meta("note") == "hello");
  CHECK(fresh_opt.lr() == 0.003);
  CHECK(fresh_opt.state().at(0).step == 1);

  // The wrong optimizer kind, a different model, or a plain weights file: refused, nothing changed.
  static_net untouched(8, 6);
  auto before = untouched.state_dict();
  optim::SGD sgd;
  CHECK_THROWS_WITH_AS(io::load_checkpoint(path, untouched, sgd), doctest::Contains("optimizer 'adam'"), error);
  using other_net = Sequential<policy::cpu, Input<6>, Dense<16, Tanh>, Dense<3>>;
  other_net wrong(8, 1);
  optim::Adam wrong_opt;
  CHECK_THROWS_WITH_AS(io::load_checkpoint(path, wrong, wrong_opt), doctest::Contains("unexpected tensor"), error);
  auto weights_only = temp_path("weights_only.safetensors");
  io::save_weights(net, weights_only);
  optim::Adam opt2;
  CHECK_THROWS_WITH_AS(io::load_checkpoint(weights_only, untouched, opt2), doctest::Contains("not a kiln checkpoint"),
                       error);
  // A checkpoint without the second dropout layer's generator state.
  CHECK(file.meta("rng.model.0"));
  CHECK(file.meta("rng.model.1"));
  auto missing = file;
  std::erase_if(missing.metadata, [](const auto& entry) { return entry.first == "rng.model.1"; });
  auto missing_path = temp_path("missing_generator.ckpt");
  io::write_safetensors(missing_path, missing);
  optim::Adam opt3;
  CHECK_THROWS_WITH_AS(io::load_checkpoint(missing_path, untouched, opt3), doctest::Contains("'rng.model.1'"), error);
  auto after = untouched.state_dict();
  for (std::size_t i = 0; i < before.size(); ++i)
    for (index_t k = 0; k < before[i].second.numel(); ++k) CHECK(before[i].second[k] == after[i].second[k]);
}

TEST_CASE("ModelCheckpoint writes the best weights to a file (and keeps them in memory)") {
  data_set d;
  static_net net(8, 2);
  Model model(net);
  model.compile(optim::Adam({.lr = 1e-2}), loss::cross_entropy{}, {metric::accuracy});
  auto path = temp_path("best_{epoch}.safetensors");
  auto checkpoint = std::make_shared<train::ModelCheckpoint>(
      train::ModelCheckpoint::options{.monitor = "loss", .save_best_only = true, .path = path.string()});
  model.fit(d.x, d.y, {.epochs = 3, .batch_size = 8, .callbacks = {checkpoint}, .verbose = 0});
  REQUIRE(checkpoint->best_epoch() >= 0);
  REQUIRE(!checkpoint->last_path().empty());
  // "{epoch}" counts from 1, as the progress bar and Keras do; best_epoch() from 0, as on_epoch_end does.
  CHECK(checkpoint->last_path() == temp_path("best_" + std::to_string(checkpoint->best_epoch() + 1) + ".safetensors").string());
  static_net loaded(8, 77);
  io::load_weights(loaded, checkpoint->last_path());
  auto a = loaded.state_dict();
  const auto& b = checkpoint->best_weights();
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    for (index_t k = 0; k < a[i].second.numel(); ++k) CHECK(a[i].second[k] == b[i].second[k]);
  CHECK(*io::read_safetensors(checkpoint->last_path()).meta("epoch") == std::to_string(checkpoint->best_epoch() + 1));
}

TEST_CASE("ModelCheckpoint by default writes every epoch, as Keras, and still keeps the best in memory") {
  data_set d;
  static_net net(8, 2);
  Model model(net);
  model.compile(optim::SGD({.lr = 5.0}), loss::cross_entropy{});  // a rate this large makes the loss jump about
  const auto dir = temp_path("every_epoch");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto checkpoint = std::make_shared<train::ModelCheckpoint>(
      train::ModelCheckpoint::options{.monitor = "loss", .path = (dir / "e{epoch}.safetensors").string()});
  auto history = model.fit(d.x, d.y, {.epochs = 4, .batch_size = 8, .callbacks = {checkpoint}, .verbose = 0});
  for (int e = 1; e <= 4; ++e) CHECK(std::filesystem::exists(dir / ("e" + std::to_string(e) + ".safetensors")));
  CHECK(!std::filesystem::exists(dir / "e0.safetensors"));
  CHECK(checkpoint->last_path() == (dir / "e4.safetensors").string());
  // The last file holds the last epoch's weights: the model's now.
  static_net loaded(8, 77);
  io::load_weights(loaded, checkpoint->last_path());
  const auto a = loaded.state_dict(), now = net.state_dict();
  for (std::size_t i = 0; i < a.size(); ++i)
    for (index_t k = 0; k < a[i].second.numel(); ++k) CHECK(a[i].second[k] == now[i].second[k]);
  // In memory: the epoch of the lowest loss.
  const auto losses = history.series("loss");
  const auto best = std::min_element(losses.begin(), losses.end()) - losses.begin();
  CHECK(checkpoint->best_epoch() == best);
}

namespace {

void check_scheduled_resume() {
  const int total = 12, at = 5;
  data_set d;
  auto path = temp_path("scheduled.ckpt");
  // A warm-up then a cosine, stepped after every training step.
  auto schedule_for = [](optim::SGD& opt) {
    return optim::SequentialLR(opt, {optim::LinearLR(opt, {.start_factor = 0.2, .total_iters = 3}),
                                     optim::CosineAnnealingLR(opt, {.t_max = 9, .eta_min = 0.01})},
                               {3});
  };
  auto step = [](nn::Sequential& model, optim::SGD& opt, optim::lr_scheduler& schedule) {
    return [&](auto& x, auto& y) {
      opt.zero_grad();
      auto l = nn::cross_entropy(model(nn::Variable(x)), y.span());
      l.backward();
      opt.step();
      schedule.step();
      return l.item();
    };
  };
  const optim::sgd_options options{.lr = 0.1, .momentum = 0.9};
  std::vector<float> uninterrupted, resumed;
  {
    auto model = dynamic_net(42);
    optim::SGD opt(model.parameters(), options);
    auto schedule = schedule_for(opt);
    random_generator rng(7);
    train_range(d, rng, 0, total, uninterrupted, step(model, opt, schedule));
  }
  {
    auto model = dynamic_net(42);
    optim::SGD opt(model.parameters(), options);
    auto schedule = schedule_for(opt);
    optim::ReduceLROnPlateau plateau(opt);  // never stepped: its best is still +infinity
    random_generator rng(7);
    train_range(d, rng, 0, at, resumed, step(model, opt, schedule));
    io::save_checkpoint(path, model, opt,
                        {.generators = {{"data", rng.state()}},
                         .schedulers = {{"lr", schedule.state()}, {"plateau", plateau.state()}}});
  }
  auto model = dynamic_net(999);
  optim::SGD opt(model.parameters(), options);
  auto schedule = schedule_for(opt);
  auto state = io::load_checkpoint(path, model, opt);
  schedule.restore(state.scheduler("lr"));
  CHECK(schedule.last_epoch() == at);
  CHECK(state.scheduler("plateau").best == std::numeric_limits<double>::infinity());
  CHECK_THROWS_WITH_AS(state.scheduler("other"), doctest::Contains("'other'"), error);
  random_generator rng;
  rng.set_state(state.generator("data"));
  train_range(d, rng, at, total, resumed, step(model, opt, schedule));
  check_same_losses(resumed, uninterrupted);
}

}  // namespace

TEST_CASE("a learning-rate scheduler saved in a checkpoint resumes its schedule: the losses match, bit for bit") {
  check_scheduled_resume();
}
