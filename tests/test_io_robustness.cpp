// I/O robustness: safetensors headers whose sizes overflow, empty tensors, duplicate names, PyTorch's integer
// buffers and unsupported dtypes, the JSON reader on large headers, the atomic writer's temporary file, and the ONNX
// exporter's names and shapes (checked by reading the written graph back with a small protobuf reader).
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io_test_files.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/io/atomic_file.hpp"
#include "kiln/io/json.hpp"
#include "kiln/io/onnx.hpp"
#include "kiln/io/onnx_dynamic.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/io/weights.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
namespace fs = std::filesystem;
using io_test::make_file;
using io_test::read_bytes;
using io_test::write_bytes;

namespace {

fs::path temp_dir(const std::string& name) { return io_test::fresh_dir("kiln_test_io_robustness", name); }
// The entries of a directory whose names start with prefix (temporaries left behind).
std::vector<std::string> entries_starting_with(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().filename().string());
  return out;
}

// Protobuf wire format, read back: the fields of one message (varints and length-delimited payloads).
struct pb_field {
  int number;
  std::uint64_t varint;
  std::string_view bytes;
};
std::vector<pb_field> pb_fields(std::string_view m) {
  std::vector<pb_field> out;
  std::size_t i = 0;
  auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0; i < m.size(); shift += 7) {
      auto b = static_cast<unsigned char>(m[i++]);
      v |= std::uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  };
  while (i < m.size()) {
    std::uint64_t key = varint();
    pb_field f{static_cast<int>(key >> 3), 0, {}};
    switch (key & 7) {
      case 0: f.varint = varint(); break;
      case 1: f.bytes = m.substr(i, 8); i += 8; break;
      case 2: {
        auto n = static_cast<std::size_t>(varint());
        f.bytes = m.substr(i, n);
        i += n;
        break;
      }
      case 5: f.bytes = m.substr(i, 4); i += 4; break;
      default: FAIL("unexpected wire type"); return out;
    }
    out.push_back(f);
  }
  return out;
}
std::vector<std::string_view> pb_strings(std::string_view m, int number) {
  std::vector<std::string_view> out;
  for (const auto& f : pb_fields(m))
    if (f.number == number) out.push_back(f.bytes);
  return out;
}
// The parts of an exported graph that ONNX's single-assignment rule is about, and the shapes of its input and output
// ("N" for the batch).
struct onnx_graph {
  std::vector<std::string> inputs, outputs, initializers, node_inputs, node_outputs;
  std::vector<std::string> initializer_data;
  std::vector<std::string> input_dims, output_dims;
};
// A ValueInfoProto's dims: dim_value as a number, dim_param as its name.
std::vector<std::string> value_dims(std::string_view value_info) {
  std::vector<std::string> out;
  auto type = pb_strings(value_info, 2).at(0);
  auto tensor = pb_strings(type, 1).at(0);
  for (auto dim : pb_strings(pb_strings(tensor, 2).at(0), 1))
    for (const auto& f : pb_fields(dim)) {
      if (f.number == 1) out.push_back(std::to_string(f.varint));
      if (f.number == 2) out.emplace_back(f.bytes);
    }
  return out;
}
onnx_graph read_graph(const std::string& model) {
  onnx_graph g;
  auto graph = pb_strings(model, 7).at(0);
  for (auto n : pb_strings(graph, 1)) {
    for (auto i : pb_strings(n, 1)) g.node_inputs.emplace_back(i);
    for (auto o : pb_strings(n, 2)) g.node_outputs.emplace_back(o);
  }
  for (auto t : pb_strings(graph, 5)) {
    g.initializers.emplace_back(pb_strings(t, 8).at(0));
    g.initializer_data.emplace_back(pb_strings(t, 9).at(0));
  }
  for (auto v : pb_strings(graph, 11)) {
    g.inputs.emplace_back(pb_strings(v, 1).at(0));
    g.input_dims = value_dims(v);
  }
  for (auto v : pb_strings(graph, 12)) {
    g.outputs.emplace_back(pb_strings(v, 1).at(0));
    g.output_dims = value_dims(v);
  }
  return g;
}
// Every value named once and non-empty, every node input defined, every initializer used, the output produced. A
// node output may be empty: an optional output left out (an LSTM's Y where only its final state is used).
void check_well_formed(const onnx_graph& g) {
  std::set<std::string> defined;
  for (const auto* names : {&g.inputs, &g.initializers, &g.node_outputs})
    for (const auto& n : *names) {
      CAPTURE(n);
      if (names == &g.node_outputs && n.empty()) continue;
      CHECK(!n.empty());
      CHECK(defined.insert(n).second);
    }
  for (const auto& i : g.node_inputs) {
    CAPTURE(i);
    CHECK(defined.count(i) == 1);
  }
  std::set<std::string> used(g.node_inputs.begin(), g.node_inputs.end());
  for (const auto& i : g.initializers) {
    CAPTURE(i);
    CHECK(used.count(i) == 1);
  }
  REQUIRE(g.outputs.size() == 1);
  CHECK(std::count(g.node_outputs.begin(), g.node_outputs.end(), g.outputs[0]) == 1);
}

}  // namespace

TEST_CASE("safetensors: shapes whose element or byte count overflows are refused, naming tensor and file") {
  struct bad_case {
    const char* what;
    std::string header;
    std::string data;
    const char* message;
  };
  const bad_case cases[] = {
      {"F32 [2^62]: 2^64 bytes wrap to 0",
       R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})",
       "", "needs more bytes"},
      {"F64 [2^61]", R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})", "",
       "needs more bytes"},
      {"F32 [2^62 + 1] over 4 bytes", R"({"a":{"dtype":"F32","shape":[4611686018427387905],"data_offsets":[0,4]}})",
       "abcd", "needs more bytes"},
      {"F32 [2^31, 2^31]", R"({"a":{"dtype":"F32","shape":[2147483648,2147483648],"data_offsets":[0,0]}})", "",
       "needs more bytes"},
      {"I64 [2^32, 2^31]: more elements than index_t",
       R"({"a":{"dtype":"I64","shape":[4294967296,2147483648],"data_offsets":[0,0]}})", "", "more elements"},
      {"a zero hides [2^62, 2^62]", R"({"a":{"dtype":"F32","shape":[0,4611686018427387904,4611686018427387904],)"
                                    R"("data_offsets":[0,0]}})",
       "", "more elements"},
      {"fractional extent", R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", "abcd",
       "tensor 'a' (header byte"},
      {"extent past int64", R"({"a":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,4]}})", "abcd",
       "expected integers in 'shape'"},
      {"string offset", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":["0",4]}})", "abcd",
       "expected integers in 'data_offsets'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    CHECK_THROWS_WITH_AS(io::parse_safetensors(make_file(c.header, c.data), "overflow.safetensors"),
                         doctest::Contains(c.message), error);
    CHECK_THROWS_WITH_AS(io::parse_safetensors(make_file(c.header, c.data), "overflow.safetensors"),
                         doctest::Contains("'overflow.safetensors': tensor 'a'"), error);
  }
}

