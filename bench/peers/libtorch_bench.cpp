// LibTorch (C++) peer: the same workloads as common.py / torch_bench.py, same data, same initial weights,
// same RESULT lines. Built by bench/peers/setup into bench/peers/build/libtorch_bench.
//
//   libtorch_bench [--workload NAME|all] [--threads N] [--quick] [--data DIR] [--reps R] [--steps S]
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <vector>
#include <sys/stat.h>

namespace {

// ---------------------------------------------------------------- deterministic numbers (see common.py)
constexpr uint64_t S_REG_X = 1, S_REG_Y = 2, S_WIDE_X = 3, S_WIDE_Y = 4, S_TINY_X = 5, S_SHUFFLE = 6, S_LAYER0 = 100;

uint64_t splitmix(uint64_t stream, uint64_t i) {
  uint64_t z = (stream << 32) + i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double uniform(uint64_t stream, uint64_t i) { return double(splitmix(stream, i) >> 11) * 0x1p-53; }

torch::Tensor normal(uint64_t stream, int64_t rows, int64_t cols) {
  auto t = torch::empty({rows, cols});
  float* p = t.data_ptr<float>();
  for (int64_t k = 0; k < rows * cols; ++k) {
    double u1 = uniform(stream, 2 * k), u2 = uniform(stream, 2 * k + 1);
    p[k] = float(std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * M_PI * u2));
  }
  return t;
}

int workload_offset(const std::string& w) {
  return w == "seed_regression" ? 0 : w == "mnist_mlp" ? 10 : w == "wide_mlp" ? 20 : w == "tiny_op" ? 30
         : w == "mnist_cnn" ? 40 : w == "lstm" ? 50 : w == "resnet" ? 60 : 70;
}

std::vector<int64_t> layer_sizes(const std::string& w) {
  if (w == "seed_regression") return {100, 10, 1};
  if (w == "mnist_mlp") return {784, 128, 10};
  if (w == "wide_mlp") return {784, 1024, 1024, 10};
  return {8, 8};
}

torch::nn::Linear make_linear(const std::string& w, int layer, int64_t in, int64_t out) {
  torch::nn::Linear lin(in, out);
  double bound = 1.0 / std::sqrt(double(in));
  uint64_t s = S_LAYER0 + workload_offset(w) + 2 * layer;
  torch::NoGradGuard ng;
  float* wp = lin->weight.data_ptr<float>();
  for (int64_t k = 0; k < in * out; ++k) wp[k] = float((2.0 * uniform(s, k) - 1.0) * bound);
  float* bp = lin->bias.data_ptr<float>();
  for (int64_t k = 0; k < out; ++k) bp[k] = float((2.0 * uniform(s + 1, k) - 1.0) * bound);
  return lin;
}

torch::nn::Sequential build(const std::string& w) {
  auto sz = layer_sizes(w);
  torch::nn::Sequential seq;
  for (size_t k = 0; k + 1 < sz.size(); ++k) {
    seq->push_back(make_linear(w, int(k), sz[k], sz[k + 1]));
    if (k + 2 < sz.size()) seq->push_back(torch::nn::ReLU());
  }
  return seq;
}

// mnist_cnn, lstm and resnet (common.init_tensors): parameter tensor k, in parameters() order, is U(+-bound) from
// stream S_LAYER0 + offset + k, with PyTorch's default bounds: 1/sqrt(fan_in) for Conv2d and Linear (a bias takes its
// weight's), 1/sqrt(hidden) for every LSTM tensor; a BatchNorm's weight and bias (`batch_norm` set for tensor k) stay
// PyTorch's 1 and 0.
void init_from_streams(const std::string& w, const std::vector<torch::Tensor>& params,
                       const std::vector<bool>& batch_norm = {}) {
  torch::NoGradGuard ng;
  double bound = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const auto& p = params[k];
    if (k < batch_norm.size() && batch_norm[k]) continue;
    if (w == "lstm") bound = 1.0 / std::sqrt(128.0);
    else if (p.dim() > 1) bound = 1.0 / std::sqrt(double(p.numel() / p.size(0)));
    uint64_t s = S_LAYER0 + workload_offset(w) + k;
    float* d = p.data_ptr<float>();
    for (int64_t i = 0; i < p.numel(); ++i) d[i] = float((2.0 * uniform(s, uint64_t(i)) - 1.0) * bound);
  }
}

