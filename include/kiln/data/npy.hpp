// NumPy .npy files (format versions 1.0, 2.0 and 3.0): the magic "\x93NUMPY", a version, a little-endian header length
// and a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } followed by raw C-order data.
// Supported element types: |u1, <i8, <f4, <f8 (what kiln tensors hold); everything else is a clear kiln::error.
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

#include "kiln/core/tensor.hpp"
#include "kiln/data/byte_source.hpp"
#include "kiln/io/atomic_file.hpp"

namespace kiln::data {

// The descr string numpy writes for each element type kiln reads and writes.
template <class T>
constexpr const char* npy_descr() {
  if constexpr (std::is_same_v<T, std::uint8_t>) return "|u1";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "<i8";
  else if constexpr (std::is_same_v<T, float>) return "<f4";
  else if constexpr (std::is_same_v<T, double>) return "<f8";
  else static_assert(sizeof(T) == 0, "npy supports std::uint8_t, std::int64_t, float and double");
}

// What an .npy header says: element type, memory order and shape, plus where the data starts.
struct npy_header {
  std::string descr;
  bool fortran_order = false;
  shape dims;
  std::uint64_t data_offset = 0;
};

namespace detail {

// A tiny parser for the one Python dict literal an .npy header holds: string keys, string / bool / int-tuple values.
class npy_dict_parser {
 public:
  npy_dict_parser(std::string_view text, const byte_source& in, std::uint64_t base) : text_(text), in_(in), base_(base) {}

  npy_header parse() {
    npy_header h;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      std::string key = string_literal();
      expect(':');
      skip_space();
      if (key == "descr") {
        h.descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
        have_order = true;
      } else if (key == "shape") {
        h.dims = tuple();
        have_shape = true;
      } else {
        error("unknown header key '", key, "'");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      if (peek() != '}') error("expected ',' or '}' in the header dict, found '", peek(), "'");
    }
    if (!have_descr || !have_order || !have_shape)
      error("the header dict must have the keys 'descr', 'fortran_order' and 'shape'");
    return h;
  }

 private:
  template <class... Parts>
  [[noreturn]] void error(const Parts&... parts) const {
    in_.fail_at(base_ + pos_, "bad .npy header: ", parts...);
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) error("expected '", c, "', found '", peek() ? std::string(1, peek()) : std::string("end"), "'");
    ++pos_;
  }
  std::string string_literal() {
    skip_space();
    char quote = peek();
    if (quote != '\'' && quote != '"') error("expected a quoted string");
    std::size_t start = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) ++pos_;
    if (pos_ >= text_.size()) error("unterminated string");
    return std::string(text_.substr(start, pos_++ - start));
  }
  bool boolean() {
    if (text_.substr(pos_).starts_with("True")) return pos_ += 4, true;
    if (text_.substr(pos_).starts_with("False")) return pos_ += 5, false;
    error("expected True or False");
  }
  shape tuple() {
    shape s;
    std::uint64_t product = 1;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(peek()))) error("expected a non-negative integer in the shape");
      std::uint64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        v = v * 10 + static_cast<std::uint64_t>(text_[pos_++] - '0');
        if (v > (std::uint64_t{1} << 48)) error("shape extent too large");
      }
      if (s.rank() == shape::max_rank) error("more than ", shape::max_rank, " dimensions");
      s.push_back(static_cast<index_t>(v));
      // Zeros left out: (0, 2**40, 2**40) holds nothing, but a row of it would overflow every size after.
      if (v != 0 && product > (std::uint64_t{1} << 48) / v)
        error("the shape ", s, " has nonzero extents that multiply past 2^48");
      if (v != 0) product *= v;
      skip_space();
      if (peek() == 'L') ++pos_;  // Python 2 long suffix
      skip_space();
      if (peek() == ',') ++pos_;
      else if (peek() != ')') error("expected ',' or ')' in the shape");
    }
    ++pos_;
    return s;
  }

  std::string_view text_;
  const byte_source& in_;
  std::uint64_t base_;
  std::size_t pos_ = 0;
};

inline std::uint64_t npy_item_size(const std::string& descr) {
  if (descr == "|u1" || descr == "<u1" || descr == ">u1") return 1;  // byte order is moot for one byte
  if (descr == "<i8" || descr == "<f8") return 8;
  if (descr == "<f4") return 4;
  return 0;
}

