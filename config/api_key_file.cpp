#include "config/api_key_file.hpp"

#include <algorithm>
#include <fstream>

namespace ferry::config {

Expected<std::vector<std::string>> read_api_key_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error(ErrorCode::io, "--api-key-file " + path + ": cannot be read");
  std::vector<std::string> keys;
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
    const auto first = std::find_if_not(line.begin(), line.end(), space);
    const auto last = std::find_if_not(line.rbegin(), line.rend(), space).base();
    if (first >= last || *first == '#') continue;
    std::string key(first, last);
    // A bearer token is one token68 word: a space inside means two keys on one line, or a typo.
    const bool printable = std::all_of(key.begin(), key.end(), [](char c) {
      return static_cast<unsigned char>(c) > 0x20 && c != 0x7f;
    });
    if (!printable) {
      return Error("--api-key-file " + path + ": line " + std::to_string(number) +
                   " holds a space or a control character inside the key (one key per line)");
    }
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(std::move(key));
  }
  if (in.bad()) return Error(ErrorCode::io, "--api-key-file " + path + ": read error");
  if (keys.empty()) return Error("--api-key-file " + path + ": no key in the file (one key per line)");
  return keys;
}

}  // namespace ferry::config