// mnist_cnn: Conv2d(1,32,3) - ReLU - Conv2d(32,64,3) - ReLU - MaxPool 2 - Flatten (9216) - Linear(9216,128) - ReLU -
// Linear(128,10), on 1x28x28 images.
torch::nn::Sequential build_cnn() {
  namespace nn = torch::nn;
  nn::Sequential seq(nn::Conv2d(nn::Conv2dOptions(1, 32, 3)), nn::ReLU(), nn::Conv2d(nn::Conv2dOptions(32, 64, 3)),
                     nn::ReLU(), nn::MaxPool2d(nn::MaxPool2dOptions(2)), nn::Flatten(), nn::Linear(9216, 128),
                     nn::ReLU(), nn::Linear(128, 10));
  init_from_streams("mnist_cnn", seq->parameters());
  return seq;
}

// resnet's residual block (torch_bench.BasicBlock): relu(body(x) + shortcut(x)), the body Conv 3x3 - BatchNorm -
// ReLU - Conv 3x3 - BatchNorm (the first convolution with the block's stride), the shortcut the identity or, where
// the block changes the shape, a 1x1 convolution with its stride and a BatchNorm. No convolution has a bias.
struct BasicBlockImpl : torch::nn::Module {
  torch::nn::Sequential body, shortcut{nullptr};
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride) {
    namespace nn = torch::nn;
    body = register_module(
        "body", nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)),
                               nn::BatchNorm2d(out), nn::ReLU(),
                               nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)),
                               nn::BatchNorm2d(out)));
    if (stride != 1 || in != out)
      shortcut = register_module(
          "shortcut",
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)), nn::BatchNorm2d(out)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::relu(body->forward(x) + (shortcut ? shortcut->forward(x) : x));
  }
};
TORCH_MODULE(BasicBlock);

// resnet (examples/resnet_fashion's network): Conv2d(1, 16, 3, padding 1) - BatchNorm - ReLU, the blocks (16, 1),
// (16, 1), (32, 2), (32, 1), (64, 2), (64, 1) as (channels, stride), global average pooling, Linear(64, 10).
torch::nn::Sequential build_resnet() {
  namespace nn = torch::nn;
  nn::Sequential seq(nn::Conv2d(nn::Conv2dOptions(1, 16, 3).padding(1).bias(false)), nn::BatchNorm2d(16), nn::ReLU());
  int64_t in = 16;
  const std::pair<int64_t, int64_t> blocks[] = {{16, 1}, {16, 1}, {32, 2}, {32, 1}, {64, 2}, {64, 1}};
  for (auto [out, stride] : blocks) {
    seq->push_back(BasicBlock(in, out, stride));
    in = out;
  }
  seq->push_back(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)));
  seq->push_back(nn::Flatten());
  seq->push_back(nn::Linear(64, 10));
  std::vector<bool> batch_norm;
  for (const auto& module : seq->modules(/*include_self=*/false))
    if (module->as<nn::BatchNorm2d>()) batch_norm.insert(batch_norm.end(), {true, true});
    else batch_norm.insert(batch_norm.end(), module->parameters(/*recurse=*/false).size(), false);
  init_from_streams("resnet", seq->parameters(), batch_norm);
  return seq;
}

