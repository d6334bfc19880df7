// Hostile input: paths that are not regular files, and files whose size claims are small but whose cost would not be
// (deep or huge JSON, a safetensors header past its limit, gzip streams that inflate far, endless CSV lines, tensors
// that leave gaps in the data), each refused with a kiln::error naming the bound, within bounded memory; loading is
// linear in the number of tensors.
#include <doctest/doctest.h>
#include <malloc.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "io_test_files.hpp"
#include "test_data_helpers.hpp"
#include "kiln/data/data.hpp"
#include "kiln/dynamic/nn.hpp"
#include "kiln/io/checkpoint.hpp"
#include "kiln/io/json.hpp"
#include "kiln/io/safetensors.hpp"
#include "kiln/io/weights.hpp"
#include "kiln/kiln.hpp"

using namespace kiln;
namespace fs = std::filesystem;
using io_test::make_file;
using io_test::write_bytes;

// Live and peak heap bytes of this test program, for the memory bounds below.
namespace {
std::atomic<long long> live_bytes{0}, peak_bytes{0};
void note_allocation(void* p) {
  long long now = live_bytes.fetch_add(static_cast<long long>(malloc_usable_size(p))) +
                  static_cast<long long>(malloc_usable_size(p));
  long long peak = peak_bytes.load();
  while (now > peak && !peak_bytes.compare_exchange_weak(peak, now)) {
  }
}
// The peak of live heap bytes above what was live when the measure started, while f runs.
template <class F>
long long peak_heap_growth(F&& f) {
  const long long before = live_bytes.load();
  peak_bytes.store(before);
  f();
  return peak_bytes.load() - before;
}
}  // namespace

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t bytes) {
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p) throw std::bad_alloc();
  note_allocation(p);
  return p;
}
void* operator new[](std::size_t bytes) { return operator new(bytes); }
void* operator new(std::size_t bytes, std::align_val_t align) {
  const std::size_t a = static_cast<std::size_t>(align);
  void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a);
  if (!p) throw std::bad_alloc();
  note_allocation(p);
  return p;
}
void* operator new[](std::size_t bytes, std::align_val_t align) { return operator new(bytes, align); }
// The nothrow forms too (std::stable_sort's buffer takes one): every allocation is counted and freed by free().
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  void* p = std::malloc(bytes ? bytes : 1);
  if (p) note_allocation(p);
  return p;
}
void* operator new[](std::size_t bytes, const std::nothrow_t& tag) noexcept { return operator new(bytes, tag); }
void* operator new(std::size_t bytes, std::align_val_t align, const std::nothrow_t&) noexcept {
  const std::size_t a = static_cast<std::size_t>(align);
  void* p = std::aligned_alloc(a, (bytes + a - 1) / a * a);
  if (p) note_allocation(p);
  return p;
}
void* operator new[](std::size_t bytes, std::align_val_t align, const std::nothrow_t& tag) noexcept {
  return operator new(bytes, align, tag);
}
void operator delete(void* p) noexcept {
  if (p) live_bytes.fetch_sub(static_cast<long long>(malloc_usable_size(p)));
  std::free(p);
}
void operator delete[](void* p) noexcept { operator delete(p); }
void operator delete(void* p, std::size_t) noexcept { operator delete(p); }
void operator delete[](void* p, std::size_t) noexcept { operator delete(p); }
void operator delete(void* p, std::align_val_t) noexcept { operator delete(p); }
void operator delete[](void* p, std::align_val_t) noexcept { operator delete(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { operator delete(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { operator delete(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { operator delete(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { operator delete(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { operator delete(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { operator delete(p); }

namespace {

fs::path temp_dir(const std::string& name) { return io_test::fresh_dir("kiln_test_hostile_input", name); }
// An IDX header for `dims` followed by `zeros` zero bytes.
test_data::bytes idx_then_zeros(std::initializer_list<std::uint32_t> dims, std::size_t zeros) {
  test_data::bytes b = test_data::idx(dims, 0);
  b.resize(b.size() + zeros);
  return b;
}

using mlp = Sequential<policy::cpu, Input<4>, Dense<3>>;

}  // namespace

TEST_CASE("paths that are not regular files are refused by name, without blocking or reading forever") {
  auto dir = temp_dir("special");
  const fs::path fifo = dir / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  struct special {
    fs::path path;
    const char* found;
  };
  std::vector<special> paths = {{fifo, "found a FIFO"}, {dir, "found a directory"}};
  if (fs::exists("/dev/zero")) paths.push_back({"/dev/zero", "found a character device"});
  mlp net(1, 1);
  const auto before = net.state_dict();
  optim::Adam opt(net.parameters(), optim::adam_options{});
  for (const auto& [path, found] : paths) {
    CAPTURE(path);
    CHECK_THROWS_WITH_AS(io::read_safetensors(path), doctest::Contains(found), error);
    CHECK_THROWS_WITH_AS(io::load_weights(net, path), doctest::Contains(found), error);
    CHECK_THROWS_WITH_AS(io::load_checkpoint(path, net, opt), doctest::Contains(found), error);
    CHECK_THROWS_WITH_AS(data::read_csv(path), doctest::Contains(found), error);
    CHECK_THROWS_WITH_AS(data::read_idx(path), doctest::Contains(found), error);
    CHECK_THROWS_WITH_AS(data::read_npy<float>(path), doctest::Contains(found), error);
    CHECK_THROWS_WITH_AS(data::read_idx(path), doctest::Contains(doctest::String(("IDX: cannot read '" + path.string() + "'").c_str())), error);
  }
  const auto after = net.state_dict();
  for (std::size_t i = 0; i < before.size(); ++i)
    CHECK(std::equal(before[i].second.data(), before[i].second.data() + before[i].second.numel(),
                     after[i].second.data()));
}

TEST_CASE("json: nesting and value counts are bounded, and the bounds are settable") {
  // 100,000 levels would overflow the stack of a recursive parser without a depth bound.
  std::string deep(100000, '[');
  CHECK_THROWS_WITH_AS(io::json::parse(deep), doctest::Contains("nested more than 64 deep"), error);
  std::string d65 = std::string(65, '[') + std::string(65, ']');
  CHECK_THROWS_WITH_AS(io::json::parse(d65), doctest::Contains("json::limits::max_depth"), error);
  CHECK(io::json::parse(d65, 0, {.max_depth = 65}).is_array());
  CHECK(io::json::parse(std::string(64, '[') + std::string(64, ']')).is_array());

  // Three bytes per value: "[]," costs far more in memory than in text, so the count is what is bounded.
  std::string many = "[";
  for (int i = 0; i < 5000; ++i) many += "[],";
  many += "[]]";
  CHECK(io::json::parse(many).as_array().size() == 5001);
  CHECK_THROWS_WITH_AS(io::json::parse(many, 0, {.max_values = 5001}), doctest::Contains("more than 5001 values"),
                       error);
  CHECK_NOTHROW(io::json::parse(many, 0, {.max_values = 5002}));
}

TEST_CASE("json: memory per value is bounded, so max_values bounds a parse's memory") {
  // The costliest values per byte of text: empty arrays and one-digit numbers.
  for (const std::string item : {"[]", "0", "{}", "\"\""}) {
    CAPTURE(item);
    std::string text = "[";
    for (int i = 0; i < 100000; ++i) text.append(item).append(",");
    text.append(item).append("]");
    long long grown = peak_heap_growth([&] { CHECK(io::json::parse(text).as_array().size() == 100001); });
    const double per_value = static_cast<double>(grown) / 100001.0;
    MESSAGE("peak bytes per '", item, "' value: ", per_value);
    // The bound documented in io/json.hpp (with limits::max_values, the most a parse holds).
    CHECK(per_value <= io::json::max_bytes_per_value);
  }
}

TEST_CASE("safetensors: the header length is bounded (100 MB by default, as the safetensors library's reader)") {
  // A length of 2^40 in a 16-byte file: refused before anything is allocated for it.
  std::string claims(8, '\0');
  claims[5] = 1;
  claims += "{}      ";
  CHECK_THROWS_WITH_AS(io::parse_safetensors(claims, "claims"), doctest::Contains("but only 8 follow it"), error);
  // A header of 100 MB and 8 bytes that the file does hold: past the default limit, refused before it is parsed.
  const std::string huge = make_file(std::string(100'000'008, ' '));
  CHECK_THROWS_WITH_AS(io::parse_safetensors(huge, "huge"), doctest::Contains("more than the limit of 100000000"),
                       error);
  const std::string file = make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd");
  CHECK(io::parse_safetensors(file, "small").tensors.size() == 1);
  CHECK_THROWS_WITH_AS(io::parse_safetensors(file, "small", {.max_header_bytes = 16}),
                       doctest::Contains("safetensors_limits::max_header_bytes"), error);
  CHECK_THROWS_WITH_AS(io::parse_safetensors(file, "small", {.header = {.max_values = 4}}),
                       doctest::Contains("json::limits::max_values"), error);
}

TEST_CASE("safetensors: the tensors tile the data exactly: no gap, no trailing bytes") {
  const std::string a_then_b = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                               R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  CHECK_THROWS_WITH_AS(io::parse_safetensors(make_file(a_then_b, std::string(12, '\0')), "gap"),
                       doctest::Contains("tensor 'b' starts at data offset 8, expected 4"), error);
  const std::string at_4 = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  CHECK_THROWS_WITH_AS(io::parse_safetensors(make_file(at_4, std::string(8, '\0')), "lead"),
                       doctest::Contains("expected 0 (where the data starts)"), error);
  const std::string one = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  CHECK_THROWS_WITH_AS(io::parse_safetensors(make_file(one, std::string(6, '\0')), "trailing"),
                       doctest::Contains("the tensors cover 4 bytes of data, but the file holds 6"), error);
  CHECK(io::parse_safetensors(make_file(one, std::string(4, '\0')), "exact").tensors.size() == 1);
}

TEST_CASE("IDX and NPY: declared data beyond read_limits is refused before it is read, gzip or not") {
  auto dir = temp_dir("limits");
  // A gzip bomb: 64 MiB of zeros in a file of about 64 KB, honestly declared.
  const std::uint32_t n = 64u << 20;
  const fs::path bomb = dir / "bomb-idx1-ubyte.gz";
  test_data::write_gzip(bomb, idx_then_zeros({n}, n));
  CHECK(fs::file_size(bomb) < (1u << 20));
  long long grown = peak_heap_growth([&] {
    CHECK_THROWS_WITH_AS(data::read_idx(bomb, {.max_bytes = 1u << 20}),
                         doctest::Contains("more than the reader's limit of 1048576 (read_limits::max_bytes)"), error);
  });
  CHECK(grown < (8 << 20));
  // A header that promises little over a stream that inflates far: refused after the promised bytes.
  const fs::path liar = dir / "liar-idx1-ubyte.gz";
  test_data::write_gzip(liar, idx_then_zeros({1000}, n));
  grown = peak_heap_growth([&] {
    CHECK_THROWS_WITH_AS(data::read_idx(liar), doctest::Contains("unexpected data after the 1000 bytes"), error);
  });
  CHECK(grown < (8 << 20));
  // NPY: the same bound.
  const fs::path npy = dir / "big.npy";
  data::write_npy(npy, Tensor<float>(shape{1024}, 0.5f));
  CHECK(data::read_npy<float>(npy).numel() == 1024);
  CHECK_THROWS_WITH_AS(data::read_npy<float>(npy, {.max_bytes = 1000}),
                       doctest::Contains("4096 bytes of .npy data, more than the reader's limit of 1000"), error);
}

TEST_CASE("CSV: a line's length and its column count are bounded, and the bounds are settable") {
  auto dir = temp_dir("csv");
  // One line of 20 MiB of empty fields: ten million fields without a bound.
  const fs::path wide = dir / "wide.csv";
  write_bytes(wide, "a\n" + std::string(20u << 20, ','));
  long long grown = peak_heap_growth([&] {
    CHECK_THROWS_WITH_AS(data::read_csv(wide), doctest::Contains("wide.csv:2: expected at most 65536 columns"), error);
  });
  CHECK(grown < (64 << 20));  // the file's text and one bounded record
  const fs::path longline = dir / "long.csv";
  write_bytes(longline, "a\n" + std::string(17u << 20, '1') + "\n");
  CHECK_THROWS_WITH_AS(data::read_csv(longline),
                       doctest::Contains("long.csv:2: expected a line of at most 16777216 bytes"), error);
  const fs::path small = dir / "small.csv";
  write_bytes(small, "a,b,c\n1,2,3\n");
  CHECK(data::read_csv(small).rows() == 1);
  CHECK_THROWS_WITH_AS(data::read_csv(small, {.max_columns = 2}), doctest::Contains("csv_options::max_columns"),
                       error);
  CHECK_THROWS_WITH_AS(data::read_csv(small, {.max_line_bytes = 4}), doctest::Contains("csv_options::max_line_bytes"),
                       error);
}

namespace {
// A model of many small tensors: state_dict and load_state_dict over a flat list, as a large dynamic model's are.
struct many_tensors {
  using value_type = float;
  std::vector<std::pair<std::string, Tensor<float>>> tensors;
  explicit many_tensors(int n) {
    for (int i = 0; i < n; ++i) tensors.emplace_back("layers." + std::to_string(i) + ".weight", Tensor<float>(shape{2}, 0));
  }
  std::vector<std::pair<std::string, Tensor<float>>> state_dict() const { return tensors; }
  void load_state_dict(const std::vector<std::pair<std::string, Tensor<float>>>& d) { tensors = d; }
};
double seconds_to_load(int n, const fs::path& path) {
  many_tensors model(n);
  io::save_weights(model, path);
  many_tensors target(n);
  double best = 1e9;
  for (int round = 0; round < 3; ++round) {
    auto start = std::chrono::steady_clock::now();
    io::load_weights(target, path);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}
}  // namespace

TEST_CASE("load_weights is linear in the number of tensors") {
  auto dir = temp_dir("linear");
  // Four times the tensors: four times the time when linear, sixteen when quadratic. The ratio, not a time, is checked,
  // with a margin for a noisy machine.
  const double small = seconds_to_load(10000, dir / "small.safetensors");
  const double large = seconds_to_load(40000, dir / "large.safetensors");
  MESSAGE("load_weights: 10k tensors ", small, " s, 40k tensors ", large, " s");
  CHECK(large / small < 9.0);
}
