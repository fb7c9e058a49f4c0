// modmoe::Error and the MODMOE_CHECK family used at every public entry point.
//
// Message form (ARCHITECTURE.md §4): "<function>: <argument> must be <expected>, got <actual>".
// Usage:
//   MODMOE_CHECK(x.ndim() == 2) << "fused_moe: hidden_states must be 2-D (M, K), got "
//                               << x.shape_str();
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace modmoe {

// The one exception type of the library. Bindings map it to ValueError.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

namespace detail {

// Collects a message with operator<< and throws modmoe::Error when the statement ends.
// Throwing from a destructor is deliberate: it lets MODMOE_CHECK read like a stream.
class ErrorStream {
 public:
  ErrorStream() = default;
  ErrorStream(const ErrorStream&) = delete;
  ErrorStream& operator=(const ErrorStream&) = delete;
  ~ErrorStream() noexcept(false) { throw Error(stream_.str()); }

  template <typename T>
  ErrorStream& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Turns `Voidify() & stream << ...` into a void expression, so MODMOE_CHECK is a single
// expression (no dangling-else surprises inside unbraced ifs).
struct Voidify {
  void operator&(const ErrorStream&) {}
};

}  // namespace detail
}  // namespace modmoe

// Throws modmoe::Error carrying the streamed message when `cond` is false.
#define MODMOE_CHECK(cond) \
  (cond) ? (void)0 : ::modmoe::detail::Voidify() & ::modmoe::detail::ErrorStream()

// Always throws; for unreachable switch arms and unsupported combinations.
#define MODMOE_FAIL() ::modmoe::detail::Voidify() & ::modmoe::detail::ErrorStream()
