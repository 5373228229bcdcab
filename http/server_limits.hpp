#pragma once
// What the server checks and sets about its process and address before it listens: the open-file
// limit (raised to the hard limit: every connection is a file descriptor), the connection cap that
// follows from it, and a warning for an address others can reach when no API key protects it.
#include <cstdint>
#include <optional>
#include <string>

#include "config/serve_config.hpp"

namespace ferry::http {

struct OpenFileLimit {
  uint64_t before = 0;  // the soft limit ferry started with
  uint64_t now = 0;     // after raising it to the hard limit (the same when it could not be raised)
};

// Raises RLIMIT_NOFILE's soft limit to its hard limit.
OpenFileLimit raise_open_file_limit();

// --max-connections, or for 0 (auto) half the open-file limit, at most 32768: well below the limit,
// which also has to cover the model files, the actor system and each answer's moment of need.
uint32_t connection_limit(const config::ServerConfig& server, uint64_t open_file_limit);

// The warning for listening on `host` with `keys` API keys: for an address other machines can reach
// (not loopback) with no key; nullopt otherwise or when `host` is not an address.
std::optional<std::string> public_bind_warning(const std::string& host, size_t keys);

}  // namespace ferry::http