// lstm: LSTM(28, 128, batch_first) over the image's 28 rows, its final hidden state into Linear(128, 10).
struct LstmNetImpl : torch::nn::Module {
  torch::nn::LSTM lstm{torch::nn::LSTMOptions(28, 128).batch_first(true)};
  torch::nn::Linear fc{128, 10};
  LstmNetImpl() {
    register_module("lstm", lstm);
    register_module("fc", fc);
    init_from_streams("lstm", parameters());
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = std::get<0>(std::get<1>(lstm->forward(x)));  // [layers, batch, 128]
    return fc->forward(h.select(0, -1));
  }
};
TORCH_MODULE(LstmNet);

// transformer (torch_bench.TinyGPT, examples/tiny_gpt's model): sizes as common.py's.
constexpr int64_t VOCAB = 256, CONTEXT = 128, WIDTH = 128, HEADS = 4, FEEDFORWARD = 512, LAYERS = 4, TEXT_BATCH = 32,
                  TEXT_BATCHES = 8;

// One pre-norm encoder layer, PyTorch's nn.TransformerEncoderLayer(norm_first=True, activation="gelu", dropout=0):
// x = x + self_attn(norm1(x)); x = x + linear2(gelu(linear1(norm2(x)))). LibTorch 1.13's TransformerEncoderLayer has
// no norm_first, so the block is written from its modules, with PyTorch's names. Sequence first ([L, N, d]), as
// LibTorch 1.13's MultiheadAttention takes its input.
struct PreNormLayerImpl : torch::nn::Module {
  torch::nn::MultiheadAttention self_attn{nullptr};
  torch::nn::Linear linear1{nullptr}, linear2{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  PreNormLayerImpl() {
    namespace nn = torch::nn;
    self_attn = register_module("self_attn", nn::MultiheadAttention(nn::MultiheadAttentionOptions(WIDTH, HEADS)));
    linear1 = register_module("linear1", nn::Linear(WIDTH, FEEDFORWARD));
    linear2 = register_module("linear2", nn::Linear(FEEDFORWARD, WIDTH));
    norm1 = register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({WIDTH}).eps(1e-5)));
    norm2 = register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({WIDTH}).eps(1e-5)));
  }
  // mask: [L, L], -inf above the diagonal (the causal mask), added to the attention's scores.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask) {
    auto h = norm1->forward(x);
    auto y = x + std::get<0>(self_attn->forward(h, h, h, {}, /*need_weights=*/false, mask));
    return y + linear2->forward(torch::gelu(linear1->forward(norm2->forward(y))));
  }
  // The parameters in nn.TransformerEncoderLayer's parameters() order.
  std::vector<torch::Tensor> ordered() const {
    return {self_attn->in_proj_weight, self_attn->in_proj_bias, self_attn->out_proj->weight,
            self_attn->out_proj->bias, linear1->weight, linear1->bias, linear2->weight, linear2->bias,
            norm1->weight, norm1->bias, norm2->weight, norm2->bias};
  }
};
TORCH_MODULE(PreNormLayer);

