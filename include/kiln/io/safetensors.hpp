// Reading safetensors files (the format is described in kiln/io/safetensors_format.hpp, which also writes them).
// Every header field is validated before any tensor is used: a short file, a header length past the end, bad JSON,
// unknown dtypes, negative or mismatched shapes, offsets out of range or overlapping all raise kiln::error naming
// the file and the byte offset. F16 and BF16 (and F64) tensors convert to float on the way in.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/json.hpp"
#include "kiln/io/safetensors_format.hpp"

namespace kiln::io {

namespace detail {
inline float half_to_float(std::uint16_t h) {
  std::uint32_t sign = std::uint32_t(h >> 15) << 31;
  std::uint32_t exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  std::uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf or nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: mantissa * 2^-24
    float f = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -f : f;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float bfloat_to_float(std::uint16_t b) {
  std::uint32_t bits = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline bool st_parse_dtype(std::string_view s, st_dtype& d) {
  for (st_dtype c : {st_dtype::f32, st_dtype::f64, st_dtype::f16, st_dtype::bf16, st_dtype::i64})
    if (s == st_dtype_name(c)) {
      d = c;
      return true;
    }
  return false;
}
}  // namespace detail

// Parses a safetensors file held in memory; `source` names it in error messages.
inline st_file parse_safetensors(std::string_view bytes, const std::string& source = "safetensors data") {
  if (bytes.size() < 8)
    fail("safetensors '", source, "': expected at least 8 bytes (the header length), found ", bytes.size());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  if (n > bytes.size() - 8)
    fail("safetensors '", source, "': the header length at byte 0 says ", n, " bytes, but only ", bytes.size() - 8,
         " follow it");
  if (n < 2) fail("safetensors '", source, "': expected a JSON header of at least 2 bytes at byte 8, found ", n);
  json::value header;
  try {
    header = json::parse(bytes.substr(8, n), 8);
  } catch (const error& e) {
    fail("safetensors '", source, "': bad header: ", e.what());
  }
  if (!header.is_object())
    fail("safetensors '", source, "': expected the header at byte 8 to be a JSON object, found ",
         json::value::kind_name(header.type()));
  const std::size_t data_start = 8 + static_cast<std::size_t>(n);
  const std::uint64_t data_size = bytes.size() - data_start;
  st_file file;
  struct range {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<range> ranges;
  for (const auto& [name, entry] : header.as_object()) {
    auto where = [&, name = name, at = entry.offset()](auto&&... parts) {
      fail("safetensors '", source, "': tensor '", name, "' (header byte ", at, "): ", parts...);
    };
    if (name == "__metadata__") {
      if (!entry.is_object()) where("expected __metadata__ to be an object of strings");
      for (const auto& [k, v] : entry.as_object()) {
        if (!v.is_string()) where("expected metadata value '", k, "' to be a string");
        file.metadata.emplace_back(k, v.as_string());
      }
      continue;
    }
    if (!entry.is_object()) where("expected an object with dtype, shape and data_offsets");
    const json::value* dtype = entry.find("dtype");
    const json::value* shape_v = entry.find("shape");
    const json::value* offsets = entry.find("data_offsets");
    if (!dtype || !dtype->is_string()) where("expected a string field 'dtype'");
    if (!shape_v || !shape_v->is_array()) where("expected an array field 'shape'");
    if (!offsets || !offsets->is_array() || offsets->as_array().size() != 2)
      where("expected a field 'data_offsets' of two integers");
    st_tensor t;
    t.name = name;
    if (!detail::st_parse_dtype(dtype->as_string(), t.dtype))
      where("unsupported dtype '", dtype->as_string(), "' (kiln reads F32, F64, F16, BF16 and I64)");
    if (shape_v->as_array().size() > static_cast<std::size_t>(kiln::shape::max_rank))
      where("expected at most ", kiln::shape::max_rank, " dimensions, found ", shape_v->as_array().size());
    std::uint64_t numel = 1;
    for (const auto& d : shape_v->as_array()) {
      if (!d.is_number()) where("expected integer extents in 'shape'");
      std::int64_t e = d.as_int();
      if (e < 0) where("expected non-negative extents, found ", e);
      t.shape.push_back(e);
      if (e && numel > std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(e))
        where("shape ", t.shape, " is too large");
      numel *= static_cast<std::uint64_t>(e);
    }
    std::int64_t begin = offsets->as_array()[0].as_int(), end = offsets->as_array()[1].as_int();
    if (begin < 0 || end < begin)
      where("expected data_offsets [begin, end] with 0 <= begin <= end, found [", begin, ", ", end, "]");
    if (static_cast<std::uint64_t>(end) > data_size)
      where("data_offsets [", begin, ", ", end, "] run past the end of the data (", data_size, " bytes, file byte ",
            data_start, " on)");
    std::uint64_t expected = numel * st_dtype_size(t.dtype);
    if (static_cast<std::uint64_t>(end - begin) != expected)
      where("shape ", t.shape, " of ", st_dtype_name(t.dtype), " needs ", expected, " bytes, but data_offsets [",
            begin, ", ", end, "] hold ", end - begin);
    t.bytes.assign(bytes.substr(data_start + static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin)));
    ranges.push_back({static_cast<std::uint64_t>(begin), static_cast<std::uint64_t>(end), file.tensors.size()});
    file.tensors.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end(), [](const range& a, const range& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      fail("safetensors '", source, "': tensors '", file.tensors[ranges[i - 1].index].name, "' [",
           ranges[i - 1].begin, ", ", ranges[i - 1].end, ") and '", file.tensors[ranges[i].index].name, "' [",
           ranges[i].begin, ", ", ranges[i].end, ") overlap in the data");
  // File order: by data offset, as the writer laid them out.
  std::vector<st_tensor> ordered;
  for (const auto& r : ranges) ordered.push_back(std::move(file.tensors[r.index]));
  file.tensors = std::move(ordered);
  return file;
}

// Reads and parses a whole safetensors file.
inline st_file read_safetensors(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("safetensors: cannot open '", path.string(), "' for reading");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("safetensors: reading '", path.string(), "' failed");
  return parse_safetensors(bytes, path.string());
}

// A tensor's values as T. Float dtypes (F32, F64, F16, BF16) convert to a floating T; I64 only to an integral T.
template <class T>
Tensor<T> to_tensor(const st_tensor& t, const std::string& source = "safetensors data") {
  if (st_is_float(t.dtype) != std::is_floating_point_v<T>)
    fail("safetensors '", source, "': tensor '", t.name, "' has dtype ", st_dtype_name(t.dtype),
         ", which disagrees with the model's ", std::is_floating_point_v<T> ? "floating-point" : "integer", " values");
  Tensor<T> out(t.shape);
  const char* src = t.bytes.data();
  const auto n = static_cast<std::size_t>(t.shape.numel());
  auto each = [&]<class S>(auto convert) {
    for (std::size_t i = 0; i < n; ++i) {
      S s;
      std::memcpy(&s, src + i * sizeof(S), sizeof(S));
      out.data()[i] = static_cast<T>(convert(s));
    }
  };
  auto same = [](auto v) { return v; };
  switch (t.dtype) {
    case st_dtype::f32: each.template operator()<float>(same); break;
    case st_dtype::f64: each.template operator()<double>(same); break;
    case st_dtype::i64: each.template operator()<std::int64_t>(same); break;
    case st_dtype::f16: each.template operator()<std::uint16_t>(detail::half_to_float); break;
    case st_dtype::bf16: each.template operator()<std::uint16_t>(detail::bfloat_to_float); break;
  }
  return out;
}

// Reads every tensor of a file as T, by name, in file order.
template <class T = float>
std::vector<std::pair<std::string, Tensor<T>>> read_state_dict(const std::filesystem::path& path) {
  st_file file = read_safetensors(path);
  std::vector<std::pair<std::string, Tensor<T>>> out;
  for (const auto& t : file.tensors) out.emplace_back(t.name, to_tensor<T>(t, path.string()));
  return out;
}

}  // namespace kiln::io
