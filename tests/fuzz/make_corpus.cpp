// Writes the fuzz targets' seed corpora with kiln's own writers: make_corpus DIR fills DIR/<target>/ for every target
// of tests/fuzz (json, safetensors, checkpoint, idx, npy, csv, mnist). Seeds are small, so that mutations stay fast,
// and each covers a feature of its format the fuzzer could not easily find alone (gzip, every dtype and optimizer,
// scheduler states, quoting).
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "fuzz_common.hpp"
#include "fuzz_models.hpp"
#include "kiln/data/npy.hpp"
#include "kiln/io/checkpoint.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/io/weights.hpp"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

fs::path root;

void seed(const std::string& target, const std::string& name, std::string_view bytes) {
  fs::create_directories(root / target);
  kiln_fuzz::write_file(root / target / name, bytes);
}
std::string gzip(std::string_view bytes) {
  uLongf size = compressBound(static_cast<uLong>(bytes.size())) + 32;
  std::string out(size, '\0');
  z_stream z{};
  deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);  // 16 + window bits: a gzip wrapper
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}
std::string idx(std::initializer_list<std::uint32_t> dims) {
  std::string h{'\0', '\0', '\x08', static_cast<char>(dims.size())};
  std::uint64_t count = 1;
  for (std::uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) h += static_cast<char>((d >> shift) & 0xFF);
    count *= d;
  }
  for (std::uint64_t i = 0; i < count; ++i) h += static_cast<char>(i % 10);
  return h;
}
template <class Write>
std::string written(Write write) {
  const auto path = kiln_fuzz::scratch_dir() / "seed";
  write(path);
  return kiln_fuzz::read_file(path);
}
// The JSON header of a safetensors file.
std::string header_of(const std::string& file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<std::size_t>(i)]);
  return file.substr(8, n);
}

void safetensors_and_json() {
  auto static_net = kiln_fuzz::make_static_model();
  auto dynamic_net = kiln_fuzz::make_dynamic_model();
  const std::string files[] = {
      written([&](const fs::path& p) { io::save_weights(static_net, p); }),
      written([&](const fs::path& p) { io::save_weights(dynamic_net, p, {{"format", "pt"}, {"note", "a \"quoted\"\n"}}); }),
      written([&](const fs::path& p) {
        io::st_file f;
        f.add("f64", Tensor<double>(shape{2, 2}, 1.5));
        f.add("i64", Tensor<std::int64_t>(shape{3}, 7));
        f.add("empty", Tensor<float>(shape{0, 4}));
        f.add("scalar", Tensor<float>(shape{}, 2.0f));
        io::st_tensor half{"f16", io::st_dtype::f16, shape{2}, std::string("\x00\x3c\x00\xc0", 4)};
        io::st_tensor bf{"bf16", io::st_dtype::bf16, shape{2}, std::string("\x80\x3f\x00\x40", 4)};
        io::st_tensor mask{"mask", io::st_dtype::boolean, shape{3}, std::string("\x01\x00\x01", 3)};
        f.tensors.push_back(half);
        f.tensors.push_back(bf);
        f.tensors.push_back(mask);
        io::write_safetensors(p, f);
      }),
  };
  int i = 0;
  for (const auto& f : files) {
    seed("safetensors", "seed" + std::to_string(i), f);
    seed("json", "header" + std::to_string(i), header_of(f));
    ++i;
  }
  seed("json", "values", R"({"a":[1,-2.5e-3,true,false,null,"\u00e9\ud83d\ude00\t"],"b":{"c":[[]],"d":{}}})");
}

