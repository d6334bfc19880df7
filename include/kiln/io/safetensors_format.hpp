// The safetensors format (Hugging Face), the writing half: an 8-byte little-endian header length N, N bytes of JSON
// header ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}},
// padded with spaces to a multiple of 8), then the raw little-endian tensor data, offsets counted from its start.
// This header needs no JSON parser, so training code can write weights without pulling in the reader
// (kiln/io/safetensors.hpp).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/shape.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/io/atomic_file.hpp"

namespace kiln::io {

static_assert(std::endian::native == std::endian::little, "kiln's safetensors I/O assumes a little-endian host");

// The element types of the safetensors format. kiln converts the first five (F16 and BF16 are read as float); the
// others are only laid out and skipped, so that a file holding, say, a BOOL mask still loads when that tensor is
// excluded or not part of the model.
enum class st_dtype { f32, f64, f16, bf16, i64, boolean, u8, i8, i16, u16, i32, u32, u64, f8_e4m3, f8_e5m2 };

constexpr const char* st_dtype_name(st_dtype d) {
  switch (d) {
    case st_dtype::f32: return "F32";
    case st_dtype::f64: return "F64";
    case st_dtype::f16: return "F16";
    case st_dtype::bf16: return "BF16";
    case st_dtype::i64: return "I64";
    case st_dtype::boolean: return "BOOL";
    case st_dtype::u8: return "U8";
    case st_dtype::i8: return "I8";
    case st_dtype::i16: return "I16";
    case st_dtype::u16: return "U16";
    case st_dtype::i32: return "I32";
    case st_dtype::u32: return "U32";
    case st_dtype::u64: return "U64";
    case st_dtype::f8_e4m3: return "F8_E4M3";
    case st_dtype::f8_e5m2: return "F8_E5M2";
  }
  return "?";
}
constexpr std::size_t st_dtype_size(st_dtype d) {
  switch (d) {
    case st_dtype::f32: return 4;
    case st_dtype::f64: return 8;
    case st_dtype::f16: return 2;
    case st_dtype::bf16: return 2;
    case st_dtype::i64: return 8;
    case st_dtype::boolean: return 1;
    case st_dtype::u8: return 1;
    case st_dtype::i8: return 1;
    case st_dtype::i16: return 2;
    case st_dtype::u16: return 2;
    case st_dtype::i32: return 4;
    case st_dtype::u32: return 4;
    case st_dtype::u64: return 8;
    case st_dtype::f8_e4m3: return 1;
    case st_dtype::f8_e5m2: return 1;
  }
  return 0;
}
// The dtypes whose values kiln converts (to_tensor).
constexpr bool st_is_readable(st_dtype d) { return d <= st_dtype::i64; }
constexpr bool st_is_float(st_dtype d) {
  return d == st_dtype::f32 || d == st_dtype::f64 || d == st_dtype::f16 || d == st_dtype::bf16;
}

// The safetensors dtype of a C++ element type.
template <class T>
constexpr st_dtype st_dtype_of() {
  if constexpr (std::is_same_v<T, float>) return st_dtype::f32;
  else if constexpr (std::is_same_v<T, double>) return st_dtype::f64;
  else if constexpr (std::is_same_v<T, std::int64_t>) return st_dtype::i64;
  else static_assert(sizeof(T) == 0, "safetensors: kiln stores float, double and std::int64_t tensors");
}

// One tensor of a safetensors file: its name, dtype, shape and raw little-endian bytes.
struct st_tensor {
  std::string name;
  st_dtype dtype = st_dtype::f32;
  kiln::shape shape;
  std::string bytes;
};

// A whole file: tensors in file order and the string-to-string __metadata__.
struct st_file {
  std::vector<st_tensor> tensors;
  std::vector<std::pair<std::string, std::string>> metadata;

