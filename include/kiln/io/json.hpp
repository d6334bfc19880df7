// A small JSON reader and writer for kiln's file formats (the safetensors header): null, booleans, numbers, strings,
// arrays and objects. Errors are kiln::error with the byte offset where the text stops making sense. Objects keep
// their members in file order; duplicate keys are an error. Kept out of kiln.hpp: include it where a format needs it.
// A text's cost is bounded by json::limits: the nesting depth (the parser's recursion) and the number of values. A
// value costs up to max_bytes_per_value in memory however short its text ("[]," is three bytes), plus its string's
// characters, so a parse holds at most max_values * max_bytes_per_value bytes beyond the text's own size.
#pragma once

#include <charconv>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/core/compiled_kernels.hpp"
#include "kiln/core/error.hpp"

namespace kiln::io::json {

// What a parse may cost; a text beyond either bound is an error naming the bound. The defaults hold a safetensors
// header of 200,000 tensors (about 10 values each) in at most 2^21 * max_bytes_per_value = 512 MiB.
struct limits {
  int max_depth = 64;                             // arrays and objects nested in each other
  std::size_t max_values = std::size_t{1} << 21;  // values of every kind, members' values and array items included
};
// The most heap memory one value takes while a text is parsed, its string's characters aside: the value itself in
// its parent's array (which may be growing, so twice that), and an array's or object's own block.
inline constexpr std::size_t max_bytes_per_value = 256;

class value;
using array = std::vector<value>;
using object = std::vector<std::pair<std::string, value>>;

// One JSON value. Numbers keep their text, so integers beyond 2^53 (byte offsets) are read exactly by as_int().
class value {
 public:
  enum class kind { null, boolean, number, string, array, object };

  value() = default;
  static value make_bool(bool b) {
    value v;
    v.kind_ = kind::boolean;
    v.bool_ = b;
    return v;
  }
  static value make_number(std::string text) {
    value v;
    v.kind_ = kind::number;
    v.text_ = std::move(text);
    return v;
  }
  static value make_string(std::string s) {
    value v;
    v.kind_ = kind::string;
    v.text_ = std::move(s);
    return v;
  }
  static value make_array(array a) {
    value v;
    v.kind_ = kind::array;
    v.array_ = std::make_shared<array>(std::move(a));
    return v;
  }
  static value make_object(object o) {
    value v;
    v.kind_ = kind::object;
    v.object_ = std::make_shared<object>(std::move(o));
    return v;
  }

  kind type() const { return kind_; }
  bool is_null() const { return kind_ == kind::null; }
  bool is_number() const { return kind_ == kind::number; }
  bool is_string() const { return kind_ == kind::string; }
  bool is_array() const { return kind_ == kind::array; }
  bool is_object() const { return kind_ == kind::object; }
  // The byte offset in the parsed text where this value starts.
  std::size_t offset() const { return offset_; }

  bool as_bool() const {
    expect(kind::boolean);
    return bool_;
  }
  const std::string& as_string() const {
    expect(kind::string);
    return text_;
  }
  const array& as_array() const {
    expect(kind::array);
    return *array_;
  }
  const object& as_object() const {
    expect(kind::object);
    return *object_;
  }
  // The number as a double.
  double as_double() const {
    expect(kind::number);
    double d = 0;
    auto [end, ec] = std::from_chars(text_.data(), text_.data() + text_.size(), d);
    if (ec != std::errc() || end != text_.data() + text_.size())
      fail("JSON: number '", text_, "' at byte ", offset_, " is out of range for a double");
    return d;
  }
  // The number as an exact integer (no fraction or exponent allowed).
  std::int64_t as_int() const {
    expect(kind::number);
    std::int64_t i = 0;
    auto [end, ec] = std::from_chars(text_.data(), text_.data() + text_.size(), i);
    if (ec != std::errc() || end != text_.data() + text_.size())
      fail("JSON: expected an integer at byte ", offset_, ", found '", text_, "'");
    return i;
  }
  // A member of an object, or null when absent.
  const value* find(std::string_view key) const {
    for (const auto& [k, v] : as_object())
      if (k == key) return &v;
    return nullptr;
  }

  static const char* kind_name(kind k) {
    switch (k) {
      case kind::null: return "null";
      case kind::boolean: return "a boolean";
      case kind::number: return "a number";
      case kind::string: return "a string";
      case kind::array: return "an array";
      case kind::object: return "an object";
    }
    return "?";
  }

 private:
  friend class parser;
  void expect(kind k) const {
    if (kind_ != k) fail("JSON: expected ", kind_name(k), " at byte ", offset_, ", found ", kind_name(kind_));
  }

  kind kind_ = kind::null;
  bool bool_ = false;
  std::string text_;
  std::shared_ptr<array> array_;
  std::shared_ptr<object> object_;
  std::size_t offset_ = 0;
};

// Recursive-descent parser. base_offset is added to every reported offset (a header inside a larger file).
class parser {
 public:
  explicit parser(std::string_view text, std::size_t base_offset = 0, const limits& bounds = {})
      : text_(text), base_(base_offset), limits_(bounds) {}

  value parse_document() {
    skip_space();
    value v = parse_value(0);
    skip_space();
    if (pos_ != text_.size()) error_here("expected the end of the JSON text");
    return v;
  }