inline npy_header read_npy_header(byte_source& in) {
  unsigned char pre[8];
  in.read_exact(pre, 8, ".npy magic and version");
  if (std::string_view(reinterpret_cast<const char*>(pre), 6) != "\x93NUMPY")
    in.fail_at(0, "wrong magic: expected \\x93NUMPY (a NumPy .npy file)");
  int major = pre[6];
  if (major < 1 || major > 3)
    in.fail_at(6, "unsupported .npy format version ", major, ".", int{pre[7]}, " (expected 1.0, 2.0 or 3.0)");
  std::uint64_t header_len = 0;
  if (major == 1) {
    unsigned char b[2];
    in.read_exact(b, 2, ".npy header length");
    header_len = std::uint64_t{b[0]} | (std::uint64_t{b[1]} << 8);
  } else {
    unsigned char b[4];
    in.read_exact(b, 4, ".npy header length");
    header_len = std::uint64_t{b[0]} | (std::uint64_t{b[1]} << 8) | (std::uint64_t{b[2]} << 16) |
                 (std::uint64_t{b[3]} << 24);
  }
  const std::uint64_t base = in.offset();
  if (header_len > (1u << 20)) in.fail_at(8, "header length ", header_len, " is implausibly large");
  if (auto size = in.known_size(); size && base + header_len > *size)
    in.fail_at(base, "truncated: the header length says ", header_len, " bytes, the file has ", *size - base, " left");
  std::string text(static_cast<std::size_t>(header_len), '\0');
  in.read_exact(text.data(), text.size(), ".npy header");
  npy_header h = npy_dict_parser(text, in, base).parse();
  h.data_offset = base + header_len;

  auto where = [&] { return base + text.find("descr"); };
  if (!h.descr.empty() && h.descr[0] == '>' && h.descr != ">u1")
    in.fail_at(where(), "big-endian dtype '", h.descr, "' is not supported (save with the native '<' byte order)");
  if (npy_item_size(h.descr) == 0)
    in.fail_at(where(), "unsupported dtype '", h.descr, "' (supported: |u1, <i8, <f4, <f8)");
  if (h.fortran_order)
    in.fail_at(base + text.find("fortran_order"),
               "fortran_order True (column-major) is not supported: save a C-order array (np.ascontiguousarray)");
  return h;
}

}  // namespace detail

// Reads only the header: element type, order, shape and data offset.
inline npy_header read_npy_header(const std::filesystem::path& path) {
  byte_source in(path, "NPY");
  return detail::read_npy_header(in);
}

// Reads an .npy file whose dtype is exactly T's (|u1, <i8, <f4, <f8); anything else throws kiln::error naming the
// file and the byte offset. The data size is checked against the file size (and limits.max_bytes) before memory is
// allocated.
template <class T>
Tensor<T> read_npy(const std::filesystem::path& path, const read_limits& limits = {}) {
  byte_source in(path, "NPY");
  npy_header h = detail::read_npy_header(in);
  std::string want = npy_descr<T>();
  bool same = h.descr == want || (want == "|u1" && (h.descr == "<u1" || h.descr == ">u1"));
  if (!same)
    in.fail_at(10, "dtype '", h.descr, "' does not match the requested element type '", want,
               "': read it with the matching type (|u1 = std::uint8_t, <i8 = std::int64_t, <f4 = float, <f8 = double)");
  const std::uint64_t bytes = static_cast<std::uint64_t>(h.dims.numel()) * sizeof(T);
  if (auto size = in.known_size(); size && *size != h.data_offset + bytes)
    in.fail_at(h.data_offset, *size < h.data_offset + bytes ? "truncated: " : "too long: ", "shape ", h.dims, " of '",
               h.descr, "' needs ", bytes, " bytes of data, the file holds ", *size - h.data_offset);
  in.check_limit(h.data_offset, bytes, ".npy data", limits);
  Tensor<T> result;
  if (in.compressed()) {  // a gzipped .npy: same stream, size known only as it inflates
    std::vector<unsigned char> raw;
    in.read_exact_growing(raw, bytes, ".npy data");
    result = Tensor<T>(h.dims);
    if (bytes) std::memcpy(result.data(), raw.data(), raw.size());
  } else {
    result = Tensor<T>(h.dims);
    in.read_exact(result.data(), static_cast<std::size_t>(bytes), ".npy data");
  }
  if (!in.at_end()) in.fail_at(h.data_offset + bytes, "unexpected data after the ", bytes, " bytes shape ", h.dims, " needs");
  return result;
}

// Writes a tensor as an .npy v1.0 file (v2.0 if the header would not fit), through io::write_file_atomically: a
// failure never destroys an existing file, and a symlink planted next to it is never followed.
template <class T>
void write_npy(const std::filesystem::path& path, tensor_view<const T> tensor) {
  std::string dict = std::string("{'descr': '") + npy_descr<T>() + "', 'fortran_order': False, 'shape': (";
  for (int d = 0; d < tensor.rank(); ++d) dict += std::to_string(tensor.extent(d)) + (tensor.rank() == 1 ? ",)" : d + 1 < tensor.rank() ? ", " : ")");
  if (tensor.rank() == 0) dict += ")";
  dict += ", }";
  // Pad with spaces and end with '\n' so the data starts on a 64-byte boundary, as numpy does.
  bool v2 = dict.size() + 1 + 10 > 65535;
  std::size_t pre = v2 ? 12 : 10;
  std::size_t total = (pre + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - pre - dict.size() - 1, ' ');
  dict += '\n';
  std::string header = std::string("\x93NUMPY", 6) + char(v2 ? 2 : 1) + char(0);
  std::uint64_t len = dict.size();
  header += char(len & 0xff);
  header += char((len >> 8) & 0xff);
  if (v2) {
    header += char((len >> 16) & 0xff);
    header += char((len >> 24) & 0xff);
  }
  header += dict;

  const std::size_t data_bytes = static_cast<std::size_t>(tensor.numel()) * sizeof(T);
  try {
    const std::string_view data(reinterpret_cast<const char*>(tensor.data()), data_bytes);
    io::write_file_atomically(path, {header, data});
  } catch (const error& e) {
    fail(path.string(), ": cannot write: ", e.what(), "; the original file is untouched");
  }
}
template <class T>
void write_npy(const std::filesystem::path& path, const Tensor<T>& tensor) {
  write_npy<T>(path, tensor.view());
}

}  // namespace kiln::data
