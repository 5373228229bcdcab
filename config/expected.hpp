#pragma once
// The engine's one result type: a value, or an Error saying what went wrong and of which kind.
// Everything that can fail on outside input or on a device returns one (errors are values, STYLE
// rule 12); nothing throws across a module boundary. It lives in config/, the lowest folder, so that
// every other folder may use it (std::expected is not in GCC 12's C++20).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ferry {

// What kind of failure, which decides what the engine does about it: an input or plan error fails
// one request (or one command); a device error ends the stage that met it and every request it holds.
enum class ErrorCode : uint8_t {
  invalid_input,         // a file, body, option or id from outside is wrong
  io,                    // a file cannot be opened, read or written
  unsupported,           // well-formed but not something ferry can do (a type, an architecture)
  invalid_plan,          // a step the stage cannot run as asked (rows past the context, an unknown slot)
  out_of_memory,         // a budget or the device has no room for what was asked; the stage lives on
  device_error,          // a device operation failed: the stage's device state is unknown
  device_lost,           // the device is gone (Xid, reset, fallen off the bus)
  internal,              // a broken invariant inside ferry
};

// "invalid input", "device error", ...
std::string_view error_code_name(ErrorCode code);
// Whether an error of this kind leaves the stage that met it unusable (its requests all fail).
constexpr bool ends_stage(ErrorCode code) {
  return code == ErrorCode::device_error || code == ErrorCode::device_lost || code == ErrorCode::internal;
}

struct Error {
  static constexpr uint64_t kNoOffset = ~uint64_t{0};
  ErrorCode code = ErrorCode::invalid_input;
  std::string message;          // printable as is: what was wrong, the value, what was expected
  uint64_t offset = kNoOffset;  // where in a file the problem was found, when that is known

  Error() = default;
  Error(ErrorCode c, std::string m, uint64_t at = kNoOffset) : code(c), message(std::move(m)), offset(at) {}
  // The common case: bad input from outside.
  explicit Error(std::string m) : message(std::move(m)) {}

  // This error with `context` (the file, option or field it concerns) put in front of its message;
  // the code and the offset stay. What a caller does with a lower layer's error that it passes on.
  Error prefixed(std::string_view context) const { return Error(code, std::string(context) + message, offset); }
};

template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit on purpose
  Expected(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  // Preconditions: ok() for value(), * and ->; !ok() for error().
  const T& value() const& { return std::get<0>(v_); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::get<0>(std::move(v_)); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// For operations that return nothing: an empty optional is success. `if (auto e = f()) return *e;`
using Status = std::optional<Error>;

}  // namespace ferry