TEST_CASE("safetensors: empty tensors overlap nothing, whatever their order in the header") {
  io::st_file file;
  // std::string("t").append(...), not "t" + ...: GCC 12 can warn falsely (-Wrestrict) on the latter's insert.
  for (int i = 0; i < 40; ++i)
    file.add(std::string("t").append(std::to_string(i)), Tensor<float>(shape{i % 2 ? 0 : 3}, 1.0f));
  auto path = temp_dir("empty") / "empties.safetensors";
  io::write_safetensors(path, file);
  auto back = io::read_safetensors(path);
  REQUIRE(back.tensors.size() == 40);
  for (int i = 0; i < 40; ++i)
    CHECK(back.tensors[static_cast<std::size_t>(i)].name == std::string("t").append(std::to_string(i)));

  // Hand-made: the empty tensor listed after the one that starts at its offset.
  auto f = io::parse_safetensors(make_file(R"({"b":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                                           R"("a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
                                           std::string(12, '\0')));
  CHECK(f.tensors.size() == 2);
  // Real overlaps are still found.
  CHECK_THROWS_WITH_AS(io::parse_safetensors(make_file(R"({"b":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                                                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                                       std::string(12, '\0'))),
                       doctest::Contains("overlap"), error);
}

TEST_CASE("safetensors: reading a directory raises kiln::error") {
  auto dir = temp_dir("directory");
  CHECK_THROWS_WITH_AS(io::read_safetensors(dir), doctest::Contains("directory"), error);
}

TEST_CASE("safetensors: duplicate metadata keys or tensor names are refused before any file is touched") {
  auto dir = temp_dir("duplicates");
  auto path = dir / "dup.safetensors";
  write_bytes(path, "previous");
  Tensor<float> t(shape{2}, 1.0f);
  io::st_file names;
  names.add("x", t);
  names.add("y", t);
  names.add("x", t);
  CHECK_THROWS_WITH_AS(io::write_safetensors(path, names), doctest::Contains("tensor names, found 'x' twice"), error);
  io::st_file keys;
  keys.add("x", t);
  keys.metadata = {{"k", "1"}, {"k", "2"}};
  CHECK_THROWS_WITH_AS(io::write_safetensors(path, keys), doctest::Contains("metadata keys, found 'k' twice"), error);
  using mlp = Sequential<policy::cpu, Input<4>, Dense<3>>;
  mlp net(2, 1);
  CHECK_THROWS_AS(io::save_weights(net, path, {{"k", "1"}, {"k", "2"}}), error);
  CHECK(read_bytes(path) == "previous");
}

TEST_CASE("json: duplicate keys are found in O(n log n) with the same message") {
  CHECK_THROWS_WITH_AS(io::json::parse(R"({"a": 1, "b": 2, "a": 3})"),
                       doctest::Contains("duplicate key 'a' at byte 17"), error);
  // 200k keys: a scan of the earlier keys per key takes minutes; a set takes a fraction of a second.
  std::string text = "{";
  for (int i = 0; i < 200000; ++i) {
    if (i) text += ',';
    text += "\"k" + std::to_string(i) + "\":0";
  }
  text += '}';
  auto start = std::chrono::steady_clock::now();
  auto v = io::json::parse(text);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(v.as_object().size() == 200000);
  CHECK(seconds < 10.0);
}

TEST_CASE("load_weights: PyTorch's int64 num_batches_tracked loads; integers float would round are refused") {
  auto dir = temp_dir("torch_int");
  // A state dict as safetensors.torch.save_file writes it: num_batches_tracked is an I64 scalar.
  auto torch_like = [](const auto& model, std::int64_t batches) {
    io::st_file f;
    for (const auto& [name, value] : model.state_dict()) {
      if (name.ends_with("num_batches_tracked")) {
        Tensor<std::int64_t> n(shape{});
        n[0] = batches;
        f.add(name, n);
      } else {
        f.add(name, value);
      }
    }
    return f;
  };
  auto tracked = [](const auto& model) {
    for (const auto& [name, value] : model.state_dict())
      if (name.ends_with("num_batches_tracked")) return value[0];
    return -1.0f;
  };
  manual_seed(1);
  nn::Sequential dynamic(nn::Linear(4, 3), nn::BatchNorm1d(3));
  io::write_safetensors(dir / "dynamic.safetensors", torch_like(dynamic, 7));
  io::load_weights(dynamic, dir / "dynamic.safetensors");
  CHECK(tracked(dynamic) == 7.0f);
  Sequential<policy::cpu, Input<4>, Dense<3>, BatchNorm1d<>> net(2, 1);
  io::write_safetensors(dir / "static.safetensors", torch_like(net, 9));
  io::load_weights(net, dir / "static.safetensors");
  CHECK(tracked(net) == 9.0f);

  // 2^62 + 1 has no float: refused, model unchanged.
  io::write_safetensors(dir / "lossy.safetensors", torch_like(net, (std::int64_t(1) << 62) + 1));
  CHECK_THROWS_WITH_AS(io::load_weights(net, dir / "lossy.safetensors"), doctest::Contains("cannot hold exactly"),
                       error);
  CHECK(tracked(net) == 9.0f);
  CHECK_THROWS_AS(io::to_tensor<float>(*io::read_safetensors(dir / "lossy.safetensors").find("1.num_batches_tracked")),
                  error);
}

TEST_CASE("load_weights: a BOOL tensor the load skips (excluded, or unknown with strict off) need not be convertible") {
  auto dir = temp_dir("bool_mask");
  using mlp = Sequential<policy::cpu, Input<2>, Dense<1>>;
  mlp small(1, 1);
  const std::string with_mask = make_file(R"({"0.weight":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]},)"
                                          R"("0.bias":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
                                          R"("mask":{"dtype":"BOOL","shape":[4],"data_offsets":[12,16]}})",
                                          std::string(16, '\0'));
  write_bytes(dir / "mask.safetensors", with_mask);
  io::load_weights(small, dir / "mask.safetensors", {.strict = false, .exclude = {"mask"}});
  io::load_weights(small, dir / "mask.safetensors", {.strict = false});
  CHECK(small.state_dict()[0].second[0] == 0.0f);
  CHECK_THROWS_WITH_AS(io::load_weights(small, dir / "mask.safetensors"), doctest::Contains("unexpected tensor 'mask'"),
                       error);
  CHECK_THROWS_WITH_AS(io::to_tensor<float>(*io::read_safetensors(dir / "mask.safetensors").find("mask")),
                       doctest::Contains("unsupported dtype 'BOOL'"), error);
}

namespace {
// Plants a symlink named `link` to a precious file in dir, writes dir/target atomically, and checks that the precious
// file is untouched and that dir/target is a regular file with the new content.
void write_past_planted_symlink(const fs::path& dir, const std::string& link, const std::string& target) {
  write_bytes(dir / "precious.txt", "precious");
  fs::create_symlink(dir / "precious.txt", dir / link);
  io::write_file_atomically(dir / target, "new weights");
  CHECK(read_bytes(dir / "precious.txt") == "precious");
  CHECK(!fs::is_symlink(dir / target));
  CHECK(read_bytes(dir / target) == "new weights");
}
}  // namespace

TEST_CASE("write_file_atomically: a symlink where a temporary might go is never followed") {
  auto dir = temp_dir("symlink");
  write_past_planted_symlink(dir, "model.safetensors.tmp-kiln", "model.safetensors");
  // Only the file and the two planted entries: no temporary left.
  CHECK(entries_starting_with(dir, "model.safetensors").size() == 2);
}

TEST_CASE("write_file_atomically: a write that fails part-way keeps the old file and leaves no temporary") {
  auto dir = temp_dir("partial");
  auto path = dir / "big.safetensors";
  io::write_file_atomically(path, "old");
  // A file size limit makes the write fail after 100 kB (SIGXFSZ ignored, so write() reports EFBIG).
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  getrlimit(RLIMIT_FSIZE, &old_limit);
  rlimit limit = old_limit;
  limit.rlim_cur = 100000;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &limit) == 0);
  bool threw = false;
  try {
    io::write_file_atomically(path, std::string(1 << 20, 'x'));
  } catch (const error&) {
    threw = true;
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  CHECK(threw);
  CHECK(read_bytes(path) == "old");
  CHECK(entries_starting_with(dir, "big.safetensors").size() == 1);
}

TEST_CASE("write_file_atomically: the new file keeps the old one's permissions") {
  auto dir = temp_dir("permissions");
  auto path = dir / "private.safetensors";
  io::write_file_atomically(path, "old");
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::replace);
  io::write_file_atomically(path, "new");
  CHECK(read_bytes(path) == "new");
  CHECK(fs::status(path).permissions() == (fs::perms::owner_read | fs::perms::owner_write));
}

TEST_CASE("write_file_atomically: a symlink at the target is replaced, its target never written") {
  write_past_planted_symlink(temp_dir("symlink_target"), "weights.safetensors", "weights.safetensors");
}

TEST_CASE("write_file_atomically: temporaries of a writer that was killed are removed, a running one's are not") {
  auto dir = temp_dir("stale");
  auto path = dir / "model.safetensors";
  // No process has an id above the kernel's largest (2^22): the writer of this one is gone.
  const std::string gone = "model.safetensors.tmp-kiln-99999999-0-0";
  const std::string running =
      std::string("model.safetensors.tmp-kiln-").append(std::to_string(::getpid())).append("-999-0");
  write_bytes(dir / gone, std::string(1000, 'x'));
  write_bytes(dir / running, "in flight");
  write_bytes(dir / "other.safetensors.tmp-kiln-99999999-0-0", "another file's");
  io::write_file_atomically(path, "weights");
  CHECK(!fs::exists(dir / gone));
  CHECK(read_bytes(dir / running) == "in flight");
  CHECK(fs::exists(dir / "other.safetensors.tmp-kiln-99999999-0-0"));
  CHECK(read_bytes(path) == "weights");
}

TEST_CASE("export_onnx: Linear on inputs of rank > 2 exports only the weight it uses") {
  manual_seed(3);
  auto model = nn::Sequential(nn::Linear(3, 4));
  const Tensor<float> w = model.state_dict().at(0).second;  // 0.weight
  const std::string weight(reinterpret_cast<const char*>(w.data()), static_cast<std::size_t>(w.numel()) * 4);
  auto matmul = read_graph(io::onnx_model_bytes(model, {.input_shape = {5, 3}}));
  check_well_formed(matmul);
  CHECK(matmul.initializers.size() == 2);  // W^T and the bias
  for (const auto& data : matmul.initializer_data) CHECK(data != weight);
  auto gemm = read_graph(io::onnx_model_bytes(model, {.input_shape = {3}}));
  check_well_formed(gemm);
  CHECK(gemm.initializers.size() == 2);
  CHECK(std::count(gemm.initializer_data.begin(), gemm.initializer_data.end(), weight) == 1);
}

TEST_CASE("export_onnx: input and output names are checked, and never collide with the graph's own names") {
  using net_type = Sequential<policy::cpu, Input<4>, Dense<2>>;
  net_type net(2, 1);
  // Names the exporter also generates: its own values are named around them.
  const io::onnx_options colliding[] = {{.output_name = "weight_0"}, {.input_name = "linear_2"},
                                        {.input_name = "bias_1", .output_name = "linear_2"}};
  for (const auto& options : colliding) {
    CAPTURE(options.input_name);
    CAPTURE(options.output_name);
    auto g = read_graph(io::onnx_model_bytes(net, options));
    check_well_formed(g);
    CHECK(g.inputs.at(0) == options.input_name);
    CHECK(g.outputs.at(0) == options.output_name);
  }
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(net, {.input_name = "x", .output_name = "x"}),
                       doctest::Contains("different input and output names"), error);
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(net, {.input_name = ""}), doctest::Contains("non-empty"), error);
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(net, {.output_name = ""}), doctest::Contains("non-empty"), error);
  auto model = nn::Sequential(nn::Identity());
  CHECK_THROWS_AS(io::onnx_model_bytes(model, {.input_name = "x", .output_name = "x", .input_shape = {3}}), error);
}

