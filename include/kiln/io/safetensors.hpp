// Reading safetensors files (the format is described in kiln/io/safetensors_format.hpp, which also writes them).
// Every header field is validated before any tensor is used: a short file, a header length past the end, bad JSON,
// dtypes that are not safetensors', negative, oversized or mismatched shapes, offsets that do not tile the data exactly
// (out of range, overlapping, a gap, trailing bytes) all raise kiln::error naming the file and the byte offset, and
// what a header may cost is bounded (safetensors_limits). F16 and BF16 (and F64) tensors convert to float on the way
// in; other safetensors dtypes (BOOL, U8, ...) are read but not converted (to_tensor refuses them).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/json.hpp"
#include "kiln/io/regular_file.hpp"
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
  for (int c = 0; c <= static_cast<int>(st_dtype::f8_e5m2); ++c)
    if (s == st_dtype_name(static_cast<st_dtype>(c))) {
      d = static_cast<st_dtype>(c);
      return true;
    }
  return false;
}
// The element count of extents that are each non-negative, or -1 when the extents other than zeros multiply past
// index_t: a zero extent empties the tensor but not its row sizes and strides, which must still be computable.
inline std::int64_t st_checked_numel(const kiln::shape& s) {
  std::int64_t nonzero_product = 1;
  bool empty = false;
  for (int d = 0; d < s.rank(); ++d) {
    if (s[d] == 0) {
      empty = true;
      continue;
    }
    if (nonzero_product > std::numeric_limits<index_t>::max() / s[d]) return -1;
    nonzero_product *= s[d];
  }
  return empty ? 0 : nonzero_product;
}
}  // namespace detail

// What reading a safetensors file may cost beyond the file's own size: the header's length (the bound of the
// safetensors library's own reader) and what its JSON may hold (json::limits: a header of 80,000 tensors holds about
// 800,000 values).
struct safetensors_limits {
  std::uint64_t max_header_bytes = 100'000'000;
  json::limits header{};
};

// Parses a safetensors file held in memory; `source` names it in error messages.
KILN_LIBRARY_FUNCTION st_file parse_safetensors(std::string_view bytes, const std::string& source = "safetensors data",
                                                const safetensors_limits& limits = {});
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION st_file parse_safetensors(std::string_view bytes, const std::string& source,
                                                const safetensors_limits& limits) {
  if (bytes.size() < 8)
    fail("safetensors '", source, "': expected at least 8 bytes (the header length), found ", bytes.size());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  if (n > bytes.size() - 8)
    fail("safetensors '", source, "': the header length at byte 0 says ", n, " bytes, but only ", bytes.size() - 8,
         " follow it");
  if (n > limits.max_header_bytes)
    fail("safetensors '", source, "': the header length at byte 0 says ", n, " bytes, more than the limit of ",
         limits.max_header_bytes, " (safetensors_limits::max_header_bytes)");
  if (n < 2) fail("safetensors '", source, "': expected a JSON header of at least 2 bytes at byte 8, found ", n);
  json::value header;
  try {
    header = json::parse(bytes.substr(8, n), 8, limits.header);
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
      where("unsupported dtype '", dtype->as_string(), "' (not a safetensors dtype; kiln reads F32, F64, F16, BF16 and "
            "I64)");
    if (shape_v->as_array().size() > static_cast<std::size_t>(kiln::shape::max_rank))
      where("expected at most ", kiln::shape::max_rank, " dimensions, found ", shape_v->as_array().size());
    // json's own errors name only a byte; these name the tensor and the file too.
    auto integer = [&](const json::value& v, const char* field) {
      std::int64_t i = 0;
      try {
        i = v.as_int();
      } catch (const error& e) {
        where("expected integers in '", field, "': ", e.what());
      }
      return i;
    };
    for (const auto& d : shape_v->as_array()) {
      std::int64_t e = integer(d, "shape");
      if (e < 0) where("expected non-negative extents, found ", e);
      t.shape.push_back(e);
    }
    const std::int64_t numel = detail::st_checked_numel(t.shape);
    if (numel < 0)
      where("shape ", t.shape, " has more elements than kiln can index (", std::numeric_limits<index_t>::max(), ")");
    std::int64_t begin = integer(offsets->as_array()[0], "data_offsets");
    std::int64_t end = integer(offsets->as_array()[1], "data_offsets");
    if (begin < 0 || end < begin)
      where("expected data_offsets [begin, end] with 0 <= begin <= end, found [", begin, ", ", end, "]");
    if (static_cast<std::uint64_t>(end) > data_size)
      where("data_offsets [", begin, ", ", end, "] run past the end of the data (", data_size, " bytes, file byte ",
            data_start, " on)");
    // Compared before multiplying, so that the byte count cannot wrap around.
    if (static_cast<std::uint64_t>(numel) > data_size / st_dtype_size(t.dtype))
      where("shape ", t.shape, " of ", st_dtype_name(t.dtype), " needs more bytes than the file's data holds (",
            data_size, ")");
    std::uint64_t expected = static_cast<std::uint64_t>(numel) * st_dtype_size(t.dtype);
    if (static_cast<std::uint64_t>(end - begin) != expected)
      where("shape ", t.shape, " of ", st_dtype_name(t.dtype), " needs ", expected, " bytes, but data_offsets [",
            begin, ", ", end, "] hold ", end - begin);
    t.bytes.assign(bytes.substr(data_start + static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin)));
    ranges.push_back({static_cast<std::uint64_t>(begin), static_cast<std::uint64_t>(end), file.tensors.size()});
    file.tensors.push_back(std::move(t));
  }
  // Empty tensors first among those at one offset (a writer puts an empty tensor at the offset of the next one), ties
  // in header order.
  std::sort(ranges.begin(), ranges.end(), [](const range& a, const range& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    return a.end != b.end ? a.end < b.end : a.index < b.index;
  });
  // As the safetensors library requires, the tensors tile the data exactly: each starts where the one before it ends
  // (an empty tensor at that same offset), and the last ends at the end of the file.
  const range* previous = nullptr;
  std::uint64_t covered = 0;
  for (const auto& r : ranges) {
    if (r.begin < covered)
      fail("safetensors '", source, "': tensors '", file.tensors[previous->index].name, "' [", previous->begin, ", ",
           previous->end, ") and '", file.tensors[r.index].name, "' [", r.begin, ", ", r.end, ") overlap in the data");
    if (r.begin > covered)
      fail("safetensors '", source, "': tensor '", file.tensors[r.index].name, "' starts at data offset ", r.begin,
           ", expected ", covered, " (where ", previous ? "'" + file.tensors[previous->index].name + "' ends" :
           std::string("the data starts"), "): the data has a gap no tensor covers");
    covered = r.end;
    if (r.begin != r.end) previous = &r;
  }
  if (covered != data_size)
    fail("safetensors '", source, "': the tensors cover ", covered, " bytes of data, but the file holds ", data_size,
         " after its header (unexpected bytes at file byte ", data_start + covered, ")");
  // File order: by data offset, as the writer laid them out.
  std::vector<st_tensor> ordered;
  for (const auto& r : ranges) ordered.push_back(std::move(file.tensors[r.index]));
  file.tensors = std::move(ordered);
  return file;
}
#endif

