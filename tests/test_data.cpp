// Data-layer readers: IDX (plain and gzip), CSV, NPY, MNIST, find_data_dir and scripts/fetch_data --check. Every kind
// of bad input must raise kiln::error naming the file and the byte offset or line, never crash.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <sstream>

#include "kiln/data/csv.hpp"
#include "kiln/data/find_data.hpp"
#include "kiln/data/idx.hpp"
#include "kiln/data/mnist.hpp"
#include "kiln/data/npy.hpp"
#include "test_data_helpers.hpp"

using namespace kiln;
using namespace kiln::data;
using namespace test_data;

namespace {
// The shared data directory next to the checkout, if this machine has one.
fs::path shared_data() {
  fs::path p = fs::path(KILN_SOURCE_DIR).parent_path() / "shared" / "data";
  return fs::is_directory(p) ? p : fs::path();
}
}  // namespace

TEST_CASE("idx: plain and gzip files of any rank") {
  auto plain = write_file("small-images-idx3", idx({3, 2, 4}, 24));
  auto gz = write_file("small-images-idx3.gz", gzip(idx({3, 2, 4}, 24)));
  for (const auto& path : {plain, gz}) {
    auto t = read_idx_images(path);
    CHECK(t.shape() == shape{3, 2, 4});
    CHECK(t[0] == 3);
    CHECK(t[23] == static_cast<std::uint8_t>(23 * 7 + 3));
  }
  auto labels = read_idx_labels<std::int64_t>(write_file("l-idx1.gz", gzip(idx({5}, 5))));
  CHECK(labels.shape() == shape{5});
  CHECK(labels[1] == 10);
  CHECK(read_idx(write_file("r5", idx({1, 2, 1, 2, 3}, 12))).shape() == shape{1, 2, 1, 2, 3});
  CHECK(read_idx(write_file("empty-idx1", idx({0}, 0))).numel() == 0);
}

TEST_CASE("idx: bad files raise kiln::error with the file name and byte offset") {
  // Truncated: the header promises 24 bytes, 20 are there (plain and compressed).
  check_error([] { read_idx(write_file("trunc-idx3", idx({3, 2, 4}, 20))); }, {"trunc-idx3", "byte offset 16", "24"});
  check_error([] { read_idx(write_file("trunc-idx3.gz", gzip(idx({3, 2, 4}, 20)))); },
              {"trunc-idx3.gz", "byte offset 16", "truncated"});
  // Truncated inside the header.
  check_error([] { read_idx(write_file("hdr-idx3", bytes{0, 0, 8, 3, 0, 0})); }, {"hdr-idx3", "byte offset 4", "truncated"});
  check_error([] { read_idx(write_file("empty", bytes{})); }, {"empty", "byte offset 0"});
  // Wrong magic, wrong type, wrong rank.
  check_error([] { read_idx(write_file("magic", bytes{'P', 'K', 3, 4, 0, 0, 0, 0})); }, {"magic", "byte offset 0", "magic"});
  check_error([] { read_idx(write_file("float-idx", idx({2}, 8, 0x0D))); }, {"float-idx", "byte offset 2", "0xd"});
  check_error([] { read_idx(write_file("rank0", bytes{0, 0, 8, 0})); }, {"rank0", "byte offset 3"});
  check_error([] { read_idx_images(write_file("labels-as-images", idx({4}, 4))); }, {"labels-as-images", "rank 3"});
  check_error([] { read_idx_labels(write_file("images-as-labels", idx({1, 2, 2}, 4))); }, {"images-as-labels", "rank 1"});
  // Counts that disagree with the file size: too long, both plain and compressed.
  check_error([] { read_idx(write_file("long-idx1", idx({4}, 6))); }, {"long-idx1", "byte offset 8", "file size"});
  check_error([] { read_idx(write_file("long-idx1.gz", gzip(idx({4}, 6)))); }, {"long-idx1.gz", "byte offset 12"});
  // A huge declared size must fail on validation, not on allocation: 4e9 x 4e9 x 4e9 and 60000 x 65535 x 65535.
  check_error([] { read_idx(write_file("huge-idx3", idx({4000000000u, 4000000000u, 4000000000u}, 16))); },
              {"huge-idx3", "byte offset 4"});
  // A gzip stream's size is known only at its end: the header's claim is refused by the reader's limit before any of
  // it is read, and with the limit raised the stream's end shows it truncated, memory growing only with the data read.
  check_error([] { read_idx(write_file("big-idx3.gz", gzip(idx({60000, 65535, 65535}, 100)))); },
              {"big-idx3.gz", "byte offset 4", "read_limits::max_bytes"});
  check_error([] { read_idx(temp_dir() / "big-idx3.gz", {.max_bytes = UINT64_MAX}); },
              {"big-idx3.gz", "byte offset 16", "truncated"});
  check_error([] { read_idx(write_file("big-idx3", idx({60000, 65535, 65535}, 100))); }, {"big-idx3", "byte offset 16"});
  // Nothing in it, but a row of 2^64 - 2^33 + 1 elements: every size computed from it after would overflow.
  check_error([] { read_idx(write_file("zero-huge-idx3", idx({0, 4294967295u, 4294967295u}, 0))); },
              {"zero-huge-idx3", "byte offset 4", "nonzero extents"});
  check_error([] { read_idx(temp_dir() / "no-such-file"); }, {"no-such-file"});
  check_error([] { read_idx(temp_dir()); }, {"directory"});
}