 private:
  // The character is quoted from a small array: building the quote with std::string's operator+ trips GCC 12's
  // -Wrestrict false positive where this is inlined.
  [[noreturn]] void error_here(const char* what) const {
    if (pos_ < text_.size()) {
      const char found[4] = {'\'', text_[pos_], '\'', '\0'};
      fail("JSON: ", what, " at byte ", base_ + pos_, ", found ", found);
    }
    fail("JSON: ", what, " at byte ", base_ + pos_, ", found the end");
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  bool consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect_literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) error_here("expected a JSON value");
    pos_ += word.size();
  }

  value parse_value(int depth) {
    if (++values_ > limits_.max_values)
      fail("JSON: more than ", limits_.max_values, " values, at byte ", base_ + pos_, " (json::limits::max_values)");
    std::size_t start = pos_;
    value v;
    if (pos_ >= text_.size()) error_here("expected a JSON value");
    char c = text_[pos_];
    // depth counts the arrays and objects around this value.
    if ((c == '{' || c == '[') && depth >= limits_.max_depth)
      fail("JSON: nested more than ", limits_.max_depth, " deep at byte ", base_ + pos_, " (json::limits::max_depth)");
    if (c == '{') v = parse_object(depth);
    else if (c == '[') v = parse_array(depth);
    else if (c == '"') v = value::make_string(parse_string());
    else if (c == 't') expect_literal("true"), v = value::make_bool(true);
    else if (c == 'f') expect_literal("false"), v = value::make_bool(false);
    else if (c == 'n') expect_literal("null");
    else if (c == '-' || (c >= '0' && c <= '9')) v = parse_number();
    else error_here("expected a JSON value");
    v.offset_ = base_ + start;
    return v;
  }

  value parse_number() {
    std::size_t start = pos_;
    auto digits = [&] {
      std::size_t d = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    consume('-');
    if (consume('0')) {
    } else if (digits() == 0) {
      error_here("expected a digit");
    }
    if (consume('.') && digits() == 0) error_here("expected a digit after the decimal point");
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (!consume('+')) consume('-');
      if (digits() == 0) error_here("expected a digit in the exponent");
    }
    return value::make_number(std::string(text_.substr(start, pos_ - start)));
  }

  unsigned hex4() {
    unsigned u = 0;
    for (int i = 0; i < 4; ++i) {
      if (pos_ >= text_.size()) error_here("expected four hex digits after \\u");
      char h = text_[pos_];
      unsigned d = h >= '0' && h <= '9'   ? unsigned(h - '0')
                   : h >= 'a' && h <= 'f' ? unsigned(h - 'a' + 10)
                   : h >= 'A' && h <= 'F' ? unsigned(h - 'A' + 10)
                                          : 16u;
      if (d == 16) error_here("expected a hex digit after \\u");
      u = u * 16 + d;
      ++pos_;
    }
    return u;
  }
  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    if (!consume('"')) error_here("expected '\"'");
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) error_here("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) {
        --pos_;
        error_here("control character in a string");
      }
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) error_here("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && text_.substr(pos_, 2) == "\\u") {
            pos_ += 2;
            unsigned low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) error_here("expected a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: --pos_; error_here("unknown escape in a string");
      }
    }
  }

  value parse_array(int depth) {
    ++pos_;
    array items;
    skip_space();
    if (consume(']')) return value::make_array(std::move(items));
    for (;;) {
      skip_space();
      items.push_back(parse_value(depth + 1));
      skip_space();
      if (consume(']')) return value::make_array(std::move(items));
      if (!consume(',')) error_here("expected ',' or ']' in an array");
    }
  }

  value parse_object(int depth) {
    ++pos_;
    object members;
    // A set rather than a scan of the members: a safetensors header can hold tens of thousands of keys.
    std::set<std::string> seen;
    skip_space();
    if (consume('}')) return value::make_object(std::move(members));
    for (;;) {
      skip_space();
      std::size_t key_at = pos_;
      if (pos_ >= text_.size() || text_[pos_] != '"') error_here("expected a string key in an object");
      std::string key = parse_string();
      if (!seen.insert(key).second) fail("JSON: duplicate key '", key, "' at byte ", base_ + key_at);
      skip_space();
      if (!consume(':')) error_here("expected ':' after an object key");
      skip_space();
      members.emplace_back(std::move(key), parse_value(depth + 1));
      skip_space();
      if (consume('}')) return value::make_object(std::move(members));
      if (!consume(',')) error_here("expected ',' or '}' in an object");
    }
  }

  std::string_view text_;
  std::size_t base_;
  limits limits_;
  std::size_t pos_ = 0;
  std::size_t values_ = 0;
};

// Parses a whole JSON text; offsets in errors count from base_offset.
KILN_LIBRARY_FUNCTION value parse(std::string_view text, std::size_t base_offset = 0, const limits& bounds = {});
#if defined(KILN_LIBRARY_DEFINITIONS)
KILN_LIBRARY_FUNCTION value parse(std::string_view text, std::size_t base_offset, const limits& bounds) {
  return parser(text, base_offset, bounds).parse_document();
}
#endif

// Appends s as a quoted JSON string.
inline void write_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[(c >> 4) & 0xF];
          out += hex[c & 0xF];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

}  // namespace kiln::io::json