// ids [N, L] -> Embedding(256, 128) + a learned position table [128, 128] -> 4 PreNormLayers under the causal mask ->
// LayerNorm -> Linear(128, 256): next-token logits [L, N, 256] (sequence first; the loss averages over every position,
// so the order does not matter to it). Initial weights as common.transformer_param_shapes: tensor k of ordered() from
// stream S_LAYER0 + 70 + k.
struct TinyGptImpl : torch::nn::Module {
  torch::nn::Embedding tokens{nullptr};
  torch::Tensor positions, mask;
  std::vector<PreNormLayer> layers;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
  TinyGptImpl() {
    namespace nn = torch::nn;
    tokens = register_module("tokens", nn::Embedding(VOCAB, WIDTH));
    positions = register_parameter("positions", torch::zeros({CONTEXT, WIDTH}));
    for (int64_t i = 0; i < LAYERS; ++i) layers.push_back(register_module("layer" + std::to_string(i), PreNormLayer()));
    norm = register_module("norm", nn::LayerNorm(nn::LayerNormOptions({WIDTH}).eps(1e-5)));
    head = register_module("head", nn::Linear(WIDTH, VOCAB));
    mask = register_buffer("mask", torch::full({CONTEXT, CONTEXT}, -INFINITY).triu(1));
    init();
  }
  torch::Tensor forward(const torch::Tensor& ids) {
    const int64_t L = ids.size(1);
    auto x = tokens->forward(ids.t()) + positions.slice(0, 0, L).unsqueeze(1);
    auto m = mask.slice(0, 0, L).slice(1, 0, L);
    for (auto& layer : layers) x = layer->forward(x, m);
    return head->forward(norm->forward(x));
  }
  // Every parameter, in torch_bench.TinyGPT's parameters() order.
  std::vector<torch::Tensor> ordered() const {
    std::vector<torch::Tensor> p = {tokens->weight, positions};
    for (const auto& layer : layers) {
      auto q = layer->ordered();
      p.insert(p.end(), q.begin(), q.end());
    }
    p.insert(p.end(), {norm->weight, norm->bias, head->weight, head->bias});
    return p;
  }
  // common.transformer_param_shapes' distributions: N(0, 1) and N(0, 0.02) for the two tables (common.normal: float
  // Box-Muller values times the deviation in float), U(+-bound) for the others, or ones and zeros.
  void init() {
    torch::NoGradGuard ng;
    const double d = double(WIDTH), f = double(FEEDFORWARD);
    // 0: uniform(bound), 1: normal(bound), 2: ones, 3: zeros
    std::vector<std::pair<int, double>> spec = {{1, 1.0}, {1, 0.02}};
    for (int64_t i = 0; i < LAYERS; ++i)
      spec.insert(spec.end(), {{0, std::sqrt(6.0 / (d + 3 * d))}, {3, 0}, {0, 1 / std::sqrt(d)}, {3, 0},
                               {0, 1 / std::sqrt(d)}, {0, 1 / std::sqrt(d)}, {0, 1 / std::sqrt(f)},
                               {0, 1 / std::sqrt(f)}, {2, 0}, {3, 0}, {2, 0}, {3, 0}});
    spec.insert(spec.end(), {{2, 0}, {3, 0}, {0, 1 / std::sqrt(d)}, {0, 1 / std::sqrt(d)}});
    const auto params = ordered();
    for (size_t k = 0; k < params.size(); ++k) {
      const uint64_t s = S_LAYER0 + workload_offset("transformer") + k;
      float* p = params[k].data_ptr<float>();
      const auto [kind, bound] = spec[k];
      for (int64_t i = 0; i < params[k].numel(); ++i) {
        const auto u = uint64_t(i);
        if (kind == 0) {
          p[i] = float((2.0 * uniform(s, u) - 1.0) * bound);
        } else if (kind == 1) {
          const double u1 = uniform(s, 2 * u), u2 = uniform(s, 2 * u + 1);
          p[i] = float(std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * M_PI * u2)) * float(bound);
        } else {
          p[i] = kind == 2 ? 1.0f : 0.0f;
        }
      }
    }
  }
};
TORCH_MODULE(TinyGpt);

std::vector<int64_t> permutation(int64_t n) {
  std::vector<uint64_t> key(n);
  for (int64_t i = 0; i < n; ++i) key[i] = splitmix(S_SHUFFLE, i);
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return key[a] < key[b]; });
  return idx;
}

// ---------------------------------------------------------------- MNIST
bool exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

// The folder of MNIST's IDX files (subdir "mnist": a candidate's mnist/ or the candidate itself) or of
// Fashion-MNIST's (subdir "fashion-mnist": a candidate's fashion-mnist/ only), as common.find_data.
std::string find_data(const std::string& explicit_dir, const std::string& subdir = "mnist") {
  std::vector<std::string> c;
  if (!explicit_dir.empty()) c.push_back(explicit_dir);
  if (const char* e = std::getenv("KILN_DATA")) c.push_back(e);
  for (const char* d : {"./data", "../shared/data", "/work/shared/data"}) c.push_back(d);
  for (auto& d : c) {
    if (exists(d + "/" + subdir + "/train-images-idx3-ubyte.gz")) return d + "/" + subdir;
    if (subdir == "mnist" && exists(d + "/train-images-idx3-ubyte.gz")) return d;
  }
  std::fprintf(stderr, "%s not found (tried --data, $KILN_DATA, ./data, ../shared/data, /work/shared/data, each with a "
               "%s/ subfolder)\n", subdir == "mnist" ? "MNIST" : "Fashion-MNIST", subdir.c_str());
  std::exit(2);
}

