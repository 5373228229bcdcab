#include "config/byte_size.hpp"

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <utility>

namespace ferry::config {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

Expected<uint64_t> parse_byte_size(std::string_view text) {
  const std::string quoted = "'" + std::string(text) + "'";
  size_t begin = 0;
  while (begin < text.size() && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  size_t end = begin;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) ++end;
  if (end == begin) {
    return Error("byte size " + quoted + " does not start with a number (expected e.g. 25.5GiB)");
  }
  double value = 0;
  const auto [ptr, ec] = std::from_chars(text.data() + begin, text.data() + end, value);
  if (ec != std::errc() || ptr != text.data() + end) {
    return Error("byte size " + quoted + " has a malformed number");
  }
  size_t unit_begin = end;
  while (unit_begin < text.size() && std::isspace(static_cast<unsigned char>(text[unit_begin]))) ++unit_begin;
  size_t unit_end = text.size();
  while (unit_end > unit_begin && std::isspace(static_cast<unsigned char>(text[unit_end - 1]))) --unit_end;
  const std::string unit = lower(text.substr(unit_begin, unit_end - unit_begin));
  static const std::array<std::pair<std::string_view, double>, 10> kUnits = {{
      {"", 1.0}, {"b", 1.0}, {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0},
      {"tib", 1099511627776.0}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
  }};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    const double bytes = std::round(value * scale);
    if (!(bytes < 18446744073709551616.0)) {
      return Error("byte size " + quoted + " is too large");
    }
    return static_cast<uint64_t>(bytes);
  }
  return Error("byte size " + quoted + " has unknown unit '" + unit +
               "' (expected B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
}

std::string format_byte_size(uint64_t bytes) {
  static const std::array<const char*, 5> kNames = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kNames.size()) {
    value /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", value, kNames[unit]);
  return buf;
}

}  // namespace ferry::config
