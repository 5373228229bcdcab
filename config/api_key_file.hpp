#pragma once
// The file of `--api-key-file`: one API key per line, for servers shared by several clients (each
// with its own key, so that one cannot cancel another's requests).
#include <string>
#include <vector>

#include "config/expected.hpp"

namespace ferry::config {

// The keys, in file order, duplicates dropped. Spaces around a key are trimmed; blank lines and lines
// starting with '#' are skipped. A key with a space or a control character inside, a file without a
// key, or one that cannot be read is an error naming the file (and the line).
Expected<std::vector<std::string>> read_api_key_file(const std::string& path);

}  // namespace ferry::config
