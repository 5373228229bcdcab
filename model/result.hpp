#pragma once
// A value or the error that prevented it (std::expected is not in GCC 12's C++20). The model-file
// readers return these: bad files are errors as values, nothing throws.
#include <utility>
#include <variant>

namespace ferry::model {

template <class T, class E>
class Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit on purpose
  Result(E error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  // Precondition for value()/*/->: ok(). For error(): !ok().
  const T& value() const& { return std::get<0>(v_); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::get<0>(std::move(v_)); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  const E& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, E> v_;
};

}  // namespace ferry::model