std::vector<uint8_t> gunzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) { std::fprintf(stderr, "cannot open %s\n", path.c_str()); std::exit(2); }
  std::vector<uint8_t> out;
  std::vector<uint8_t> buf(1 << 20);
  int n;
  while ((n = gzread(f, buf.data(), unsigned(buf.size()))) > 0) out.insert(out.end(), buf.begin(), buf.begin() + n);
  gzclose(f);
  return out;
}

uint32_t be32(const uint8_t* p) { return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3]; }

// ---------------------------------------------------------------- options and output
struct Args {
  std::string workload = "all", data;
  int threads = 1, reps = -1, steps = -1;
  bool quick = false;
} A;

std::string version() { return TORCH_VERSION; }

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void result(const std::string& wl, const std::vector<double>& t, double data_us, double loss, int decimals = 2) {
  char d[64];
  if (data_us >= 0) std::snprintf(d, sizeof d, "%.2f", data_us); else std::snprintf(d, sizeof d, "-1");
  std::printf("RESULT bench=peer system=libtorch version=%s workload=%s threads=%d step_us=%.*f min_us=%.*f "
              "max_us=%.*f data_us=%s final_loss=%.6g status=ok\n",
              version().c_str(), wl.c_str(), A.threads, decimals, median(t), decimals,
              *std::min_element(t.begin(), t.end()), decimals, *std::max_element(t.begin(), t.end()), d, loss);
  std::fflush(stdout);
}

int default_steps(const std::string& w) {
  if (w == "seed_regression") return 200;
  if (w == "wide_mlp") return A.quick ? 10 : 20;
  if (w == "mnist_cnn" || w == "resnet") return A.quick ? 3 : 10;
  if (w == "lstm") return A.quick ? 10 : 40;
  if (w == "transformer") return A.quick ? 3 : 10;
  return A.quick ? 2000 : 10000;
}

std::vector<double> timed(const std::function<void()>& step, int steps, int warmup) {
  for (int i = 0; i < warmup; ++i) step();
  std::vector<double> t;
  for (int r = 0; r < A.reps; ++r) {
    double t0 = now();
    for (int i = 0; i < steps; ++i) step();
    t.push_back((now() - t0) / steps * 1e6);
  }
  return t;
}

void run_fixed(const std::string& wl, torch::Tensor x, torch::Tensor y, bool mse) {
  auto model = build(wl);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  torch::Tensor loss;
  auto step = [&] {
    opt.zero_grad();
    auto out = model->forward(x);
    loss = mse ? torch::mse_loss(out, y) : torch::nn::functional::cross_entropy(out, y);
    loss.backward();
    opt.step();
  };
  int steps = A.steps > 0 ? A.steps : default_steps(wl);
  auto t = timed(step, steps, 10);
  result(wl, t, -1, loss.item<float>());
}

// The training set: images [n, 784] scaled to [0, 1], labels [n] int64, and the seeded epoch order.
struct Mnist {
  torch::Tensor X, Y, perm;
  int64_t n;
};