TEST_CASE("idx: corrupt and truncated gzip streams raise kiln::error") {
  bytes good = gzip(idx({50, 20, 20}, 20000));
  bytes flipped = good;
  for (std::size_t i = good.size() / 3; i < good.size() / 3 + 8; ++i) flipped[i] ^= 0x5A;
  check_error([&] { read_idx(write_file("flipped.gz", flipped)); }, {"flipped.gz", "byte offset", "gzip"});
  bytes cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(good.size() / 2));
  check_error([&] { read_idx(write_file("cut.gz", cut)); }, {"cut.gz", "byte offset"});
  bytes bad_crc = good;
  bad_crc[bad_crc.size() - 6] ^= 1;  // the CRC-32 in the gzip trailer
  check_error([&] { read_idx(write_file("crc.gz", bad_crc)); }, {"crc.gz", "byte offset"});
  bytes header_only(good.begin(), good.begin() + 5);  // gzip magic, then nothing
  check_error([&] { read_idx(write_file("hdronly.gz", header_only)); }, {"hdronly.gz", "byte offset 0"});
  // Every prefix and a sweep of single-byte corruptions of a small file: errors, never crashes.
  bytes small = gzip(idx({3, 5}, 15));
  for (std::size_t n = 0; n < small.size(); ++n)
    CHECK_THROWS_AS(read_idx(write_file("prefix.gz", bytes(small.begin(), small.begin() + static_cast<std::ptrdiff_t>(n)))),
                    kiln::error);
  int errors = 0;
  for (std::size_t i = 0; i < small.size(); ++i) {
    bytes b = small;
    b[i] ^= 0xFF;
    try {
      read_idx(write_file("sweep.gz", b));
    } catch (const kiln::error&) {
      ++errors;
    }
  }
  CHECK(errors > 0);
}

TEST_CASE("csv: quoting, CRLF, LF, missing final newline, column selection") {
  auto path = write_text("q.csv",
                         "\"Name\",\"x\",y,label\r\n"
                         "\"a, \"\"quoted\"\"\",1.5,-2,0\r\n"
                         "b,2,3e2,1\r\n"
                         "\"multi\nline\",  4 ,+5,2");
  auto t = read_csv(path, {.features = {"x", 2}, .label = "label"});
  CHECK(t.column_names == std::vector<std::string>{"Name", "x", "y", "label"});
  CHECK(t.feature_names == std::vector<std::string>{"x", "y"});
  CHECK(t.label_name == "label");
  REQUIRE(t.features.shape() == shape{3, 2});
  CHECK(t.features.at(0, 0) == 1.5f);
  CHECK(t.features.at(0, 1) == -2.0f);
  CHECK(t.features.at(1, 1) == 300.0f);
  CHECK(t.features.at(2, 0) == 4.0f);
  CHECK(t.features.at(2, 1) == 5.0f);
  CHECK(t.labels.shape() == shape{3});
  CHECK(t.labels[2] == 2.0f);
  // No header, LF ends, a final newline and a trailing blank line.
  auto lf = read_csv<double>(write_text("lf.csv", "1,2\n3,4\n\n"), {.label = 1, .header = false});
  CHECK(lf.features.shape() == shape{2, 1});
  CHECK(lf.labels[1] == 4.0);
}

