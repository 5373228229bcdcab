#pragma once
// The result type of the text side of the model (tokenizer, chat template, output parser): a value
// or an error message that names the field, the value and what was expected. Nothing here throws
// on bad input.
#include <string>
#include <utility>
#include <variant>

namespace ferry::model {

struct TextError {
  std::string message;
};

template <class T>
class TextResult {
 public:
  TextResult(T value) : v_(std::move(value)) {}          // NOLINT: implicit on purpose
  TextResult(TextError error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  // Precondition for value()/*/->: ok(). error(): !ok().
  const T& value() const& { return std::get<0>(v_); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }
  const TextError& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, TextError> v_;
};

}  // namespace ferry::model
