#include "http/safe_text.hpp"

#include <charconv>

#include "model/text/unicode.hpp"

namespace ferry::http {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto d = model::unicode::decode_utf8(s, i);
    if (d.cp >= model::unicode::kInvalidBase) {
      out += kReplacement;
    } else {
      out.append(s.substr(i, d.len));
    }
    i += d.len;
  }
  return out;
}

std::string excerpt(std::string_view s, size_t max_bytes) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto d = model::unicode::decode_utf8(s, i);
    const bool invalid = d.cp >= model::unicode::kInvalidBase;
    if (out.size() + (invalid ? kReplacement.size() : d.len) > max_bytes) break;
    if (invalid) out += kReplacement;
    else out.append(s.substr(i, d.len));
    i += d.len;
  }
  if (i < s.size()) out += "...";
  return out;
}

std::string short_number(double v) {
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc()) return "?";
  return std::string(buf, end);
}

}  // namespace ferry::http