TEST_CASE("csv: bad cells and ragged rows name the file, line and column") {
  auto bad = write_text("bad.csv", "a,b\r\n1,2\r\n3,x7\r\n");
  check_error([&] { read_csv(bad); }, {"bad.csv:3", "column 2", "'b'", "x7"});
  check_error([&] { read_csv(write_text("empty-cell.csv", "a,b\n1,\n")); }, {"empty-cell.csv:2", "column 2"});
  check_error([&] { read_csv(write_text("ragged.csv", "a,b\n1,2\n3,4\n5,6,7\n")); }, {"ragged.csv:4", "3", "ragged"});
  check_error([&] { read_csv(write_text("short.csv", "a,b\n1,2\n3")); }, {"short.csv:3", "ragged"});
  check_error([&] { read_csv(write_text("open.csv", "a,b\n1,\"2\n3,4\n")); }, {"open.csv:2", "unterminated"});
  check_error([&] { read_csv(write_text("after.csv", "a,b\n1,\"2\"x\n")); }, {"after.csv:2", "closing quote"});
  check_error([&] { read_csv(write_text("name.csv", "a,b\n1,2\n"), {.features = {"c"}}); }, {"name.csv", "'c'", "'a', 'b'"});
  check_error([&] { read_csv(write_text("index.csv", "a,b\n1,2\n"), {.label = 5}); }, {"index.csv", "5"});
  check_error([&] { read_csv(temp_dir() / "missing.csv"); }, {"missing.csv"});
  check_error([&] { read_csv(write_text("empty.csv", "")); }, {"empty.csv:1"});
  check_error([&] { read_csv(write_text("plusminus.csv", "a,b\n1,+-1\n")); }, {"plusminus.csv:2", "expected a number"});
  check_error([&] { read_csv<float>(write_text("huge.csv", "a,b\n1,3.5e38\n")); },
              {"huge.csv:2", "column 2", "out of the range of float"});
  // Below the smallest float reads as zero, as NumPy reads it; a single leading plus is allowed.
  auto tiny = read_csv<float>(write_text("tiny.csv", "a,b\n+2,1e-50\n"), {.label = std::string("a")});
  CHECK(tiny.labels[0] == 2.0f);
  CHECK(tiny.features[0] == 0.0f);
}

TEST_CASE("csv: the time series in shared/data") {
  fs::path root = shared_data();
  if (root.empty()) {
    MESSAGE("skipped: no shared/data next to the checkout");
    return;
  }
  auto air = read_csv<double>(root / "timeseries" / "airline-passengers.csv", {.features = {"Passengers"}});
  REQUIRE(air.rows() == 144);
  CHECK(air.features.at(0, 0) == 112.0);
  CHECK(air.features.at(143, 0) == 432.0);
  CHECK(std::accumulate(air.features.span().begin(), air.features.span().end(), 0.0) == 40363.0);
  auto temp = read_csv(root / "timeseries" / "daily-min-temperatures.csv", {.features = {"Temp"}, .label = "Temp"});
  REQUIRE(temp.rows() == 3650);
  CHECK(temp.features.at(0, 0) == 20.7f);
  CHECK(temp.labels[3649] == 13.0f);
  double mean = std::accumulate(temp.labels.span().begin(), temp.labels.span().end(), 0.0) / 3650;
  CHECK(mean == doctest::Approx(11.18).epsilon(0.001));
  // By default every column but the label is a feature: here the quoted dates, which are not numbers.
  check_error([&] { read_csv(root / "timeseries" / "daily-min-temperatures.csv", {.label = "Temp"}); },
              {"daily-min-temperatures.csv:2", "column 1", "'Date'", "1981-01-01"});
}