  const st_tensor* find(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  const std::string* meta(std::string_view key) const {
    for (const auto& [k, v] : metadata)
      if (k == key) return &v;
    return nullptr;
  }
  void set_meta(const std::string& key, std::string value) {
    for (auto& [k, v] : metadata)
      if (k == key) {
        v = std::move(value);
        return;
      }
    metadata.emplace_back(key, std::move(value));
  }
  // Adds a tensor copied from a view of float, double or int64 values.
  template <class U>
  void add(std::string name, tensor_view<U> v) {
    using T = std::remove_const_t<U>;
    st_tensor t{std::move(name), st_dtype_of<T>(), v.shape(), {}};
    t.bytes.resize(static_cast<std::size_t>(v.numel()) * sizeof(T));
    if (v.numel()) std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    tensors.push_back(std::move(t));
  }
  template <class T>
  void add(std::string name, const Tensor<T>& t) {
    add(std::move(name), t.view());
  }
};

namespace detail {
inline void st_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[(c >> 4) & 0xF];
      out += hex[c & 0xF];
    } else {
      out += c;
    }
  }
  out += '"';
}
// A header key twice makes a file no reader accepts (kiln's and Python's refuse duplicate keys), so saving refuses it.
inline void st_check_unique(std::vector<std::string_view> names, const char* what) {
  std::sort(names.begin(), names.end());
  auto twice = std::adjacent_find(names.begin(), names.end());
  if (twice != names.end()) fail("safetensors: expected unique ", what, ", found '", *twice, "' twice");
}
}  // namespace detail

// The file's bytes: header length, JSON header (padded with spaces to 8-byte alignment) and data, tensors in order.
KILN_LIBRARY_FUNCTION std::string serialize_safetensors(const st_file& file);
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION std::string serialize_safetensors(const st_file& file) {
  std::vector<std::string_view> keys, names;
  for (const auto& [k, v] : file.metadata) keys.push_back(k);
  for (const auto& t : file.tensors) names.push_back(t.name);
  detail::st_check_unique(std::move(keys), "metadata keys");
  detail::st_check_unique(std::move(names), "tensor names");
  std::string header = "{";
  bool first = true;
  if (!file.metadata.empty()) {
    header += "\"__metadata__\":{";
    for (std::size_t i = 0; i < file.metadata.size(); ++i) {
      if (i) header += ',';
      detail::st_json_string(header, file.metadata[i].first);
      header += ':';
      detail::st_json_string(header, file.metadata[i].second);
    }
    header += '}';
    first = false;
  }
  std::uint64_t offset = 0;
  for (const auto& t : file.tensors) {
    if (t.name == "__metadata__") fail("safetensors: a tensor may not be named '__metadata__'");
    std::uint64_t expected = static_cast<std::uint64_t>(t.shape.numel()) * st_dtype_size(t.dtype);
    if (t.bytes.size() != expected)
      fail("safetensors: tensor '", t.name, "' of shape ", t.shape, " and dtype ", st_dtype_name(t.dtype), " needs ",
           expected, " bytes, found ", t.bytes.size());
    if (!first) header += ',';
    first = false;
    detail::st_json_string(header, t.name);
    header += ":{\"dtype\":\"";
    header += st_dtype_name(t.dtype);
    header += "\",\"shape\":[";
    for (int d = 0; d < t.shape.rank(); ++d) {
      if (d) header += ',';
      header += std::to_string(t.shape[d]);
    }
    header += "],\"data_offsets\":[";
    header += std::to_string(offset);
    header += ',';
    offset += expected;
    header += std::to_string(offset);
    header += "]}";
  }
  header += '}';
  while (header.size() % 8) header += ' ';
  std::string out;
  out.reserve(8 + header.size() + offset);
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xFF);
  out += header;
  for (const auto& t : file.tensors) out += t.bytes;
  return out;
}
#endif

// Writes the file through a temporary next to it, renamed into place.
inline void write_safetensors(const std::filesystem::path& path, const st_file& file) {
  write_file_atomically(path, serialize_safetensors(file));
}

// Writes a state dict (name, tensor pairs, as state_dict() returns them) with optional metadata.
template <class Dict>
void write_state_dict(const std::filesystem::path& path, const Dict& dict,
                      std::vector<std::pair<std::string, std::string>> metadata = {}) {
  st_file file;
  file.metadata = std::move(metadata);
  for (const auto& [name, tensor] : dict) file.add(name, tensor.view());
  write_safetensors(path, file);
}

}  // namespace kiln::io
