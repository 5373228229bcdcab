#include "model/text/unicode.hpp"

#include <algorithm>
#include <array>

namespace ferry::model::unicode {
namespace {

// The Basic Multilingual Plane expanded once (64 KiB): the pre-tokenizers ask for the flags of
// every character, and a binary search over 1,500 runs per character would dominate encoding.
struct BmpTable {
  std::array<uint8_t, 0x10000> flags{};
  BmpTable() {
    for (size_t r = 0; r < kCategoryRunCount; ++r) {
      const CategoryRun& run = kCategoryRuns[r];
      if (run.first > 0xFFFF) break;
      const uint32_t last = std::min<uint32_t>(run.last, 0xFFFF);
      for (uint32_t cp = run.first; cp <= last; ++cp) flags[cp] = run.flags;
    }
  }
};

const BmpTable& bmp_table() {
  static const BmpTable table;
  return table;
}

}  // namespace

uint8_t flags(uint32_t cp) {
  if (cp <= 0xFFFF) return bmp_table().flags[cp];
  if (cp > 0x10FFFF) return 0;
  const CategoryRun* end = kCategoryRuns + kCategoryRunCount;
  const CategoryRun* it =
      std::upper_bound(kCategoryRuns, end, cp, [](uint32_t c, const CategoryRun& run) { return c < run.first; });
  if (it == kCategoryRuns) return 0;
  --it;
  return cp <= it->last ? it->flags : 0;
}

Decoded decode_utf8(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return {b0, 1};
  const Decoded invalid{kInvalidBase + b0, 1};
  uint32_t len = 0;
  uint32_t cp = 0;
  uint32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return invalid;
  }
  if (i + len > s.size()) return invalid;
  for (uint32_t k = 1; k < len; ++k) {
    const uint8_t b = byte(i + k);
    if ((b & 0xC0) != 0x80) return invalid;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return invalid;
  return {cp, len};
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace ferry::model::unicode
