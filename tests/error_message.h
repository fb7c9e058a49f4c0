// error_of: the message of the modmoe::Error a call throws, for the tests of bad inputs
// (EXPECT_THAT(error_of([&] { ... }), HasSubstr("..."))) and of calls that must be accepted
// (EXPECT_EQ(error_of([&] { ... }), "")). Shared by the CPU and GPU test binaries (tests/ is on
// their include path through modmoe_oracle).
#pragma once

#include <string>

#include "modmoe/error.h"

namespace modmoe::testing {

// The message of the modmoe::Error that `f` throws ("" when it throws none; any other exception
// passes through).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace modmoe::testing