// Reads and parses a whole safetensors file, which must be a regular file (see io/regular_file.hpp).
KILN_LIBRARY_FUNCTION st_file read_safetensors(const std::filesystem::path& path, const safetensors_limits& limits = {});
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION st_file read_safetensors(const std::filesystem::path& path, const safetensors_limits& limits) {
  return parse_safetensors(read_regular_file(path, "safetensors"), path.string(), limits);
}
#endif

namespace detail {
// The first I64 value of t that a floating T cannot hold exactly, if any. PyTorch stores counters such as BatchNorm's
// num_batches_tracked as int64 where kiln keeps them in the model's float buffer: such values convert, but integer
// data that would be rounded is refused rather than silently changed.
template <class T>
std::optional<std::int64_t> st_first_inexact(const st_tensor& t) {
  static_assert(std::is_floating_point_v<T>);
  constexpr T two_to_63 = T(9223372036854775808.0);
  for (std::size_t i = 0; i < t.bytes.size() / sizeof(std::int64_t); ++i) {
    std::int64_t v;
    std::memcpy(&v, t.bytes.data() + i * sizeof v, sizeof v);
    const T f = static_cast<T>(v);
    if (!(f >= -two_to_63 && f < two_to_63) || static_cast<std::int64_t>(f) != v) return v;
  }
  return std::nullopt;
}
// Why t's values cannot become T, or empty when they can.
template <class T>
std::string st_conversion_problem(const st_tensor& t) {
  std::ostringstream why;
  if (!st_is_readable(t.dtype)) {
    why << "unsupported dtype '" << st_dtype_name(t.dtype) << "' of '" << t.name
        << "' (kiln reads F32, F64, F16, BF16 and I64)";
  } else if (st_is_float(t.dtype) && !std::is_floating_point_v<T>) {
    why << "dtype " << st_dtype_name(t.dtype) << " of '" << t.name << "' disagrees with the model's integer values";
  } else if (t.dtype == st_dtype::i64) {
    if constexpr (std::is_floating_point_v<T>)
      if (auto v = st_first_inexact<T>(t))
        why << "dtype I64 of '" << t.name << "' holds " << *v << ", which the model's floating-point values cannot "
            << "hold exactly";
  }
  return why.str();
}
}  // namespace detail

// A tensor's values as T. Float dtypes (F32, F64, F16, BF16) convert to a floating T; I64 to an integral T, and to a
// floating T when every value is exactly representable (see detail::st_first_inexact). Other dtypes are refused.
template <class T>
Tensor<T> to_tensor(const st_tensor& t, const std::string& source = "safetensors data") {
  if (std::string problem = detail::st_conversion_problem<T>(t); !problem.empty())
    fail("safetensors '", source, "': ", problem);
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
    default: break;  // refused above
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
