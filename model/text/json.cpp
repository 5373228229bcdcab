#include "model/text/json.hpp"

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

constexpr int kMaxDepth = 512;

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Expected<JsonValue> document() {
    skip_ws();
    JsonValue v;
    if (!value(v, 0)) return Error(error_);
    skip_ws();
    if (pos_ != s_.size()) return Error("JSON: unexpected content after the value at byte " + std::to_string(pos_));
    return v;
  }

 private:
  bool fail(std::string what) {
    if (error_.empty()) error_ = "JSON: " + what + " at byte " + std::to_string(pos_);
    return false;
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return fail("invalid literal");
    pos_ += word.size();
    return true;
  }

  bool value(JsonValue& out, int depth) {
    if (depth > kMaxDepth) return fail("nesting deeper than " + std::to_string(kMaxDepth));
    if (pos_ >= s_.size()) return fail("unexpected end of input");
    switch (s_[pos_]) {
      case '{': return object(out, depth);
      case '[': return array(out, depth);
      case '"': {
        std::string str;
        if (!string(str)) return false;
        out = JsonValue(std::move(str));
        return true;
      }
      case 't': out = JsonValue(true); return literal("true");
      case 'f': out = JsonValue(false); return literal("false");
      case 'n': out = JsonValue(nullptr); return literal("null");
      default: return number(out);
    }
  }

  bool number(JsonValue& out) {
    const size_t start = pos_;
    const auto digits = [&] {
      const size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ > d;
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0') {
      ++pos_;
    } else if (!digits()) {
      return fail("invalid value");
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digits()) return fail("invalid number");
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digits()) return fail("invalid number");
    }
    out = JsonValue(JsonNumber{std::string(s_.substr(start, pos_ - start))});
    return true;
  }

  bool hex4(uint32_t& v) {
    if (pos_ + 4 > s_.size()) return fail("truncated \\u escape");
    v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else return fail("invalid \\u escape");
    }
    return true;
  }

  bool string(std::string& out) {
    ++pos_;  // the opening quote
    while (true) {
      // Copy the run of plain bytes up to the next quote, backslash or control byte.
      const size_t run = pos_;
      while (pos_ < s_.size()) {
        const auto c = static_cast<unsigned char>(s_[pos_]);
        if (c == '"' || c == '\\' || c < 0x20) break;
        ++pos_;
      }
      if (run < pos_) {
        const std::string_view plain = s_.substr(run, pos_ - run);
        for (size_t i = 0; i < plain.size();) {
          const unicode::Decoded d = unicode::decode_utf8(plain, i);
          if (d.cp >= unicode::kInvalidBase) {
            pos_ = run + i;
            return fail("invalid UTF-8 in a string");
          }
          i += d.len;
        }
        out.append(plain);
      }
      if (pos_ >= s_.size()) return fail("unterminated string");
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c != '\\') return fail("unescaped control character in a string");
      if (++pos_ >= s_.size()) return fail("unterminated string");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low = 0;
            if (s_.substr(pos_, 2) != "\\u") return fail("lone surrogate in a \\u escape");
            pos_ += 2;
            if (!hex4(low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return fail("lone surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return fail("lone surrogate in a \\u escape");
          }
          unicode::append_utf8(out, cp);
          break;
        }
        default:
          --pos_;
          return fail("invalid escape");
      }
    }
  }

  bool array(JsonValue& out, int depth) {
    ++pos_;
    JsonArray items;
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      out = JsonValue(std::move(items));
      return true;
    }
    while (true) {
      skip_ws();
      JsonValue v;
      if (!value(v, depth + 1)) return false;
      items.push_back(std::move(v));
      skip_ws();
      if (pos_ >= s_.size()) return fail("unterminated array");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] != ']') return fail("expected ',' or ']'");
      ++pos_;
      out = JsonValue(std::move(items));
      return true;
    }
  }

  bool object(JsonValue& out, int depth) {
    ++pos_;
    JsonObject members;
    std::unordered_map<std::string, size_t> index;  // only for large objects
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      out = JsonValue(std::move(members));
      return true;
    }
    while (true) {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != '"') return fail("expected a string key");
      std::string key;
      if (!string(key)) return false;
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] != ':') return fail("expected ':'");
      ++pos_;
      skip_ws();
      JsonValue v;
      if (!value(v, depth + 1)) return false;
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
        members[found].second = std::move(v);
      } else {
        if (!index.empty()) index.emplace(key, members.size());
        members.emplace_back(std::move(key), std::move(v));
      }
      skip_ws();
      if (pos_ >= s_.size()) return fail("unterminated object");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] != '}') return fail("expected ',' or '}'");
      ++pos_;
      out = JsonValue(std::move(members));
      return true;
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
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

Expected<JsonValue> parse_json(std::string_view text) { return Parser(text).document(); }

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
