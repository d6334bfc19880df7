// libFuzzer target: kiln's JSON parser (the safetensors header's) over arbitrary text. Every value of a parsed
// document is read back through its accessors, and a document written back out (strings through json::write_string)
// parses again.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_common.hpp"
#include "kiln/io/json.hpp"

namespace {
namespace json = kiln::io::json;

void visit(const json::value& v, std::string& out) {
  switch (v.type()) {
    case json::value::kind::null: out += "null"; break;
    case json::value::kind::boolean: out += v.as_bool() ? "true" : "false"; break;
    case json::value::kind::number:
      kiln_fuzz::refused([&] { (void)v.as_int(); });
      kiln_fuzz::refused([&] { (void)v.as_double(); });
      out += "0";
      break;
    case json::value::kind::string: json::write_string(out, v.as_string()); break;
    case json::value::kind::array: {
      out += '[';
      bool first = true;
      for (const auto& item : v.as_array()) {
        if (!first) out += ',';
        first = false;
        visit(item, out);
      }
      out += ']';
      break;
    }
    case json::value::kind::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, member] : v.as_object()) {
        if (!first) out += ',';
        first = false;
        json::write_string(out, key);
        out += ':';
        visit(member, out);
      }
      out += '}';
      break;
    }
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  json::value document;
  if (kiln_fuzz::refused([&] { document = json::parse(text, 0, {.max_depth = 64, .max_values = 1 << 16}); })) return 0;
  std::string again;
  visit(document, again);
  kiln_fuzz::require(!kiln_fuzz::refused([&] { json::parse(again, 0, {.max_depth = 64, .max_values = 1 << 16}); }),
                     "a parsed document written back out parses again");
  return 0;
}