Mnist load_mnist(const std::string& subdir = "mnist") {
  std::string dir = find_data(A.data, subdir);
  auto img = gunzip(dir + "/train-images-idx3-ubyte.gz");
  auto lab = gunzip(dir + "/train-labels-idx1-ubyte.gz");
  if (be32(img.data()) != 2051 || be32(lab.data()) != 2049) { std::fprintf(stderr, "bad IDX magic\n"); std::exit(2); }
  int64_t n = be32(img.data() + 4), rc = int64_t(be32(img.data() + 8)) * be32(img.data() + 12);
  auto X = torch::from_blob(img.data() + 16, {n, rc}, torch::kUInt8).to(torch::kFloat32).div_(255.0);
  auto Y = torch::from_blob(lab.data() + 8, {n}, torch::kUInt8).to(torch::kInt64);
  auto pv = permutation(n);
  auto perm = torch::from_blob(pv.data(), {n}, torch::kInt64).clone();
  return {X, Y, perm, n};
}

void run_mnist() {
  auto [X, Y, perm, n] = load_mnist();

  auto model = build("mnist_mlp");
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  const int64_t bs = 64;
  std::vector<double> dt, st;
  torch::Tensor loss;
  double te = now();
  for (int64_t s = 0; s < n; s += bs) {
    double t0 = now();
    auto idx = perm.slice(0, s, std::min(s + bs, n));
    auto xb = X.index_select(0, idx), yb = Y.index_select(0, idx);
    double t1 = now();
    opt.zero_grad();
    loss = torch::nn::functional::cross_entropy(model->forward(xb), yb);
    loss.backward();
    opt.step();
    double t2 = now();
    dt.push_back((t1 - t0) * 1e6);
    st.push_back((t2 - t1) * 1e6);
  }
  double epoch = now() - te;
  double sum_s = std::accumulate(st.begin(), st.end(), 0.0), sum_d = std::accumulate(dt.begin(), dt.end(), 0.0);
  std::printf("INFO system=libtorch version=%s workload=mnist_mlp threads=%d epoch_s=%.3f steps=%zu mean_step_us=%.1f "
              "mean_data_us=%.1f samples=%lld\n", version().c_str(), A.threads, epoch, st.size(), sum_s / st.size(),
              sum_d / dt.size(), (long long)n);
  result("mnist_mlp", st, median(dt), loss.item<float>());
}

// Times a workload as bench/ladder times mnist_cnn, lstm, resnet and transformer: batch(b) makes batch b the current
// one, step() trains on it; min(steps, 20) warm-up steps over batches 0, 1, ... cycled through nb, then reps of `steps`
// steps from batch 0. step_us is the median over repetitions of the mean step time; batch() is timed apart (data_us,
// median per step).
void time_cycled(const std::string& wl, int64_t nb, const std::function<void(int64_t)>& batch,
                 const std::function<void()>& step, const torch::Tensor& loss) {
  const int steps = A.steps > 0 ? A.steps : default_steps(wl), warmup = std::min(steps, 20);
  for (int i = 0; i < warmup; ++i) {
    batch(i % nb);
    step();
  }
  std::vector<double> t, dt;
  for (int r = 0; r < A.reps; ++r) {
    double total = 0;
    for (int i = 0; i < steps; ++i) {
      double t0 = now();
      batch(i % nb);
      double t1 = now();
      step();
      total += now() - t1;
      dt.push_back((t1 - t0) * 1e6);
    }
    t.push_back(total / steps * 1e6);
  }
  std::printf("INFO system=libtorch version=%s workload=%s threads=%d warmup_steps=%d steps=%d reps=%d batches=%lld "
              "mean_data_us=%.1f\n", version().c_str(), wl.c_str(), A.threads, warmup, steps, A.reps, (long long)nb,
              std::accumulate(dt.begin(), dt.end(), 0.0) / double(dt.size()));
  result(wl, t, median(dt), loss.item<float>());
}

