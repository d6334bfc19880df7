// Small helpers shared by the examples: command-line flags and a steady clock.
#pragma once

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

namespace kiln::examples {

// Reads "--name value" flags; every example accepts --threads N.
class flags {
 public:
  flags(int argc, char** argv) : argc_(argc), argv_(argv) {}
  std::string get(const char* name, const std::string& fallback) const {
    for (int i = 1; i + 1 < argc_; ++i)
      if (std::strcmp(argv_[i], name) == 0) return argv_[i + 1];
    return fallback;
  }
  long long get_int(const char* name, long long fallback) const {
    std::string v = get(name, "");
    return v.empty() ? fallback : std::atoll(v.c_str());
  }
  bool has(const char* name) const {
    for (int i = 1; i < argc_; ++i)
      if (std::strcmp(argv_[i], name) == 0) return true;
    return false;
  }

 private:
  int argc_;
  char** argv_;
};

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kiln::examples