TEST_CASE("export_onnx: a -1 first in input_shape is the batch, second a time-major batch; others are refused") {
  manual_seed(4);
  auto model = nn::Sequential(nn::Linear(3, 4));
  CHECK(io::onnx_model_bytes(model, {.input_shape = {-1, 3}}) == io::onnx_model_bytes(model, {.input_shape = {3}}));
  CHECK(io::onnx_model_bytes(model, {.input_shape = {-1, 2, 3}}) ==
        io::onnx_model_bytes(model, {.input_shape = {2, 3}}));
  auto time_major = read_graph(io::onnx_model_bytes(model, {.input_shape = {2, -1, 3}}));
  check_well_formed(time_major);
  CHECK(time_major.input_dims == std::vector<std::string>{"2", "N", "3"});
  CHECK(time_major.output_dims == std::vector<std::string>{"2", "N", "4"});
  for (std::vector<index_t> bad : {std::vector<index_t>{2, 3, -1}, {-1, -1, 3}, {2, -1, -1}, {-2, 3}, {-1}}) {
    CAPTURE(bad.size());
    CHECK_THROWS_WITH_AS(io::onnx_model_bytes(model, {.input_shape = bad}),
                         doctest::Contains("export_onnx: expected per-sample input extents >= 0"), error);
  }
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(model, {.input_shape = {3, -1}}),
                       doctest::Contains("export_onnx: a -1 second in options.input_shape puts the batch second in a "
                                         "(seq, batch, features...) input, which needs at least three entries, found "
                                         "{3, -1}"),
                       error);
}

