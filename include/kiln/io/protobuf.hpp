// A minimal protocol-buffers wire-format writer (what ONNX export needs, no protobuf dependency): varints, 64-bit
// integers, floats, and length-delimited fields (strings, bytes, packed arrays, nested messages). A message is built
// into a std::string; a nested message is written as a length-delimited field holding another message's bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kiln::io::protobuf {

// Wire types.
enum class wire : std::uint32_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

class message {
 public:
  // An unsigned varint: 7 bits per byte, low bits first, high bit set on all but the last.
  static void put_varint(std::string& out, std::uint64_t v) {
    while (v >= 0x80) {
      out += static_cast<char>((v & 0x7F) | 0x80);
      v >>= 7;
    }
    out += static_cast<char>(v);
  }

  // int32, int64, uint64, bool, enum: a varint (negative values as their 64-bit two's complement, 10 bytes).
  message& varint(std::uint32_t field, std::int64_t v) {
    tag(field, wire::varint);
    put_varint(bytes_, static_cast<std::uint64_t>(v));
    return *this;
  }
  message& float32(std::uint32_t field, float v) {
    tag(field, wire::fixed32);
    char b[4];
    std::memcpy(b, &v, 4);  // little-endian hosts only (kiln's I/O assumes them)
    bytes_.append(b, 4);
    return *this;
  }
  // string, bytes, or an embedded message's serialisation.
  message& bytes(std::uint32_t field, std::string_view data) {
    tag(field, wire::length_delimited);
    put_varint(bytes_, data.size());
    bytes_.append(data.data(), data.size());
    return *this;
  }
  message& nested(std::uint32_t field, const message& m) { return bytes(field, m.str()); }
  // A packed repeated varint field (repeated int64 in proto3 style; proto2 parsers accept it too).
  template <class Range>
  message& packed_varints(std::uint32_t field, const Range& values) {
    std::string packed;
    for (auto v : values) put_varint(packed, static_cast<std::uint64_t>(static_cast<std::int64_t>(v)));
    return bytes(field, packed);
  }

  const std::string& str() const { return bytes_; }

 private:
  void tag(std::uint32_t field, wire w) { put_varint(bytes_, (std::uint64_t{field} << 3) | static_cast<std::uint32_t>(w)); }
  std::string bytes_;
};

}  // namespace kiln::io::protobuf