// mnist_cnn, lstm and resnet: the first nb batches of 64 of the seeded epoch, cycled, normalised with the data set's
// mean and deviation (MNIST's; Fashion-MNIST's for resnet); each batch an index_select of the preloaded set.
template <class Model>
void run_batches(const std::string& wl, Model model, std::vector<int64_t> sample_shape) {
  const bool fashion = wl == "resnet";
  auto data = load_mnist(fashion ? "fashion-mnist" : "mnist");
  sample_shape.insert(sample_shape.begin(), data.n);
  auto X = fashion ? data.X.sub_(0.2860).div_(0.3530).view(sample_shape)
                   : data.X.sub_(0.1307).div_(0.3081).view(sample_shape);
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-3));
  const int64_t bs = 64, nb = wl == "lstm" ? 64 : 32;
  torch::Tensor xb, yb, loss;
  auto batch = [&](int64_t b) {
    auto idx = data.perm.slice(0, b * bs, (b + 1) * bs);
    xb = X.index_select(0, idx);
    yb = data.Y.index_select(0, idx);
  };
  auto step = [&] {
    opt.zero_grad();
    loss = torch::nn::functional::cross_entropy(model->forward(xb), yb);
    loss.backward();
    opt.step();
  };
  time_cycled(wl, nb, batch, step, loss);
}

// ---------------------------------------------------------------- text (common.load_text, common.text_batches)
std::string find_text(const std::string& explicit_dir) {
  std::vector<std::string> c;
  if (!explicit_dir.empty()) c.push_back(explicit_dir);
  if (const char* e = std::getenv("KILN_DATA")) c.push_back(e);
  for (const char* d : {"./data", "../shared/data", "/work/shared/data"}) c.push_back(d);
  for (auto& d : c)
    if (std::filesystem::is_directory(d + "/text")) return d + "/text";
  std::fprintf(stderr, "text corpus not found (tried --data, $KILN_DATA, ./data, ../shared/data, /work/shared/data, "
               "each with a text/ subfolder)\n");
  std::exit(2);
}

// Where a file's held-out tenth begins, as kiln::data::validation_cut: the first entry start (the byte after a line
// "%") at or after the fraction's byte, else the last one before it, else the fraction's byte.
size_t validation_cut(const std::vector<uint8_t>& t, double fraction = 0.1) {
  const size_t n = t.size(), at = std::min(n, size_t(double(n) * (1.0 - fraction)));
  auto entry_starts_at = [&](size_t i) {
    if (i >= 3) return t[i - 3] == '\n' && t[i - 2] == '%' && t[i - 1] == '\n';
    return i == 2 && t[0] == '%' && t[1] == '\n';
  };
  for (size_t i = at; i < n; ++i)
    if (entry_starts_at(i)) return i;
  for (size_t i = at; i-- > 2;)
    if (entry_starts_at(i)) return i;
  return at;
}

// The training text as kiln::data::load_text_corpus gives it: every regular, non-hidden file of the corpus folder in
// name order (gzread reads plain and gzip files alike), each up to its validation cut, joined.
std::vector<uint8_t> load_text() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(find_text(A.data)))
    if (e.is_regular_file() && e.path().filename().string().rfind('.', 0) != 0) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<uint8_t> text;
  for (const auto& f : files) {
    auto bytes = gunzip(f);
    text.insert(text.end(), bytes.begin(), bytes.begin() + std::ptrdiff_t(validation_cut(bytes)));
  }
  return text;
}

// transformer: the first TEXT_BATCHES batches of TEXT_BATCH windows of CONTEXT tokens of the training text, side by
// side and in order, cycled; next-token targets; AdamW(2e-3, weight decay 0.01); the mean cross-entropy over every
// position. Each batch is a slice of the preloaded windows.
void run_transformer() {
  auto text = load_text();
  const int64_t n = TEXT_BATCHES * TEXT_BATCH;
  if (int64_t(text.size()) < n * CONTEXT + 1) {
    std::fprintf(stderr, "text corpus: %zu training bytes, fewer than the %lld needed\n", text.size(),
                 (long long)(n * CONTEXT + 1));
    std::exit(2);
  }
  auto all = torch::from_blob(text.data(), {n * CONTEXT + 1}, torch::kUInt8).to(torch::kInt64);
  auto X = all.slice(0, 0, n * CONTEXT).view({n, CONTEXT}), Y = all.slice(0, 1, n * CONTEXT + 1).view({n, CONTEXT});
  TinyGpt model;
  torch::optim::AdamW opt(model->ordered(), torch::optim::AdamWOptions(2e-3).weight_decay(0.01));
  torch::Tensor xb, yb, loss;
  auto batch = [&](int64_t b) {
    xb = X.slice(0, b * TEXT_BATCH, (b + 1) * TEXT_BATCH);
    yb = Y.slice(0, b * TEXT_BATCH, (b + 1) * TEXT_BATCH);
  };
  auto step = [&] {
    opt.zero_grad();
    // logits are sequence first ([L, N, 256]): the targets too, so that each position meets its own
    loss = torch::nn::functional::cross_entropy(model->forward(xb).reshape({-1, VOCAB}), yb.t().reshape({-1}));
    loss.backward();
    opt.step();
  };
  time_cycled("transformer", TEXT_BATCHES, batch, step, loss);
}