namespace {
// A dynamic model that export_onnx must refuse: what it is, its per-sample input, and what the message must say.
struct bad_export_case {
  const char* what;
  nn::Sequential model;
  std::vector<index_t> input;
  const char* message;
  const char* where;
};

// Each case's export is refused at every opset, with "export_onnx: " + its message and the place it names.
void check_refused(std::span<const bad_export_case> cases, std::initializer_list<int> opsets) {
  for (const auto& c : cases) {
    CAPTURE(c.what);
    std::string message = "export_onnx: ";
    message += c.message;
    for (int opset : opsets) {
      CHECK_THROWS_WITH_AS(io::onnx_model_bytes(c.model, {.opset = opset, .input_shape = c.input}),
                           doctest::Contains(message.c_str()), error);
      CHECK_THROWS_WITH_AS(io::onnx_model_bytes(c.model, {.opset = opset, .input_shape = c.input}),
                           doctest::Contains(c.where), error);
    }
  }
}
}  // namespace

TEST_CASE("export_onnx: CNN layers that do not fit their input raise kiln::error naming expected, found and where") {
  const bad_export_case cases[] = {
      {"conv on a flat input", nn::Sequential(nn::Conv2d(1, 2, 3)), {784},
       "Conv2d expects input of shape [N, channels, height, width], found a value of shape [N, 784]",
       "(at Sequential[0] Conv2d(1, 2, kernel_size=(3, 3)"},
      {"conv channels", nn::Sequential(nn::Conv2d(3, 4, 3)), {1, 8, 8},
       "Conv2d expects 3 input channels, found a value of shape [N, 1, 8, 8]", "(at Sequential[0] Conv2d(3, 4"},
      {"conv kernel too large", nn::Sequential(nn::Conv2d(1, 2, 5)), {1, 3, 3},
       "a Conv2d 5x5 kernel (dilation 1, padding 0) does not fit a value of shape [N, 1, 3, 3]", "Sequential[0]"},
      {"conv dilated past the input", nn::Sequential(nn::Conv2d(1, 2, 3, 1, 0, 2)), {1, 4, 4},
       "a Conv2d 3x3 kernel (dilation 2, padding 0) does not fit", "Sequential[0]"},
      {"conv stride 0", nn::Sequential(nn::Conv2d(1, 2, 3, 0)), {1, 5, 5},
       "Conv2d expects positive out_channels, kernel, stride, dilation and groups and a padding >= 0, found "
       "out_channels 2, kernel 3, stride 0",
       "Sequential[0]"},
      {"conv negative padding", nn::Sequential(nn::Conv2d(1, 2, 3, 1, -1)), {1, 5, 5},
       "Conv2d expects positive out_channels, kernel, stride, dilation and groups and a padding >= 0, found "
       "out_channels 2, kernel 3, stride 1, dilation 1, groups 1, padding -1",
       "Sequential[0]"},
      {"conv same with stride 2", nn::Sequential(nn::Conv2d(1, 2, 3, 2, "same")), {1, 5, 5},
       "Conv2d with padding \"same\" expects stride 1, found stride 2", "Sequential[0]"},
      {"max pool on a matrix", nn::Sequential(nn::MaxPool2d(2)), {4, 4},
       "MaxPool2d expects input of shape [N, channels, height, width], found a value of shape [N, 4, 4]",
       "(at Sequential[0] MaxPool2d(kernel_size=2"},
      {"max pool window too large", nn::Sequential(nn::MaxPool2d(3)), {2, 2, 2},
       "a MaxPool2d 3x3 window (padding 0) does not fit a value of shape [N, 2, 2, 2]", "Sequential[0]"},
      {"average pool padding over half the kernel", nn::Sequential(nn::AvgPool2d(2, 2, 2)), {1, 4, 4},
       "AvgPool2d expects a positive kernel and stride and a padding of at most half the kernel, found kernel 2, "
       "stride 2, padding 2",
       "Sequential[0] AvgPool2d"},
      {"pool after a flatten", nn::Sequential(nn::Flatten(), nn::AvgPool2d(2)), {1, 4, 4},
       "AvgPool2d expects input of shape [N, channels, height, width], found a value of shape [N, 16]",
       "(at Sequential[1] AvgPool2d("},
      {"global pool on a vector", nn::Sequential(nn::GlobalAvgPool2d()), {10},
       "GlobalAvgPool2d expects input of shape [N, channels, height, width], found a value of shape [N, 10]",
       "(at Sequential[0] GlobalAvgPool2d()"},
      {"adaptive pool on a matrix", nn::Sequential(nn::AdaptiveAvgPool2d(1)), {3, 4},
       "AdaptiveAvgPool2d expects input of shape [N, channels, height, width], found a value of shape [N, 3, 4]",
       "Sequential[0] AdaptiveAvgPool2d"},
      {"batch norm 2d channels", nn::Sequential(nn::BatchNorm2d(4)), {3, 5, 5},
       "BatchNorm2d expects input of shape [N, 4, height, width], found a value of shape [N, 3, 5, 5]",
       "(at Sequential[0] BatchNorm2d(4, eps=1e-05"},
      {"batch norm 2d on a vector", nn::Sequential(nn::BatchNorm2d(4)), {4},
       "BatchNorm2d expects input of shape [N, 4, height, width], found a value of shape [N, 4]", "Sequential[0]"},
      {"batch norm 1d on an image", nn::Sequential(nn::BatchNorm1d(4)), {4, 2, 2},
       "BatchNorm1d expects input of shape [N, 4] or [N, 4, length], found a value of shape [N, 4, 2, 2]",
       "Sequential[0] BatchNorm1d"},
      {"batch norm 1d features", nn::Sequential(nn::Linear(3, 6), nn::BatchNorm1d(4)), {3},
       "BatchNorm1d expects input of shape [N, 4] or [N, 4, length], found a value of shape [N, 6]",
       "Sequential[1] BatchNorm1d"},
      {"layer norm over other dims", nn::Sequential(nn::LayerNorm(shape{3, 4})), {4, 3},
       "LayerNorm over [3, 4] expects input whose last dims are [3, 4], found a value of shape [N, 4, 3]",
       "(at Sequential[0] LayerNorm([3, 4]"},
      {"layer norm over more dims than the value has", nn::Sequential(nn::LayerNorm(shape{2, 3, 4})), {3, 4},
       "LayerNorm over [2, 3, 4] expects input whose last dims are [2, 3, 4], found a value of shape [N, 3, 4]",
       "Sequential[0] LayerNorm"},
  };
  // Below opset 17 LayerNorm is decomposed: the same check comes first.
  check_refused(cases, {13, 17});
}