template <class O, class Options>
void checkpoint_seed(const std::string& name, Options options) {
  auto model = kiln_fuzz::make_static_model();
  O optimizer(options);
  Tensor<float> x(shape{8, 4}, 0.5f), y(shape{8, 2}, 0.25f);
  model.train_step(x, y, loss::mse{}, optimizer);
  optim::StepLR step(optimizer, {.step_size = 3});
  step.step();
  optim::ReduceLROnPlateau plateau(optimizer, {.patience = 0, .cooldown = 2});
  plateau.step(1.0);
  plateau.step(2.0);
  random_generator data_order(5);
  seed("checkpoint", name, written([&](const fs::path& p) {
         io::save_checkpoint(p, model, optimizer,
                             {.epoch = 3,
                              .step = 40,
                              .generators = {{"data", data_order.state()}},
                              .metadata = {{"run", "seed"}},
                              .schedulers = {{"step", step.state()}, {"plateau", plateau.state()}}});
       }));
}

void checkpoints() {
  checkpoint_seed<optim::Adam>("adam", optim::adam_options{.lr = 1e-2});
  checkpoint_seed<optim::AdamW>("adamw", optim::adamw_options{.lr = 1e-2, .amsgrad = true});
  checkpoint_seed<optim::SGD>("sgd", optim::sgd_options{.lr = 0.05, .momentum = 0.9});
  checkpoint_seed<optim::RMSprop>("rmsprop", optim::rmsprop_options{.lr = 1e-2, .momentum = 0.9, .centered = true});
  checkpoint_seed<optim::Adagrad>("adagrad", optim::adagrad_options{.lr = 0.1});
  auto model = kiln_fuzz::make_dynamic_model();
  optim::Adam optimizer(model.parameters(), {.lr = 1e-2});
  kiln_fuzz::dynamic_step(model, optimizer);
  seed("checkpoint", "dynamic_adam", written([&](const fs::path& p) { io::save_checkpoint(p, model, optimizer); }));
}

void data_formats() {
  seed("idx", "labels", idx({5}));
  seed("idx", "images", idx({2, 3, 3}));
  seed("idx", "images_gz", gzip(idx({2, 4, 4})));
  seed("idx", "empty", idx({0, 28, 28}));
  seed("npy", "u8", written([](const fs::path& p) { data::write_npy(p, Tensor<std::uint8_t>(shape{3, 2}, 9)); }));
  seed("npy", "i64", written([](const fs::path& p) { data::write_npy(p, Tensor<std::int64_t>(shape{4}, -3)); }));
  seed("npy", "f32", written([](const fs::path& p) { data::write_npy(p, Tensor<float>(shape{2, 1, 2}, 0.5f)); }));
  seed("npy", "f64", written([](const fs::path& p) { data::write_npy(p, Tensor<double>(shape{}, 2.0)); }));
  seed("npy", "f32_gz", gzip(written([](const fs::path& p) { data::write_npy(p, Tensor<float>(shape{3}, 1.0f)); })));
  // CSV: the first byte chooses the options (see fuzz_csv.cpp): 0 ',' with a header; 8 | (1 << 4) label column 1;
  // 4 no header; 1 ';'.
  seed("csv", "header", std::string(1, '\0') + "a,b,c\n1,2.5,-3\n4,5e3,+6\n");
  seed("csv", "label", std::string(1, char(8 | 16)) + "x,label\r\n0.5,1\r\n\"1.5\",0\r\n");
  seed("csv", "no_header", std::string(1, '\4') + "1,2\n3,4\n\n");
  seed("csv", "semicolon", std::string(1, '\1') + "\xEF\xBB\xBF\"p;q\";r\n1;2\n");
  // MNIST: two bytes of the images file's length, the images file, the labels file.
  const std::string images = idx({2, 28, 28}), labels = idx({2});
  const std::string split{static_cast<char>(images.size() & 0xFF), static_cast<char>(images.size() >> 8)};
  seed("mnist", "two", split + images + labels);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus DIR\n");
    return 2;
  }
  root = argv[1];
  safetensors_and_json();
  checkpoints();
  data_formats();
  fs::remove_all(kiln_fuzz::scratch_dir());
  return 0;
}
