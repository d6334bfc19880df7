// Weights I/O: safetensors reading and writing, PyTorch-written files in both modes, malformed files, the JSON reader.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "fixture.hpp"
#include "io_test_files.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/io/json.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/io/weights.hpp"
#include "kiln/io/protobuf.hpp"
#include "kiln/kiln.hpp"
#include "kiln/train/ensemble.hpp"

using namespace kiln;
namespace fs = std::filesystem;
using io_test::make_file;
using io_test::read_bytes;
using io_test::write_bytes;

namespace {

using static_mlp = Sequential<policy::cpu, Input<3, 4>, Flatten, Dense<8, ReLU>, Dense<5>>;
nn::Sequential dynamic_mlp(std::uint64_t seed) {
  manual_seed(seed);
  return nn::Sequential(nn::Flatten(), nn::Linear(12, 8), nn::ReLU(), nn::Linear(8, 5));
}

fs::path temp_path(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / "kiln_test_io";
  fs::create_directories(dir);
  return dir / name;
}
Tensor<float> dynamic_forward(nn::Sequential& m, const Tensor<float>& x) {
  nn::no_grad guard;
  return m(nn::Variable(x)).tensor();
}
template <class Dict>
bool same_values(const Dict& a, const Dict& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !(a[i].second.shape() == b[i].second.shape())) return false;
    for (index_t k = 0; k < a[i].second.numel(); ++k)
      if (a[i].second[k] != b[i].second[k]) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("json: values, nesting, escapes and byte offsets in errors") {
  auto v = io::json::parse(R"( {"a": [1, -2.5e3, true, null], "b": {"c": "x\"y\u00e9\n"}, "big": 18446744073709551} )");
  REQUIRE(v.is_object());
  CHECK(v.find("a")->as_array().size() == 4);
  CHECK(v.find("a")->as_array()[0].as_int() == 1);
  CHECK(v.find("a")->as_array()[1].as_double() == -2500.0);
  CHECK(v.find("a")->as_array()[2].as_bool());
  CHECK(v.find("a")->as_array()[3].is_null());
  CHECK(v.find("b")->find("c")->as_string() == "x\"y\xc3\xa9\n");
  CHECK(v.find("big")->as_int() == 18446744073709551LL);
  CHECK(v.find("missing") == nullptr);
  CHECK_THROWS_WITH_AS(io::json::parse("{\"a\": [1, 2}"), doctest::Contains("at byte 11"), error);
  CHECK_THROWS_WITH_AS(io::json::parse("{\"a\" 1}"), doctest::Contains("expected ':'"), error);
  CHECK_THROWS_WITH_AS(io::json::parse("[1, 2] x"), doctest::Contains("end of the JSON text at byte 7"), error);
  CHECK_THROWS_WITH_AS(io::json::parse("\"abc"), doctest::Contains("unterminated"), error);
  CHECK_THROWS_WITH_AS(io::json::parse("{\"a\":1,\"a\":2}"), doctest::Contains("duplicate key 'a'"), error);
  CHECK_THROWS_WITH_AS(io::json::parse("01"), doctest::Contains("byte 1"), error);
  CHECK_THROWS_AS(io::json::parse(std::string(100, '[')), error);
  CHECK_THROWS_WITH_AS(io::json::parse("[1.5]").as_array()[0].as_int(), doctest::Contains("integer"), error);
}