TEST_CASE("export_onnx: recurrent layers that do not fit their input raise kiln::error naming expected, found, where") {
  const bad_export_case cases[] = {
      {"LSTM on a flat input", nn::Sequential(nn::LSTM(4, 5, {.batch_first = true})), {20},
       "LSTM (batch_first) expects input of shape [N, seq, 4], found a value of shape [N, 20]",
       "(at Sequential[0] LSTM(4, 5, batch_first=True)"},
      {"LSTM input size", nn::Sequential(nn::LastStep(nn::LSTM(4, 5, {.batch_first = true}))), {6, 3},
       "LSTM (batch_first) expects input of shape [N, seq, 4], found a value of shape [N, 6, 3]",
       "(at Sequential[0] LastStep[LSTM](4, 5, batch_first=True)"},
      {"LSTM on an image", nn::Sequential(nn::FinalState(nn::LSTM(4, 5, {.batch_first = true}))), {1, 6, 4},
       "LSTM (batch_first) expects input of shape [N, seq, 4], found a value of shape [N, 1, 6, 4]",
       "Sequential[0] FinalState[LSTM]"},
      {"no time steps", nn::Sequential(nn::AllSteps(nn::GRU(4, 5, {.batch_first = true}))), {0, 4},
       "GRU expects at least one time step, found a value of shape [N, 0, 4]", "Sequential[0] AllSteps[GRU](4, 5"},
      {"time-major GRU on a batch-first input", nn::Sequential(nn::GRU(4, 5)), {6, 4},
       "GRU without batch_first expects input of shape [seq, N, 4] (the batch second: options.input_shape {seq, -1, "
       "4} as the graph's input), found a value of shape [N, 6, 4]",
       "(at Sequential[0] GRU(4, 5)"},
      {"batch-first GRU on a time-major input", nn::Sequential(nn::FinalState(nn::GRU(4, 5, {.batch_first = true}))),
       {6, -1, 4}, "GRU (batch_first) expects input of shape [N, seq, 4], found a value of shape [6, N, 4]",
       "Sequential[0] FinalState[GRU]"},
      {"time-major LSTM after a batch-first one",
       nn::Sequential(nn::LSTM(4, 5, {.batch_first = true}), nn::LSTM(5, 3, {.num_layers = 2})), {6, 4},
       "LSTM without batch_first expects input of shape [seq, N, 5]", "(at Sequential[1] LSTM(5, 3, num_layers=2)"},
      {"stacked input size", nn::Sequential(nn::LSTM(4, 5, {.bidirectional = true}), nn::GRU(5, 3)), {6, -1, 4},
       "GRU without batch_first expects input of shape [seq, N, 5] (the batch second: options.input_shape {seq, -1, "
       "5} as the graph's input), found a value of shape [6, N, 10]",
       "Sequential[1] GRU(5, 3)"},
      {"batch norm on a time-major sequence", nn::Sequential(nn::GRU(4, 5), nn::BatchNorm1d(5)), {6, -1, 4},
       "BatchNorm1d expects input of shape [N, 5] or [N, 5, length], found a value of shape [6, N, 5]",
       "(at Sequential[1] BatchNorm1d(5"},
      {"pooling a time-major sequence", nn::Sequential(nn::GRU(4, 5), nn::MaxPool2d(2)), {6, -1, 4},
       "MaxPool2d expects input of shape [N, channels, height, width], found a value of shape [6, N, 5]",
       "Sequential[1] MaxPool2d"},
      {"flatten over a time-major batch", nn::Sequential(nn::LSTM(4, 5), nn::Flatten()), {6, -1, 4},
       "Flatten(1, -1) would merge the batch dimension of a value of shape [6, N, 5], which is not exported",
       "(at Sequential[1] Flatten("},
      {"layer norm reaching a time-major batch", nn::Sequential(nn::GRU(4, 5), nn::LayerNorm(shape{6, 5})),
       {6, -1, 4},
       "LayerNorm over [6, 5] expects input whose last dims are [6, 5], found a value of shape [6, N, 5]",
       "Sequential[1] LayerNorm"},
  };
  check_refused(cases, {13, 20});
}

TEST_CASE("export_onnx: blocks that cannot be written raise kiln::error naming the block and where it sits") {
  const bad_export_case cases[] = {
      {"a residual body that changes the shape", nn::Sequential(nn::Residual(nn::Linear(4, 3))), {4},
       "Residual expects the body to give the shape of the input, found [N, 3] and [N, 4]",
       "(at Sequential[0] Residual()"},
      {"a shortcut that changes it otherwise",
       nn::Sequential(nn::Linear(4, 4), nn::Residual(nn::Linear(4, 3), nn::Linear(4, 2))), {4},
       "Residual expects the body to give the shape of the shortcut, found [N, 3] and [N, 2]",
       "(at Sequential[1] Residual()"},
      {"branches that do not broadcast", nn::Sequential(nn::Add(nn::Linear(4, 3), nn::Linear(4, 3), nn::Linear(4, 2))),
       {4},
       "Add expects branch 2 to give the shape of the branches before it (or one of its rank that broadcasts with "
       "it), found [N, 2] and [N, 3]",
       "(at Sequential[0] Add()"},
      {"a concat along the batch", nn::Sequential(nn::Concat(0, nn::Linear(4, 4), nn::Linear(4, 4))), {4},
       "Concat along dim 0 would join branch 0 of shape [N, 4] along its batch dimension, which is not exported",
       "(at Sequential[0] Concat(dim=0)"},
      {"a concat along a time-major batch", nn::Sequential(nn::GRU(4, 5), nn::Concat(-2, nn::ReLU(), nn::Tanh())),
       {6, -1, 4}, "Concat along dim -2 would join branch 0 of shape [6, N, 5] along its batch dimension",
       "(at Sequential[1] Concat(dim=-2)"},
      {"a concat along a dim the value lacks", nn::Sequential(nn::Concat(2, nn::Linear(4, 4), nn::Linear(4, 4))), {4},
       "Concat along dim 2 expects a value of rank > 2, found branch 0 of shape [N, 4]", "Sequential[0] Concat"},
      {"branches that disagree outside the dim",
       nn::Sequential(nn::Concat(1, nn::Conv2d(1, 2, 3), nn::Conv2d(1, 2, 1))), {1, 5, 5},
       "Concat along dim 1 expects branch 0 and branch 1 to agree outside dim 1, found [N, 2, 3, 3] and "
       "[N, 2, 5, 5]",
       "(at Sequential[0] Concat(dim=1)"},
      {"a layer inside a block that does not fit", nn::Sequential(nn::Concat(1, nn::Linear(4, 2), nn::Conv2d(4, 2, 1))),
       {4}, "Conv2d expects input of shape [N, channels, height, width], found a value of shape [N, 4]",
       "(at Sequential[0][1] Conv2d(4, 2"},
  };
  check_refused(cases, {13, 17});
}