void run_tiny() {
  auto lin = make_linear("tiny_op", 0, 8, 8);
  auto x = normal(S_TINY_X, 1, 8);
  torch::Tensor out;
  int steps = A.steps > 0 ? A.steps : default_steps("tiny_op");
  auto t = timed([&] { out = lin->forward(x); }, steps, 50);
  result("tiny_op_forward", t, -1, out.sum().item<float>(), 3);
  t = timed([&] { out = lin->forward(x).sum(); out.backward(); }, steps, 50);
  result("tiny_op_step", t, -1, out.item<float>(), 3);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); std::exit(2); } return std::string(argv[++i]); };
    if (a == "--workload") A.workload = next();
    else if (a == "--threads") A.threads = std::stoi(next());
    else if (a == "--quick") A.quick = true;
    else if (a == "--data") A.data = next();
    else if (a == "--reps") A.reps = std::stoi(next());
    else if (a == "--steps") A.steps = std::stoi(next());
    else { std::fprintf(stderr, "usage: %s [--workload NAME|all] [--threads N] [--quick] [--data DIR] [--reps R] [--steps S]\n", argv[0]); return 2; }
  }
  if (A.reps < 0) A.reps = A.quick ? 5 : 7;
  // OMP_NUM_THREADS/MKL_NUM_THREADS are also set by run_all before the process starts.
  at::set_num_threads(A.threads);
  at::set_num_interop_threads(A.threads);
  torch::manual_seed(0);
  std::vector<std::string> wls = {"seed_regression", "mnist_mlp", "wide_mlp", "tiny_op", "mnist_cnn", "lstm", "resnet",
                                  "transformer"};
  if (A.workload != "all") {
    if (std::find(wls.begin(), wls.end(), A.workload) == wls.end()) { std::fprintf(stderr, "unknown workload %s\n", A.workload.c_str()); return 2; }
    wls = {A.workload};
  }
  for (auto& w : wls) {
    if (w == "seed_regression") run_fixed(w, normal(S_REG_X, 1000, 100), normal(S_REG_Y, 1000, 1), true);
    else if (w == "wide_mlp") {
      auto x = torch::empty({256, 784});
      for (int64_t k = 0; k < 256 * 784; ++k) x.data_ptr<float>()[k] = float(uniform(S_WIDE_X, k));
      auto y = torch::empty({256}, torch::kInt64);
      for (int64_t k = 0; k < 256; ++k) y.data_ptr<int64_t>()[k] = std::min<int64_t>(int64_t(uniform(S_WIDE_Y, k) * 10), 9);
      run_fixed(w, x, y, false);
    } else if (w == "mnist_mlp") run_mnist();
    else if (w == "mnist_cnn") run_batches(w, build_cnn(), {1, 28, 28});
    else if (w == "lstm") run_batches(w, LstmNet(), {28, 28});
    else if (w == "resnet") run_batches(w, build_resnet(), {1, 28, 28});
    else if (w == "transformer") run_transformer();
    else run_tiny();
  }
  return 0;
}
