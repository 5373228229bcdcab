#pragma once
// A small JSON document model for the text side: it keeps object keys in their order and numbers as
// written, so that the chat template can print tool definitions and call arguments exactly as
// Python's json.dumps does (what the model was trained on), and the output parser can check values.
// Text is parsed by simdjson, ferry's one parser of untrusted JSON (http/ reads requests with it
// too); simdjson cannot write JSON, and the writer here can.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "config/expected.hpp"

namespace ferry::model {

class JsonValue;
using JsonArray = std::vector<JsonValue>;
using JsonObject = std::vector<std::pair<std::string, JsonValue>>;  // in document order, keys unique

// A number as it was written: `text` is a valid JSON number literal.
struct JsonNumber {
  std::string text;
  bool is_integer() const;  // no fraction and no exponent (Python reads it as an int)
  bool operator==(const JsonNumber&) const = default;
};

class JsonValue {
 public:
  using Storage = std::variant<std::nullptr_t, bool, JsonNumber, std::string, JsonArray, JsonObject>;

  JsonValue() : v_(nullptr) {}
  JsonValue(std::nullptr_t) : v_(nullptr) {}                   // NOLINT
  JsonValue(bool b) : v_(b) {}                                 // NOLINT
  JsonValue(JsonNumber n) : v_(std::move(n)) {}                // NOLINT
  JsonValue(std::string s) : v_(std::move(s)) {}               // NOLINT
  JsonValue(const char* s) : v_(std::string(s)) {}             // NOLINT
  JsonValue(JsonArray a) : v_(std::move(a)) {}                 // NOLINT
  JsonValue(JsonObject o) : v_(std::move(o)) {}                // NOLINT

  bool is_null() const { return v_.index() == 0; }
  bool is_bool() const { return v_.index() == 1; }
  bool is_number() const { return v_.index() == 2; }
  bool is_string() const { return v_.index() == 3; }
  bool is_array() const { return v_.index() == 4; }
  bool is_object() const { return v_.index() == 5; }

  bool as_bool() const { return std::get<bool>(v_); }
  const JsonNumber& as_number() const { return std::get<JsonNumber>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const JsonArray& as_array() const { return std::get<JsonArray>(v_); }
  const JsonObject& as_object() const { return std::get<JsonObject>(v_); }
  JsonArray& as_array() { return std::get<JsonArray>(v_); }
  JsonObject& as_object() { return std::get<JsonObject>(v_); }

  // Object member by key; nullptr when this is not an object or has no such key.
  const JsonValue* find(std::string_view key) const;
  // Python truthiness (Jinja's `if x`): null, false, 0, "", [] and {} are false.
  bool truthy() const;

  const Storage& storage() const { return v_; }
  bool operator==(const JsonValue&) const = default;

 private:
  Storage v_;
};

// Parses one JSON document (RFC 8259; surrounding whitespace allowed) with simdjson's on-demand
// parser, visiting every value. Invalid UTF-8, lone surrogate escapes, nesting deeper than
// `max_depth` (a value inside N arrays or objects is at depth N), and trailing content are errors
// naming the byte offset ("JSON: ... at byte N"; callers prefix the field). Numbers keep their
// literal, so 1e400 and 30-digit integers read as Python reads them. A repeated key keeps its first
// position and its last value (Python's json.loads).
constexpr int kJsonMaxDepth = 512;
Expected<JsonValue> parse_json(std::string_view text, int max_depth = kJsonMaxDepth);

// json.dumps(value, ensure_ascii=False) byte for byte: ", " and ": " separators, non-ASCII kept,
// integers as written (normalised like Python's int), other numbers as Python's float repr.
std::string to_python_json(const JsonValue& value);
void append_python_json(std::string& out, const JsonValue& value);
// A JSON string literal for `s` (quotes included), escaped as json.dumps(ensure_ascii=False) does.
void append_json_string(std::string& out, std::string_view s);
// Python's repr of the float a JSON number literal reads as ("1.0", "1e-05", "1e+16", "inf").
std::string python_float_repr(std::string_view number_literal);

}  // namespace ferry::model