TEST_CASE("export_onnx: blocks are written alike in both modes, their weights under the state_dict's names") {
  // A ResNet downsampling block, then a Concat of a Chain and an Add holding a Residual (8 + 4 channels), nested as
  // deep as names go: "1.1.0.0.0.body.0.weight".
  using net_type =
      Sequential<policy::cpu, Input<3, 6, 6>,
                 Residual<Shortcut<Conv2D<4, 1, conv_options{.stride = 2}>, BatchNorm2d<>>,
                          Conv2D<4, 3, conv_options{.stride = 2, .padding = 1}>, BatchNorm2d<>, ReLU,
                          Conv2D<4, 3, conv_options{.padding = 1}>, BatchNorm2d<>>,
                 Concat<1, Chain<Conv2D<8, 1>, ReLU>,
                        Add<Residual<Conv2D<4, 3, conv_options{.padding = 1}>>, Conv2D<4, 1>>>,
                 Flatten, Dense<5, Tanh>, Dense<2>>;
  net_type net(2, 3);
  nn::Sequential model(
      nn::Residual(nn::Sequential(nn::Conv2d(3, 4, 3, 2, 1), nn::BatchNorm2d(4), nn::ReLU(), nn::Conv2d(4, 4, 3, 1, 1),
                                  nn::BatchNorm2d(4)),
                   nn::Sequential(nn::Conv2d(3, 4, 1, 2), nn::BatchNorm2d(4))),
      nn::Concat(1, nn::Sequential(nn::Conv2d(4, 8, 1), nn::ReLU()),
                 nn::Sequential(nn::Add(nn::Sequential(nn::Residual(nn::Sequential(nn::Conv2d(4, 4, 3, 1, 1)))),
                                        nn::Sequential(nn::Conv2d(4, 4, 1))))),
      nn::Flatten(), nn::Linear(12 * 3 * 3, 5), nn::Tanh(), nn::Linear(5, 2));
  const auto dict = net.state_dict();
  model.load_state_dict(dict);
  for (int opset : {13, 17}) {
    CAPTURE(opset);
    const std::string bytes = io::onnx_model_bytes(net, {.opset = opset});
    CHECK(bytes == io::onnx_model_bytes(model, {.opset = opset, .input_shape = {3, 6, 6}}));
    const auto g = read_graph(bytes);
    check_well_formed(g);
    CHECK(g.output_dims == std::vector<std::string>{"N", "2"});
    // Every tensor inference reads is an initializer under its state_dict name, holding its values.
    for (const auto& [name, tensor] : dict) {
      CAPTURE(name);
      const auto at = std::find(g.initializers.begin(), g.initializers.end(), name);
      if (name.ends_with("num_batches_tracked")) {
        CHECK(at == g.initializers.end());
        continue;
      }
      REQUIRE(at != g.initializers.end());
      const std::string& data = g.initializer_data.at(static_cast<std::size_t>(at - g.initializers.begin()));
      CHECK(data == std::string(reinterpret_cast<const char*>(tensor.data()),
                                static_cast<std::size_t>(tensor.numel()) * sizeof(float)));
    }
    CHECK(std::count(g.initializers.begin(), g.initializers.end(), "1.1.0.0.0.body.0.weight") == 1);
  }
}

TEST_CASE("export_onnx: recurrent graphs are the same in both modes, well formed, and time-major where kiln is") {
  // The same weights in both modes: the same bytes, for each output view, with stacking, both directions and no bias.
  auto same_bytes = [](auto net, nn::Sequential model, std::vector<index_t> input) {
    model.load_state_dict(net.state_dict());
    for (int opset : {13, 17}) {
      CAPTURE(opset);
      const std::string bytes = io::onnx_model_bytes(net, {.opset = opset});
      CHECK(bytes == io::onnx_model_bytes(model, {.opset = opset, .input_shape = input}));
      const auto g = read_graph(bytes);
      check_well_formed(g);
      CHECK(g.input_dims.at(0) == "N");
      CHECK(g.output_dims.at(0) == "N");
    }
  };
  same_bytes(Sequential<policy::cpu, Input<5, 3>, LastStep<LSTM<4, 2, true>>, Dense<2>>(2, 1),
             nn::Sequential(nn::LastStep(nn::LSTM(3, 4, {.num_layers = 2, .batch_first = true, .bidirectional = true})),
                            nn::Linear(8, 2)),
             {5, 3});
  same_bytes(Sequential<policy::cpu, Input<5, 3>, FinalState<GRU<4, 2, true, rnn_options{.bias = false}>>>(2, 2),
             nn::Sequential(nn::FinalState(
                 nn::GRU(3, 4, {.num_layers = 2, .bias = false, .batch_first = true, .bidirectional = true}))),
             {5, 3});
  same_bytes(Sequential<policy::cpu, Input<5, 3>, GRU<4>, Tanh, FinalState<LSTM<2>>>(2, 3),
             nn::Sequential(nn::GRU(3, 4, {.batch_first = true}), nn::Tanh(),
                            nn::FinalState(nn::LSTM(4, 2, {.batch_first = true}))),
             {5, 3});

  // Time-major: the batch stays second through every step's output and comes first in a last step or final state.
  manual_seed(6);
  nn::Sequential sequence(nn::LSTM(3, 4, {.bidirectional = true}), nn::Linear(8, 2));
  auto g = read_graph(io::onnx_model_bytes(sequence, {.input_shape = {5, -1, 3}}));
  check_well_formed(g);
  CHECK(g.input_dims == std::vector<std::string>{"5", "N", "3"});
  CHECK(g.output_dims == std::vector<std::string>{"5", "N", "2"});
  nn::Sequential last(nn::AllSteps(nn::GRU(3, 4)), nn::LastStep(nn::LSTM(4, 2, {.num_layers = 2})));
  g = read_graph(io::onnx_model_bytes(last, {.input_shape = {5, -1, 3}}));
  check_well_formed(g);
  CHECK(g.output_dims == std::vector<std::string>{"N", "2"});
  nn::Sequential batch_first(nn::AllSteps(nn::GRU(3, 4, {.batch_first = true, .bidirectional = true})));
  g = read_graph(io::onnx_model_bytes(batch_first, {.input_shape = {5, 3}}));
  CHECK(g.input_dims == std::vector<std::string>{"N", "5", "3"});
  CHECK(g.output_dims == std::vector<std::string>{"N", "5", "8"});

  // Names the exporter generates (the recurrent weights, the Transposes) as the user's: its own go around them.
  using net_type = Sequential<policy::cpu, Input<5, 3>, LSTM<4, 2, true>, FinalState<GRU<2, 1, true>>, Dense<2>>;
  net_type net(2, 4);
  const auto plain = read_graph(io::onnx_model_bytes(net));
  const io::onnx_options named[] = {
      {.input_name = plain.node_outputs.at(0), .output_name = plain.initializers.at(1)},
      {.input_name = plain.initializers.at(0), .output_name = plain.node_outputs.at(1)}};
  for (const auto& options : named) {
    CAPTURE(options.input_name);
    auto s = read_graph(io::onnx_model_bytes(net, options));
    check_well_formed(s);
    CHECK(s.inputs.at(0) == options.input_name);
    CHECK(s.outputs.at(0) == options.output_name);
  }
}

