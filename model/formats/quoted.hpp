#pragma once
// Names read from untrusted files, quoted for an error message: hostile bytes escaped as \xNN and
// the text cut at `max_shown` bytes ("..." marks the cut). Header-only so that the GGUF fuzzer,
// which compiles the reader's sources alone, needs nothing more.
#include <cstddef>
#include <string>
#include <string_view>

namespace ferry::model {

inline std::string quoted(std::string_view s, size_t max_shown) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  const size_t shown = s.size() < max_shown ? s.size() : max_shown;
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (shown < s.size()) out += "...";
  return out + "'";
}

}  // namespace ferry::model