TEST_CASE("npy: round trip of every supported dtype, v1 header layout") {
  Tensor<float> f(shape{2, 3}, {1, 2, 3, 4, 5, 6.5f});
  write_npy(temp_dir() / "f.npy", f);
  auto raw = read_bytes(temp_dir() / "f.npy");
  CHECK(std::string(raw.begin() + 1, raw.begin() + 6) == "NUMPY");
  CHECK(raw[6] == 1);
  CHECK((raw.size() - 24) % 64 == 0);  // data starts on a 64-byte boundary
  auto back = read_npy<float>(temp_dir() / "f.npy");
  CHECK(back.shape() == shape{2, 3});
  CHECK(back.at(1, 2) == 6.5f);
  Tensor<std::int64_t> i(shape{4}, {-1, 2, 1LL << 40, 0});
  write_npy(temp_dir() / "i.npy", i);
  CHECK(read_npy<std::int64_t>(temp_dir() / "i.npy")[2] == (1LL << 40));
  Tensor<double> d(shape{1, 1, 2}, {0.25, -3});
  write_npy(temp_dir() / "d.npy", d);
  CHECK(read_npy<double>(temp_dir() / "d.npy").shape() == shape{1, 1, 2});
  Tensor<std::uint8_t> u(shape{0, 5});
  write_npy(temp_dir() / "u.npy", u);
  CHECK(read_npy<std::uint8_t>(temp_dir() / "u.npy").shape() == shape{0, 5});
  Tensor<float> scalar(shape{}, {7.0f});
  write_npy(temp_dir() / "s.npy", scalar);
  CHECK(read_npy<float>(temp_dir() / "s.npy")[0] == 7.0f);
  CHECK(read_npy_header(temp_dir() / "d.npy").descr == "<f8");
}

namespace {
bytes npy(const std::string& dict, std::size_t data_bytes, int major = 1) {
  std::string h = dict;
  while ((h.size() + 11 + (major > 1 ? 2 : 0)) % 64) h += ' ';
  h += '\n';
  std::string file = "\x93NUMPY";
  file += static_cast<char>(major);
  file += '\0';
  file += static_cast<char>(h.size() & 0xff);
  file += static_cast<char>(h.size() >> 8);
  if (major > 1) file += std::string(2, '\0');
  file += h;
  file += std::string(data_bytes, '\0');
  return bytes(file.begin(), file.end());
}
}  // namespace

TEST_CASE("npy: version 2.0 and unusual but valid headers") {
  auto t = read_npy<float>(write_file("v2.npy", npy("{\"descr\": \"<f4\", \"shape\": (2,), \"fortran_order\": False}", 8, 2)));
  CHECK(t.shape() == shape{2});
  CHECK(read_npy<std::uint8_t>(write_file("u1.npy", npy("{'descr': '|u1', 'fortran_order': False, 'shape': (3, 1), }", 3)))
            .shape() == shape{3, 1});
}

