#pragma once
// API keys: `Authorization: Bearer <key>` (the scheme in any case, RFC 7235), checked in constant
// time against every configured key. A request's owner is the index of the key it came with; with
// several keys (--api-key-file) only its owner may cancel it.
#include <optional>
#include <string_view>

#include "config/serve_config.hpp"

namespace ferry::http {

// Who sent a request: the index of its key among the configured ones, or kNoKey on a server without
// keys.
using KeyIndex = int;
inline constexpr KeyIndex kNoKey = -1;

// The key index the Authorization header carries; nullopt when it carries none of the keys (or the
// server has keys and the header is missing or malformed).
std::optional<KeyIndex> authenticate(const config::ServerConfig& server, std::string_view authorization);
// How many distinct keys the server accepts (--api-key and the lines of --api-key-file).
size_t key_count(const config::ServerConfig& server);
// The WWW-Authenticate value of a 401: the scheme, and whether a credential was sent but refused.
std::string www_authenticate(std::string_view authorization);

}  // namespace ferry::http
