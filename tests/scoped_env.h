// ScopedEnv: a test's environment variable for one scope (developer switches that the library
// reads at each call, e.g. MODMOE_SM90_TILE_GATED, MODMOE_DECODE_LAYER).
#pragma once

#include <cstdlib>
#include <string>

namespace modmoe::testing {

// Sets (value) or unsets (nullptr) an environment variable for one scope, then restores what
// was there (POSIX setenv; the tests run in one thread).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    had_ = before != nullptr;
    if (had_) before_ = before;
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, before_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string before_;
};

}  // namespace modmoe::testing