TEST_CASE("npy: unsupported or broken files raise kiln::error with file and byte offset") {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  check_error([&] { read_npy<float>(write_file("fortran.npy", npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24))); },
              {"fortran.npy", "byte offset", "fortran_order"});
  check_error([&] { read_npy<float>(write_file("big.npy", npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24))); },
              {"big.npy", "byte offset 1", "big-endian"});
  check_error([&] { read_npy<float>(write_file("c8.npy", npy("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16))); },
              {"c8.npy", "byte offset", "'<c8'"});
  check_error([&] { read_npy<double>(write_file("mismatch.npy", npy(ok, 24))); }, {"mismatch.npy", "'<f4'", "'<f8'"});
  bytes magic = npy(ok, 24);
  magic[1] = 'X';
  check_error([&] { read_npy<float>(write_file("magic.npy", magic)); }, {"magic.npy", "byte offset 0", "magic"});
  check_error([&] { read_npy<float>(write_file("trunc.npy", npy(ok, 20))); }, {"trunc.npy", "byte offset 128", "truncated"});
  check_error([&] { read_npy<float>(write_file("long.npy", npy(ok, 28))); }, {"long.npy", "byte offset 128"});
  check_error([&] { read_npy<float>(write_file("ver.npy", npy(ok, 24, 7))); }, {"ver.npy", "byte offset 6", "version"});
  check_error([&] { read_npy<float>(write_file("dict.npy", npy("{'descr': '<f4', 'shape': (2, 3), }", 24))); },
              {"dict.npy", "byte offset", "fortran_order"});
  check_error([&] { read_npy<float>(write_file("garbage.npy", npy("{'descr': '<f4', 'fortran_order': Maybe}", 24))); },
              {"garbage.npy", "byte offset", "True or False"});
  check_error([&] { read_npy<float>(write_file("huge.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", 0))); },
              {"huge.npy", "byte offset"});
  check_error([&] { read_npy<float>(write_file("zerohuge.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 281474976710656, 281474976710656), }", 0))); },
              {"zerohuge.npy", "byte offset", "nonzero extents"});
  check_error([&] { read_npy<float>(write_file("bigdecl.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }", 8))); },
              {"bigdecl.npy", "byte offset 128", "truncated"});
  bytes header_cut = npy(ok, 24);
  header_cut.resize(30);
  check_error([&] { read_npy<float>(write_file("hcut.npy", header_cut)); }, {"hcut.npy", "byte offset 10", "truncated"});
  // Every prefix of a valid file is an error, never a crash.
  bytes full = npy(ok, 24);
  for (std::size_t n = 0; n < full.size(); ++n)
    CHECK_THROWS_AS(read_npy<float>(write_file("prefix.npy", bytes(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)))),
                    kiln::error);
}

TEST_CASE("npy: a failed write leaves an existing file alone and no temporary behind") {
  Tensor<float> t(shape{2}, {1, 2});
  fs::path target = temp_dir() / "keep.npy";
  write_npy(target, t);
  auto before = read_bytes(target);
  fs::create_directories(temp_dir() / "a_directory");
  check_error([&] { write_npy(temp_dir() / "a_directory", t); }, {"a_directory", "cannot write"});
  CHECK(fs::is_directory(temp_dir() / "a_directory"));
  check_error([&] { write_npy(temp_dir() / "no" / "such" / "dir.npy", t); }, {"dir.npy", "cannot write"});
  for (const auto& entry : fs::directory_iterator(temp_dir()))
    CHECK_MESSAGE(entry.path().filename().string().find(".tmp-") == std::string::npos, entry.path());
  // Overwriting replaces the content in one step.
  write_npy(target, Tensor<float>(shape{3}, {4, 5, 6}));
  CHECK(read_npy<float>(target)[2] == 6.0f);
  CHECK(before.size() == read_bytes(target).size() - 4);
}

TEST_CASE("mnist: real files when the data directory is found") {
  fs::path dir;
  try {
    dir = find_data_dir("mnist");
  } catch (const kiln::error& e) {
    MESSAGE("skipped: ", e.what());
    return;
  }
  auto test = load_mnist(dir, split::test);
  REQUIRE(test.size() == 10000);
  check_error([&] { load_mnist(dir, split::test, {.limit = -1}); }, {"limit >= 0", "-1"});
  CHECK(test.sample_shape() == shape{28, 28});
  CHECK(test.label_shape() == shape{});
  std::vector<int> counts(10, 0);
  for (index_t i = 0; i < test.size(); ++i) ++counts[static_cast<std::size_t>(test.labels()[i])];
  CHECK(counts == std::vector<int>{980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009});
  float lo = 1, hi = 0;
  for (float v : test.features().span()) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(lo == 0.0f);
  CHECK(hi == 1.0f);
  auto norm = load_mnist(dir, split::train, {.mean = mnist_mean, .std = mnist_std, .limit = 100});
  CHECK(norm.size() == 100);
  CHECK(norm.features()[0] == doctest::Approx(-mnist_mean / mnist_std));
  // The headers straight from the files.
  auto labels = read_idx_labels(dir / "train-labels-idx1-ubyte.gz");
  CHECK(labels.shape() == shape{60000});
  CHECK(labels[0] == 5);  // the famous first training digit
  if (fs::path fashion = dir.parent_path() / "fashion-mnist"; fs::is_directory(fashion)) {
    auto f = load_mnist(fashion, split::test);
    CHECK(f.size() == 10000);
    std::vector<int> per_class(10, 0);
    for (index_t i = 0; i < f.size(); ++i) ++per_class[static_cast<std::size_t>(f.labels()[i])];
    CHECK(per_class == std::vector<int>(10, 1000));
  }
}