TEST_CASE("safetensors: write and read back every dtype, with metadata") {
  io::st_file file;
  Tensor<float> f(shape{2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor<double> d(shape{2}, {0.1, -1e300});
  Tensor<std::int64_t> i(shape{3}, {-1, 0, std::int64_t(1) << 40});
  Tensor<float> empty(shape{0, 4});
  file.add("f", f);
  file.add("d", d);
  file.add("i", i);
  file.add("e", empty);
  file.metadata = {{"format", "pt"}, {"quote\"d", "line\nbreak"}};
  auto path = temp_path("all.safetensors");
  io::write_safetensors(path, file);
  std::string bytes = read_bytes(path);
  CHECK((bytes.size() - 8 - (static_cast<unsigned char>(bytes[0]) | static_cast<unsigned char>(bytes[1]) << 8)) ==
        6 * 4 + 2 * 8 + 3 * 8);
  CHECK((static_cast<unsigned char>(bytes[0]) % 8) == 0);  // header padded to 8 bytes
  for (const auto& e : fs::directory_iterator(path.parent_path()))  // no temporary left beside it
    CHECK(e.path().filename().string().rfind("all.safetensors.tmp-kiln", 0) != 0);
  auto back = io::read_safetensors(path);
  REQUIRE(back.tensors.size() == 4);
  CHECK(*back.meta("quote\"d") == "line\nbreak");
  auto f2 = io::to_tensor<float>(*back.find("f"));
  CHECK(f2.shape() == shape{2, 3});
  CHECK(f2[5] == 6.0f);
  CHECK(io::to_tensor<double>(*back.find("d"))[1] == -1e300);
  CHECK(io::to_tensor<std::int64_t>(*back.find("i"))[2] == (std::int64_t(1) << 40));
  CHECK(io::to_tensor<float>(*back.find("e")).shape() == shape{0, 4});
  CHECK(io::to_tensor<float>(*back.find("i"))[2] == 1099511627776.0f);  // integers that float holds exactly convert
  CHECK_THROWS_WITH_AS(io::to_tensor<std::int64_t>(*back.find("f")), doctest::Contains("disagrees"), error);
}

TEST_CASE("safetensors: F16 and BF16 convert to float") {
  // 1.0, -2.0, 65504 (largest half), smallest subnormal 2^-24, inf; bf16: 1.0, -3.0
  std::string half = make_file(R"({"h":{"dtype":"F16","shape":[5],"data_offsets":[0,10]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[10,14]}})",
                               std::string("\x00\x3c\x00\xc0\xff\x7b\x01\x00\x00\x7c", 10) + std::string("\x80\x3f\x40\xc0", 4));
  auto file = io::parse_safetensors(half);
  auto h = io::to_tensor<float>(*file.find("h"));
  CHECK(h[0] == 1.0f);
  CHECK(h[1] == -2.0f);
  CHECK(h[2] == 65504.0f);
  CHECK(h[3] == std::ldexp(1.0f, -24));
  CHECK(std::isinf(h[4]));
  auto b = io::to_tensor<float>(*file.find("b"));
  CHECK(b[0] == 1.0f);
  CHECK(b[1] == -3.0f);
}

TEST_CASE("safetensors: PyTorch-written files load into both modes and give PyTorch's outputs") {
  test::fixture fx("io_mlp");
  auto x = fx.f32("x");
  for (const char* dtype : {"f32", "f64", "f16", "bf16"}) {
    CAPTURE(dtype);
    std::string file = std::string(KILN_FIXTURE_DIR) + "/io_mlp_" + dtype + ".safetensors";
    auto expected = fx.f32(std::string("y_") + dtype);

    static_mlp net(8, 1);
    io::load_weights(net, file);
    test::check_close(net.predict(x).span(), expected, "static");

    auto model = dynamic_mlp(1);
    io::load_weights(model, file);
    test::check_close(dynamic_forward(model, x).span(), expected, "dynamic");
  }
}

TEST_CASE("save_weights / load_weights round trip in both modes, and across modes") {
  static_mlp a(8, 7), b(8, 99);
  auto path = temp_path("static.safetensors");
  io::save_weights(a, path, {{"note", "round trip"}});
  io::load_weights(b, path);
  CHECK(same_values(a.state_dict(), b.state_dict()));
  CHECK(*io::read_safetensors(path).meta("note") == "round trip");

  auto m = dynamic_mlp(99);
  io::load_weights(m, path);  // static's file into dynamic
  CHECK(same_values(a.state_dict(), m.state_dict()));
  auto n = dynamic_mlp(5);
  auto dpath = temp_path("dynamic.safetensors");
  io::save_weights(m, dpath);
  io::load_weights(n, dpath);
  CHECK(same_values(m.state_dict(), n.state_dict()));
  static_mlp c(8, 3);
  io::load_weights(c, dpath);  // dynamic's file into static
  CHECK(same_values(a.state_dict(), c.state_dict()));
  auto plain = temp_path("static_plain.safetensors");
  io::save_weights(a, plain);
  CHECK(read_bytes(plain) == read_bytes(dpath));  // same names, same order, same bytes

  // Non-strict loading with an excluded head: the head keeps its values.
  static_mlp d(8, 11);
  auto head_before = d.state_dict()[2].second;
  io::load_weights(d, path, {.strict = false, .exclude = {"3."}});
  auto da = a.state_dict(), dd = d.state_dict();
  CHECK(same_values(decltype(da)(da.begin(), da.begin() + 2), decltype(dd)(dd.begin(), dd.begin() + 2)));
  CHECK(dd[2].second[0] == head_before[0]);
  CHECK(dd[2].second[0] != da[2].second[0]);
}

TEST_CASE("malformed safetensors raise kiln::error and leave the model unchanged") {
  const std::string good_header = R"({"1.weight":{"dtype":"F32","shape":[8,12],"data_offsets":[0,384]},)"
                                  R"("1.bias":{"dtype":"F32","shape":[8],"data_offsets":[384,416]},)"
                                  R"("3.weight":{"dtype":"F32","shape":[5,8],"data_offsets":[416,576]},)"
                                  R"("3.bias":{"dtype":"F32","shape":[5],"data_offsets":[576,596]}})";
  // 1.bias holds 0x7f bytes: read as I64 they are integers float cannot hold exactly (the dtype case below).
  std::string data(596, '\0');
  data.replace(384, 32, 32, '\x7f');
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string h = good_header;
    auto at = h.find(from);
    REQUIRE(at != std::string::npos);
    return h.replace(at, from.size(), to);
  };
  struct bad_case {
    const char* what;
    std::string bytes;
    const char* message;
  };
  std::string huge_length = make_file(good_header, data);
  huge_length[4] = 1;  // header length 2^32 + ...
  const bad_case cases[] = {
      {"short file", std::string("\x10\x00\x00", 3), "at least 8 bytes"},
      {"header length past the end", huge_length, "only"},
      {"bad JSON", make_file(replaced("\"shape\":[8,12]", "\"shape\":[8,12"), data), "byte"},
      {"not an object", make_file("[1,2]", data), "JSON object"},
      {"offsets out of range", make_file(replaced("[576,596]", "[576,600]"), data), "past the end of the data"},
      {"offsets disagree with shape", make_file(replaced("[384,416]", "[384,412]"), data), "needs 32 bytes"},
      {"overlapping", make_file(replaced("\"data_offsets\":[384,416]", "\"data_offsets\":[380,412]"), data), "overlap"},
      {"unknown dtype", make_file(replaced("\"F32\",\"shape\":[8]", "\"U8\",\"shape\":[32]"), data), "unsupported dtype 'U8'"},
      {"negative extent", make_file(replaced("[5,8]", "[-5,8]"), data), "non-negative"},
      {"shape disagrees with the model", make_file(replaced("\"shape\":[5,8],\"data_offsets\":[416,576]", "\"shape\":[8,5],\"data_offsets\":[416,576]"), data), "shape mismatch for '3.weight'"},
      {"dtype disagrees with the model", make_file(replaced("\"F32\",\"shape\":[8]", "\"I64\",\"shape\":[4]"), data), "dtype I64 of '1.bias'"},
      {"unknown name", make_file(replaced("\"3.bias\"", "\"4.bias\""), data), "unexpected tensor '4.bias'"},
      // Its bytes go too: the tensors must tile the data exactly.
      {"missing name", make_file(replaced(R"(,"3.bias":{"dtype":"F32","shape":[5],"data_offsets":[576,596]})", ""), data.substr(0, 576)), "missing tensor '3.bias'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    auto path = temp_path("bad.safetensors");
    write_bytes(path, c.bytes);
    static_mlp net(4, 3);
    auto before = net.state_dict();
    CHECK_THROWS_WITH_AS(io::load_weights(net, path), doctest::Contains(c.message), error);
    CHECK(same_values(before, net.state_dict()));
    auto model = dynamic_mlp(3);
    auto dyn_before = model.state_dict();
    CHECK_THROWS_WITH_AS(io::load_weights(model, path), doctest::Contains(c.message), error);
    CHECK(same_values(dyn_before, model.state_dict()));
  }
  // The good file does load (the cases above fail for their stated reason only).
  auto path = temp_path("good.safetensors");
  write_bytes(path, make_file(good_header, data));
  static_mlp net(4, 3);
  io::load_weights(net, path);
  CHECK(net.state_dict()[0].second[0] == 0.0f);
  CHECK_THROWS_WITH_AS(io::load_weights(net, temp_path("does_not_exist.safetensors")), doctest::Contains("cannot open"),
                       error);
}

// A failed write leaving the previous file intact: see test_io_robustness.cpp (write_file_atomically).

TEST_CASE("protobuf wire format: varints, tags, nested messages") {
  std::string v;
  io::protobuf::message::put_varint(v, 300);
  CHECK(v == "\xac\x02");
  io::protobuf::message inner;
  inner.varint(1, 150);
  CHECK(inner.str() == "\x08\x96\x01");
  io::protobuf::message outer;
  outer.nested(3, inner).bytes(2, "hi").varint(4, -1);
  CHECK(outer.str() == std::string("\x1a\x03\x08\x96\x01\x12\x02hi\x20") + std::string(9, '\xff') + "\x01");
}

TEST_CASE("static freeze: frozen layers keep their weights, the rest train; dynamic set_requires_grad does the same") {
  Tensor<float> x(shape{4, 3, 4}, 0.3f);
  Tensor<std::int64_t> y(shape{4}, {0, 1, 2, 3});
  static_mlp net(4, 1);
  net.freeze(1);
  CHECK(net.is_frozen(1));
  CHECK(!net.is_frozen(2));
  CHECK(net.trainable_parameter_count() == 5 * 8 + 5);
  auto before = net.state_dict();
  optim::Adam opt({.lr = 0.1});
  for (int i = 0; i < 3; ++i) net.train_step(x.view(), y.view(), loss::cross_entropy{}, opt);
  auto after = net.state_dict();
  CHECK(after[0].second[0] == before[0].second[0]);  // 1.weight frozen
  CHECK(after[1].second[0] == before[1].second[0]);  // 1.bias frozen
  CHECK(after[2].second[0] != before[2].second[0]);  // 3.weight trained
  net.unfreeze(1);
  net.train_step(x.view(), y.view(), loss::cross_entropy{}, opt);
  CHECK(net.state_dict()[0].second[0] != before[0].second[0]);
  CHECK_THROWS_AS(net.freeze(4), error);

  auto m = dynamic_mlp(1);
  for (auto& p : m[1].parameters()) p.set_requires_grad(false);
  auto dbefore = m.state_dict();
  optim::Adam dopt(m.parameters(), {.lr = 0.1});
  dopt.zero_grad();
  auto l = nn::cross_entropy(m(nn::Variable(x)), y.span());
  l.backward();
  dopt.step();
  auto dafter = m.state_dict();
  CHECK(dafter[0].second[0] == dbefore[0].second[0]);
  CHECK(dafter[2].second[0] != dbefore[2].second[0]);
}

TEST_CASE("ensemble: averages probabilities or outputs and votes, over models of both modes") {
  static_mlp a(8, 1), b(8, 2);
  auto c = dynamic_mlp(3);
  ensemble ens;
  ens.add(a).add(b).add(c);
  CHECK(ens.size() == 3);
  Tensor<float> x(shape{5, 3, 4});
  random_generator rng(4);
  for (float& v : x.span()) v = rng.normal<float>();
  auto pa = a.predict(x), pb = b.predict(x), pc = dynamic_forward(c, x);
  auto raw = ens.predict(x, ensemble_average::outputs);
  for (index_t k = 0; k < raw.numel(); ++k) CHECK(raw[k] == doctest::Approx((pa[k] + pb[k] + pc[k]) / 3).epsilon(1e-6));
  auto prob = ens.predict(x);
  for (index_t r = 0; r < 5; ++r) {
    float sum = 0;
    for (index_t k = 0; k < 5; ++k) sum += prob.at(r, k);
    CHECK(sum == doctest::Approx(1.0f).epsilon(1e-5));
  }
  // Vote: with three models the majority class wins whenever two agree.
  auto votes = ens.vote(x);
  auto ca = ensemble::argmax(pa), cb = ensemble::argmax(pb), cc = ensemble::argmax(pc);
  for (index_t r = 0; r < 5; ++r) {
    if (ca[r] == cb[r] || ca[r] == cc[r]) CHECK(votes[r] == ca[r]);
    else if (cb[r] == cc[r]) CHECK(votes[r] == cb[r]);
  }
  CHECK(ensemble::accuracy(votes, votes.view()) == 1.0);
  ensemble empty;
  CHECK_THROWS_AS(empty.predict(x), error);
}
