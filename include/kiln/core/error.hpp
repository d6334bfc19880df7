// kiln::error: the one exception type the library throws for bad input.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "kiln/core/config.hpp"

namespace kiln {

// Thrown for bad input in dynamic mode and all I/O. The message says what was expected, what was found and where.
class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
};

// Builds a message from streamable parts and throws kiln::error; kept out of line so hot paths stay small.
template <class... Parts>
[[noreturn]] __attribute__((noinline, cold)) void fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw error(message.str());
}

}  // namespace kiln