TEST_CASE("mnist: images and labels that disagree") {
  fs::path dir = temp_dir() / "fake-mnist";
  fs::create_directories(dir);
  std::ofstream(dir / "t10k-images-idx3-ubyte", std::ios::binary).write(reinterpret_cast<const char*>(idx({2, 28, 28}, 2 * 784).data()), 16 + 2 * 784);
  auto labels = gzip(idx({3}, 3));
  std::ofstream(dir / "t10k-labels-idx1-ubyte.gz", std::ios::binary).write(reinterpret_cast<const char*>(labels.data()), static_cast<std::streamsize>(labels.size()));
  check_error([&] { load_mnist(dir, split::test); }, {"t10k-labels-idx1-ubyte.gz", "3 labels", "2 images"});
  check_error([&] { load_mnist(dir, split::train); }, {"train-images-idx3-ubyte.gz", "fetch_data"});
}

TEST_CASE("find_data_dir: explicit path first, then a clear error listing every place tried") {
  fs::path root = temp_dir() / "data-root";
  fs::create_directories(root / "toy");
  CHECK(find_data_dir("toy", root) == root / "toy");
  CHECK(find_data_dir("toy", root / "toy") == root / "toy");
  ::setenv("KILN_DATA", root.c_str(), 1);
  CHECK(find_data_dir("toy") == root / "toy");
  ::unsetenv("KILN_DATA");
  try {
    find_data_dir("no-such-data-set", temp_dir() / "nowhere");
    FAIL("expected kiln::error");
  } catch (const kiln::error& e) {
    std::string m = e.what();
    INFO(m);
    CHECK(m.find("no-such-data-set") != std::string::npos);
    CHECK(m.find("--data") != std::string::npos);
    CHECK(m.find((temp_dir() / "nowhere" / "no-such-data-set").string()) != std::string::npos);
    CHECK(m.find("$KILN_DATA: (not set)") != std::string::npos);
    CHECK(m.find("./data") != std::string::npos);
    CHECK(m.find("../shared/data") != std::string::npos);
    CHECK(m.find("scripts/fetch_data") != std::string::npos);
    // --data, $KILN_DATA, ./data, ../shared/data, at least.
    CHECK(std::count(m.begin(), m.end(), '\n') >= 5);
  }
}

TEST_CASE("scripts/fetch_data --check verifies the MD5 sums of the local copies") {
  fs::path script = fs::path(KILN_SOURCE_DIR) / "scripts" / "fetch_data";
  REQUIRE(fs::exists(script));
  fs::path root = shared_data();
  if (root.empty() || !fs::is_directory(root / "mnist")) {
    MESSAGE("skipped: no shared/data/mnist next to the checkout");
    return;
  }
  fs::path log = temp_dir() / "fetch_check.log";
  auto check = [&](const fs::path& dir) {
    std::ostringstream command;
    command << '\'' << script.string() << "' --check '" << dir.string() << "' > '" << log.string() << "' 2>&1";
    return std::system(command.str().c_str());
  };
  CHECK(check(root / "mnist") == 0);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  INFO(text);
  CHECK(text.find("all MD5 sums match") != std::string::npos);
  // A copy with one byte changed must fail the check.
  fs::path bad = temp_dir() / "bad" / "mnist";
  fs::create_directories(bad);
  for (const auto& entry : fs::directory_iterator(root / "mnist")) fs::copy_file(entry.path(), bad / entry.path().filename());
  auto labels = read_bytes(bad / "t10k-labels-idx1-ubyte.gz");
  labels[100] ^= 1;
  fs::permissions(bad / "t10k-labels-idx1-ubyte.gz", fs::perms::owner_write, fs::perm_options::add);
  write_file("bad/mnist/t10k-labels-idx1-ubyte.gz", labels);
  CHECK(check(bad) != 0);
  std::ifstream again(log);
  std::string report((std::istreambuf_iterator<char>(again)), {});
  CHECK(report.find("BAD") != std::string::npos);
}