TEST_CASE("export_onnx: a module without an export is named with where it sits; a failed export keeps the old file") {
  struct unknown : nn::Module {
    nn::Variable forward(const nn::Variable& x) override { return x; }
    std::string name() const override { return "Unknown"; }
  };
  manual_seed(5);
  nn::Sequential model(nn::Linear(3, 3), nn::Sequential(nn::ReLU(), unknown()));
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(model, {.input_shape = {2, 3}}),
                       doctest::Contains("export_onnx: Sequential[1][1] Unknown() has no ONNX export"), error);
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(model, {.input_shape = {2, 3}}),
                       doctest::Contains("has no ONNX export (exported: Sequential, Linear,"), error);
  // Inside blocks: a branch of an Add, a residual body.
  nn::Sequential in_branch(nn::Add(nn::Linear(3, 3), nn::Sequential(nn::ReLU(), unknown())));
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(in_branch, {.input_shape = {3}}),
                       doctest::Contains("export_onnx: Sequential[0][1][1] Unknown() has no ONNX export"), error);
  nn::Sequential in_body(nn::Linear(3, 3), nn::Residual(unknown()));
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(in_body, {.input_shape = {3}}),
                       doctest::Contains("export_onnx: Sequential[1].body Unknown() has no ONNX export"), error);
  auto path = temp_dir("onnx_failed") / "model.onnx";
  write_bytes(path, "previous");
  nn::Sequential cnn(nn::Conv2d(3, 4, 3), nn::ReLU());
  CHECK_THROWS_AS(io::export_onnx(cnn, path, {.input_shape = {1, 8, 8}}), error);
  CHECK_THROWS_AS(io::export_onnx(model, path, {.input_shape = {2, 3}}), error);
  CHECK(read_bytes(path) == "previous");
  CHECK(entries_starting_with(path.parent_path(), "model.onnx").size() == 1);
}

TEST_CASE("export_onnx: transformer graphs name every value once; attention layers check the sequence they read") {
  // A tiny GPT from float ids to logits: every value named once, every initializer used, the packed projection and
  // the Linears' weights transposed under their state_dict names.
  manual_seed(6);
  const nn::TransformerEncoderLayerOptions block{.dim_feedforward = 8, .batch_first = true};
  nn::Sequential gpt(nn::Embedding(10, 4), nn::LearnedPositionalEmbedding(6, 4, {.batch_first = true}),
                     nn::CausalTransformerLayer(4, 2, block), nn::LayerNorm(4), nn::Linear(4, 10));
  const auto g = read_graph(io::onnx_model_bytes(gpt, {.input_shape = {5}}));
  check_well_formed(g);
  CHECK(g.input_dims == std::vector<std::string>{"N", "5"});
  CHECK(g.output_dims == std::vector<std::string>{"N", "5", "10"});
  for (const char* name : {"0.weight", "1.weight", "2.self_attn.in_proj_weight_t", "2.self_attn.in_proj_bias",
                           "2.self_attn.out_proj.weight_t", "2.linear1.weight_t", "2.norm1.weight", "2.norm2.bias",
                           "4.weight_t"}) {
    CAPTURE(name);
    CHECK(std::count(g.initializers.begin(), g.initializers.end(), std::string(name)) == 1);
  }

  // The sequence each reads: the batch first or second as the layer says, its width, no longer than a table.
  nn::Sequential batch_first(nn::Linear(6, 6), nn::MultiheadAttention(8, 2, {.batch_first = true}));
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(batch_first, {.input_shape = {5, 6}}),
                       doctest::Contains("export_onnx: MultiheadAttention (batch_first) expects input of shape [N, "
                                         "seq, 8], found a value of shape [N, 5, 6] (at Sequential[1] "
                                         "MultiheadAttention("),
                       error);
  nn::Sequential time_major(nn::TransformerEncoderLayer(8, 2));
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(time_major, {.input_shape = {5, 8}}),
                       doctest::Contains("TransformerEncoderLayer without batch_first expects input of shape [seq, N, "
                                         "8] (the batch second: options.input_shape {seq, -1, 8}"),
                       error);
  nn::Sequential too_long(nn::SinusoidalPositionalEncoding(8, 4, {.batch_first = true}));
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(too_long, {.input_shape = {6, 8}}),
                       doctest::Contains("SinusoidalPositionalEncoding holds 4 positions and the sequence has 6"),
                       error);
  // What the graph does not hold: attention over keys of another width, a layer type whose forward is its own.
  nn::Sequential cross(nn::MultiheadAttention(8, 2, {.batch_first = true, .kdim = 4}));
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(cross, {.input_shape = {5, 8}}),
                       doctest::Contains("as self-attention, with kdim = vdim = embed_dim (8), found kdim 4 and "
                                         "vdim 8"),
                       error);
  struct own_layer : nn::TransformerEncoderLayer {
    using nn::TransformerEncoderLayer::TransformerEncoderLayer;
    std::string name() const override { return "OwnLayer"; }
  };
  nn::Sequential derived(own_layer(8, 2, {.batch_first = true}));
  CHECK_THROWS_WITH_AS(io::onnx_model_bytes(derived, {.input_shape = {5, 8}}),
                       doctest::Contains("expected a TransformerEncoderLayer or a CausalTransformerLayer, found "
                                         "OwnLayer"),
                       error);
}

