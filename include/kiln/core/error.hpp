// kiln::error: the one exception type the library throws for bad input.
#pragma once

#include <initializer_list>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "kiln/core/config.hpp"

namespace kiln {

// Thrown for bad input in dynamic mode and all I/O. The message says what was expected, what was found and where.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {

// One part of an error message: the value and the function that writes it (its type's operator<<). fail() passes its
// parts this way so that the stream code is compiled once per type of part, not once per list of types: a program
// calls fail() at hundreds of places with as many different lists.
struct message_part {
  const void* value;
  void (*write)(std::ostream&, const void*);
  std::ios_base& (*manipulator)(std::ios_base&) = nullptr;  // std::hex and the like, in place of value and write
};

template <class T>
void write_message_part(std::ostream& out, const void* value) {
  out << *static_cast<const T*>(value);
}
inline void write_c_string(std::ostream& out, const void* value) { out << static_cast<const char*>(value); }

template <class T>
message_part message_part_of(const T& value) {
  if constexpr (std::is_function_v<T>)
    return {nullptr, nullptr, value};
  else if constexpr (std::is_array_v<T> && std::is_same_v<std::remove_cv_t<std::remove_extent_t<T>>, char>)
    return {value, &write_c_string};
  else
    return {&value, &write_message_part<T>};
}

[[noreturn]] __attribute__((noinline, cold)) inline void throw_error(std::initializer_list<message_part> parts) {
  std::ostringstream message;
  for (const message_part& part : parts) {
    if (part.manipulator) message << part.manipulator;
    else part.write(message, part.value);
  }
  throw error(message.str());
}

}  // namespace detail

// Throws kiln::error with the parts written one after another, as `std::ostringstream() << parts...` would; kept out
// of line so hot paths stay small.
template <class... Parts>
[[noreturn]] __attribute__((noinline, cold)) void fail(const Parts&... parts) {
  detail::throw_error({detail::message_part_of(parts)...});
}

}  // namespace kiln
