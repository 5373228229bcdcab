#include "model/text/json.hpp"

#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "model/text/unicode.hpp"

namespace ferry::model {

bool JsonNumber::is_integer() const { return text.find_first_of(".eE") == std::string::npos; }

const JsonValue* JsonValue::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& [k, v] : as_object()) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool JsonValue::truthy() const {
  switch (v_.index()) {
    case 0: return false;
    case 1: return as_bool();
    case 2: {
      // Zero in any spelling (0, -0, 0.0, 0e5) is false.
      for (char c : as_number().text) {
        if (c >= '1' && c <= '9') return true;
        if (c == 'e' || c == 'E') break;
      }
      return false;
    }
    case 3: return !as_string().empty();
    case 4: return !as_array().empty();
    default: return !as_object().empty();
  }
}

namespace {

namespace od = simdjson::ondemand;

// JSON's number grammar (RFC 8259 section 6). simdjson types a token by its first byte and leaves
// number syntax to the getters, which also reject what Python reads (1e400, integers beyond 64
// bits); the literal is kept as written, so only its syntax is checked here.
bool is_number_literal(std::string_view s) {
  size_t i = 0;
  const auto digits = [&] {
    const size_t from = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > from;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

std::string_view trim_ws(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

// simdjson's on-demand parser turned into JsonValue: one pass over the document, every value
// visited (so every scalar is validated), errors as "JSON: what at byte N".
class Reader {
 public:
  Reader(std::string_view text, od::parser& parser, int max_depth)
      : text_(text), padded_(text), parser_(parser), max_depth_(max_depth) {}

  Expected<JsonValue> document() {
    od::document doc;
    if (const auto e = parser_.iterate(padded_).get(doc)) return Error(message(stage1_what(e), stage1_offset(e)));
    JsonValue out;
    od::json_type type;
    if (const auto e = doc.type().get(type)) return Error(message(simdjson::error_message(e), first_token()));
    switch (type) {
      case od::json_type::object:
      case od::json_type::array: {
        od::value root;
        if (const auto e = doc.get_value().get(root)) return Error(message(simdjson::error_message(e), first_token()));
        if (!value(root, 0, out)) return Error(error_);
        const char* at = nullptr;
        if (doc.current_location().get(at) == simdjson::SUCCESS) {
          return Error(message("unexpected content after the value", offset_of(at)));
        }
        return out;
      }
      default:
        break;
    }
    // A scalar document: the whole text, but for surrounding whitespace, is one token.
    std::string_view raw;
    if (const auto e = doc.raw_json_token().get(raw)) return Error(message(simdjson::error_message(e), first_token()));
    if (trim_ws(raw) != trim_ws(text_)) {
      return Error(message("unexpected content after the value", offset_of(raw.data()) + trim_ws(raw).size()));
    }
    switch (type) {
      case od::json_type::number: {
        if (!number(raw, out)) return Error(error_);
        return out;
      }
      case od::json_type::string: {
        std::string_view str;
        if (const auto e = doc.get_string().get(str)) return Error(message(string_what(e), first_token()));
        return JsonValue(std::string(str));
      }
      case od::json_type::boolean: {
        bool b = false;
        if (doc.get_bool().get(b) != simdjson::SUCCESS) return Error(message("invalid literal", first_token()));
        return JsonValue(b);
      }
      default: {
        bool null = false;
        if (doc.is_null().get(null) != simdjson::SUCCESS || !null) {
          return Error(message("invalid literal", first_token()));
        }
        return JsonValue(nullptr);
      }
    }
  }

 private:
  static std::string message(std::string_view what, size_t offset) {
    return "JSON: " + std::string(what) + " at byte " + std::to_string(offset);
  }
  bool fail(std::string_view what, size_t offset) {
    if (error_.empty()) error_ = message(what, offset);
    return false;
  }
  size_t offset_of(const char* p) const {
    const char* base = padded_.data();
    return p >= base && p <= base + text_.size() ? static_cast<size_t>(p - base) : text_.size();
  }
  size_t first_token() const {
    const std::string_view t = trim_ws(text_);
    return t.empty() ? 0 : static_cast<size_t>(t.data() - text_.data());
  }
  static std::string string_what(simdjson::error_code e) {
    return e == simdjson::STRING_ERROR ? "invalid escape or lone surrogate in a string" : simdjson::error_message(e);
  }
  std::string stage1_what(simdjson::error_code e) const {
    switch (e) {
      case simdjson::EMPTY: return "unexpected end of input";
      case simdjson::UTF8_ERROR: return "invalid UTF-8";
      case simdjson::UNESCAPED_CHARS: return "unescaped control character in a string";
      case simdjson::UNCLOSED_STRING: return "unterminated string";
      case simdjson::DEPTH_ERROR: return "nesting deeper than " + std::to_string(max_depth_);
      default: return simdjson::error_message(e);
    }
  }
  // simdjson's first stage reports no position; find the byte it objects to.
  size_t stage1_offset(simdjson::error_code e) const {
    if (e == simdjson::UTF8_ERROR) {
      for (size_t i = 0; i < text_.size();) {
        const unicode::Decoded d = unicode::decode_utf8(text_, i);
        if (d.cp >= unicode::kInvalidBase) return i;
        i += d.len;
      }
    }
    if (e == simdjson::UNESCAPED_CHARS) {
      for (size_t i = 0; i < text_.size(); ++i) {
        const auto c = static_cast<unsigned char>(text_[i]);
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') return i;
      }
    }
    return e == simdjson::UNCLOSED_STRING ? text_.size() : 0;
  }

  bool number(std::string_view raw, JsonValue& out) {
    const std::string_view literal = trim_ws(raw);
    if (!is_number_literal(literal)) return fail("invalid number", offset_of(raw.data()));
    out = JsonValue(JsonNumber{std::string(literal)});
    return true;
  }

  bool value(od::value v, int depth, JsonValue& out) {
    const std::string_view raw = v.raw_json_token();
    const size_t at = offset_of(raw.data());
    if (depth > max_depth_) return fail("nesting deeper than " + std::to_string(max_depth_), at);
    od::json_type type;
    if (const auto e = v.type().get(type)) return fail(simdjson::error_message(e), at);
    switch (type) {
      case od::json_type::object: return object(v, depth, out, at);
      case od::json_type::array: return array(v, depth, out, at);
      case od::json_type::string: {
        std::string_view s;
        if (const auto e = v.get_string().get(s)) return fail(string_what(e), at);
        out = JsonValue(std::string(s));
        return true;
      }
      case od::json_type::number: return number(raw, out);
      case od::json_type::boolean: {
        bool b = false;
        if (v.get_bool().get(b) != simdjson::SUCCESS) return fail("invalid literal", at);
        out = JsonValue(b);
        return true;
      }
      case od::json_type::null: {
        bool null = false;
        if (v.is_null().get(null) != simdjson::SUCCESS || !null) return fail("invalid literal", at);
        out = JsonValue(nullptr);
        return true;
      }
    }
    return fail("invalid value", at);
  }

  bool array(od::value v, int depth, JsonValue& out, size_t at) {
    od::array arr;
    if (const auto e = v.get_array().get(arr)) return fail(simdjson::error_message(e), at);
    JsonArray items;
    for (auto element : arr) {
      od::value child;
      if (const auto e = element.get(child)) return fail(simdjson::error_message(e), at);
      JsonValue item;
      if (!value(child, depth + 1, item)) return false;
      items.push_back(std::move(item));
    }
    out = JsonValue(std::move(items));
    return true;
  }

  bool object(od::value v, int depth, JsonValue& out, size_t at) {
    od::object obj;
    if (const auto e = v.get_object().get(obj)) return fail(simdjson::error_message(e), at);
    JsonObject members;
    std::unordered_map<std::string, size_t> index;  // only for large objects
    for (auto field_result : obj) {
      od::field field;
      std::string_view key_text;
      if (const auto e = std::move(field_result).get(field)) return fail(simdjson::error_message(e), at);
      if (const auto e = field.unescaped_key().get(key_text)) return fail(string_what(e), at);
      std::string key(key_text);
      JsonValue item;
      if (!value(field.value(), depth + 1, item)) return false;
      // A repeated key keeps its first place and takes the new value, as a Python dict does.
      size_t found = members.size();
      if (members.size() <= 16) {
        for (size_t i = 0; i < members.size(); ++i) {
          if (members[i].first == key) found = i;
        }
      } else {
        if (index.empty()) {
          for (size_t i = 0; i < members.size(); ++i) index.emplace(members[i].first, i);
        }
        if (auto it = index.find(key); it != index.end()) found = it->second;
      }
      if (found < members.size()) {
        members[found].second = std::move(item);
      } else {
        if (!index.empty()) index.emplace(key, members.size());
        members.emplace_back(std::move(key), std::move(item));
      }
    }
    out = JsonValue(std::move(members));
    return true;
  }

  std::string_view text_;
  simdjson::padded_string padded_;
  od::parser& parser_;
  int max_depth_;
  std::string error_;
};

void append_python_int(std::string& out, std::string_view text) {
  // JSON integers have no leading zeros; Python prints -0 as 0.
  if (text == "-0") {
    out += '0';
  } else {
    out.append(text);
  }
}

}  // namespace

Expected<JsonValue> parse_json(std::string_view text, int max_depth) {
  // A lone number (http/ checks each number of a request this way, token-id prompts hold 500K of
  // them) needs only its grammar, which the document path checks the same way.
  if (const std::string_view t = trim_ws(text); !t.empty() && is_number_literal(t)) {
    return JsonValue(JsonNumber{std::string(t)});
  }
  // One parser per thread, reused: its buffers grow to the largest document and stay.
  thread_local od::parser parser;
  return Reader(text, parser, max_depth).document();
}

std::string python_float_repr(std::string_view literal) {
  double x = 0;
  const auto [ptr, ec] = std::from_chars(literal.data(), literal.data() + literal.size(), x);
  const bool negative = !literal.empty() && literal[0] == '-';
  if (ec == std::errc::result_out_of_range) {
    // Python reads an overflowing literal as infinity and an underflowing one as zero.
    const size_t e = literal.find_first_of("eE");
    const bool tiny = e != std::string_view::npos && e + 1 < literal.size() && literal[e + 1] == '-';
    x = tiny ? 0.0 : HUGE_VAL;
    if (negative) x = -x;
  } else if (ec != std::errc() || ptr != literal.data() + literal.size()) {
    return std::string(literal);
  }
  if (std::isinf(x)) return x < 0 ? "-Infinity" : "Infinity";  // what json.dumps writes for inf
  // The shortest digits that round-trip, laid out as Python's repr: positional when the decimal
  // exponent is in [-4, 16), else d.ddde±XX.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(res.ptr - buf));
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.remove_prefix(1);
  }
  const size_t epos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, epos)) {
    if (c != '.') digits += c;
  }
  int exp10 = 0;
  std::string_view es = sci.substr(epos + 1);
  if (es[0] == '+') es.remove_prefix(1);
  std::from_chars(es.data(), es.data() + es.size(), exp10);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exp10 + 1;  // x = 0.DIGITS * 10^decpt
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits;
      out.append(static_cast<size_t>(decpt) - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out += '.';
      out += digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits[0];
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  const int e = decpt - 1;
  out += e < 0 ? "e-" : "e+";
  const int a = e < 0 ? -e : e;
  if (a < 10) out += '0';
  out += std::to_string(a);
  return out;
}

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  size_t run = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out.append(s.substr(run, i - run));
    run = i + 1;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 15];
    }
  }
  out.append(s.substr(run));
  out += '"';
}

void append_python_json(std::string& out, const JsonValue& value) {
  if (value.is_null()) {
    out += "null";
  } else if (value.is_bool()) {
    out += value.as_bool() ? "true" : "false";
  } else if (value.is_number()) {
    const JsonNumber& n = value.as_number();
    if (n.is_integer()) {
      append_python_int(out, n.text);
    } else {
      out += python_float_repr(n.text);
    }
  } else if (value.is_string()) {
    append_json_string(out, value.as_string());
  } else if (value.is_array()) {
    out += '[';
    bool first = true;
    for (const JsonValue& item : value.as_array()) {
      if (!first) out += ", ";
      first = false;
      append_python_json(out, item);
    }
    out += ']';
  } else {
    out += '{';
    bool first = true;
    for (const auto& [k, v] : value.as_object()) {
      if (!first) out += ", ";
      first = false;
      append_json_string(out, k);
      out += ": ";
      append_python_json(out, v);
    }
    out += '}';
  }
}

std::string to_python_json(const JsonValue& value) {
  std::string out;
  append_python_json(out, value);
  return out;
}

}  // namespace ferry::model