TEST_CASE("export_onnx: CNN graphs name every value once, around the user's names, and use every initializer") {
  // Every kind of node the CNN layers write: Conv with and without bias, Pad (a ceil-mode average counting its
  // padding), both pools, the global pool's Flatten, BatchNormalization with and without affine, and LayerNorm as
  // one node (opset 17) and decomposed (opset 13).
  using net_type = Sequential<policy::cpu, Input<3, 7, 8>, Conv2D<4, 3, conv_options{.padding = 1}>, ReLU,
                              AvgPool2D<3, 2, 1, true>, Conv2D<4, 2, conv_options{.same = true, .bias = false}>,
                              BatchNorm2d<>, MaxPool2D<2, 3, 1, true>, Dropout<0.5>, BatchNorm2d<0.1, 1e-5, false>,
                              LayerNorm<2, 2>, GlobalAvgPool2D, Dense<3>, LayerNorm<>>;
  net_type net(2, 1);
  manual_seed(2);
  nn::Sequential model(nn::Conv2d(3, 4, 3, 1, 1), nn::ReLU(), nn::AvgPool2d(3, 2, 1, true),
                       nn::Conv2d(4, 4, 2, 1, "same", 1, 1, false), nn::BatchNorm2d(4), nn::MaxPool2d(2, 3, 1, true),
                       nn::Dropout(0.5f), nn::BatchNorm2d(4, 1e-5f, 0.1f, false), nn::LayerNorm(shape{2, 2}),
                       nn::GlobalAvgPool2d(), nn::Linear(4, 3), nn::LayerNorm(3));
  for (int opset : {13, 17}) {
    // Names the exporter generates for this model come back as the input and output names.
    const auto plain = read_graph(io::onnx_model_bytes(net, {.opset = opset}));
    REQUIRE(plain.node_outputs.size() > 12);
    const io::onnx_options named[] = {
        {.opset = opset},
        {.opset = opset, .input_name = plain.node_outputs.at(0), .output_name = plain.initializers.at(3)},
        {.opset = opset, .input_name = plain.initializers.at(0), .output_name = plain.node_outputs.at(12)}};
    for (auto options : named) {
      CAPTURE(opset);
      CAPTURE(options.input_name);
      auto s = read_graph(io::onnx_model_bytes(net, options));
      check_well_formed(s);
      CHECK(s.inputs.at(0) == options.input_name);
      CHECK(s.outputs.at(0) == options.output_name);
      options.input_shape = {3, 7, 8};
      auto d = read_graph(io::onnx_model_bytes(model, options));
      check_well_formed(d);
      CHECK(d.node_outputs == s.node_outputs);
      CHECK(d.initializers == s.initializers);
    }
  }
}

TEST_CASE("export_onnx: static SyncBatchNorm1d / 2d write BatchNorm1d / 2d's graph, bytes and names alike") {
  // SyncBatchNorm evaluates as BatchNorm, so it exports as BatchNorm: with and without affine, eps and momentum of
  // their own, trained alone first (BatchNorm's kernels) so that the running statistics are not the initial ones.
  using synced = Sequential<policy::cpu, Input<3, 6, 6>, Conv2D<4, 3>, SyncBatchNorm2d<>, ReLU, Conv2D<4, 1>,
                            SyncBatchNorm2d<0.2, 1e-3, false>, Flatten, Dense<5>, SyncBatchNorm1d<>, Dense<2>>;
  using plain = Sequential<policy::cpu, Input<3, 6, 6>, Conv2D<4, 3>, BatchNorm2d<>, ReLU, Conv2D<4, 1>,
                           BatchNorm2d<0.2, 1e-3, false>, Flatten, Dense<5>, BatchNorm1d<>, Dense<2>>;
  synced net(4, 1);
  random_generator rng(4);
  Tensor<float> x(shape{4, 3, 6, 6});
  for (auto& v : x.span()) v = 0.5f + rng.normal<float>();
  Tensor<std::int64_t> y(shape{4});
  for (auto& v : y.span()) v = static_cast<std::int64_t>(rng.below(2));
  optim::SGD sgd({.lr = 0.1});
  for (int step = 0; step < 3; ++step) net.train_step(x, y, loss::cross_entropy{}, sgd);
  plain same(4, 0);
  same.load_state_dict(net.state_dict());
  for (int opset : {13, 17}) {
    CAPTURE(opset);
    const std::string bytes = io::onnx_model_bytes(net, {.opset = opset});
    CHECK(bytes == io::onnx_model_bytes(same, {.opset = opset}));
    const auto g = read_graph(bytes);
    check_well_formed(g);
    // The running statistics the graph reads are the trained ones.
    for (const auto& [name, tensor] : net.state_dict()) {
      if (!name.ends_with("running_var")) continue;
      CAPTURE(name);
      const auto at = std::find(g.initializers.begin(), g.initializers.end(), name);
      REQUIRE(at != g.initializers.end());
      CHECK(g.initializer_data.at(static_cast<std::size_t>(at - g.initializers.begin())) ==
            std::string(reinterpret_cast<const char*>(tensor.data()),
                        static_cast<std::size_t>(tensor.numel()) * sizeof(float)));
      CHECK(std::ranges::none_of(tensor.span(), [](float v) { return v == 1.0f; }));
    }
  }
}

TEST_CASE("export_onnx: the graph is the evaluation-mode model whatever its mode, and Dropout writes nothing") {
  using net_type = Sequential<policy::cpu, Input<2, 6, 6>, Conv2D<3, 3>, BatchNorm2d<>, Dropout<0.5>, Flatten,
                              Dense<2>>;
  net_type net(4, 1);
  net.train();
  const std::string training = io::onnx_model_bytes(net);
  net.eval();
  CHECK(io::onnx_model_bytes(net) == training);
  manual_seed(3);
  nn::Sequential model(nn::Conv2d(2, 3, 3), nn::BatchNorm2d(3), nn::Dropout(0.5f), nn::Flatten(), nn::Linear(48, 2));
  model.train();
  const std::string dynamic_training = io::onnx_model_bytes(model, {.input_shape = {2, 6, 6}});
  model.eval();
  CHECK(io::onnx_model_bytes(model, {.input_shape = {2, 6, 6}}) == dynamic_training);

  // The same weights without the Dropout layers: the same nodes and weights, the weights named by their state_dict
  // ("1.weight" with the Dropout before, "0.weight" without).
  auto same_but_names = [](const std::string& with_dropout, const std::string& without_dropout) {
    const auto w = read_graph(with_dropout), wo = read_graph(without_dropout);
    CHECK(w.node_outputs == wo.node_outputs);
    CHECK(w.initializer_data == wo.initializer_data);
    CHECK(w.initializers == std::vector<std::string>{"1.bias", "1.weight"});
    CHECK(wo.initializers == std::vector<std::string>{"0.bias", "0.weight"});
  };
  Sequential<policy::cpu, Input<4>, Dropout<0.3>, Dense<2>, Dropout<0.1>> with(2, 7);
  Sequential<policy::cpu, Input<4>, Dense<2>> without(2, 7);
  same_but_names(io::onnx_model_bytes(with), io::onnx_model_bytes(without));
  manual_seed(8);
  nn::Sequential dynamic_with(nn::Dropout(0.3f), nn::Linear(4, 2), nn::Dropout(0.1f));
  manual_seed(8);
  nn::Sequential dynamic_without(nn::Linear(4, 2));
  same_but_names(io::onnx_model_bytes(dynamic_with, {.input_shape = {4}}),
                 io::onnx_model_bytes(dynamic_without, {.input_shape = {4}}));
}
