#pragma once
// The result type of the text side of the model (tokenizer, chat template, output parser): a value
// or an error message that names the field, the value and what was expected. Nothing here throws
// on bad input.
#include <string>

#include "model/result.hpp"

namespace ferry::model {

struct TextError {
  std::string message;
};

template <class T>
using TextResult = Result<T, TextError>;

}  // namespace ferry::model
