// Switches that the environment sets at startup: KILN_AMX=0, KILN_BALANCE=0.
#pragma once

#include <cstdlib>

namespace kiln {

// Whether the switch `name` is on: it is, unless the environment sets it to exactly "0".
inline bool env_switch_on(const char* name) {
  const char* value = std::getenv(name);
  return !(value && value[0] == '0' && value[1] == '\0');
}

}  // namespace kiln
