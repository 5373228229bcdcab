#include "http/auth.hpp"

#include <algorithm>
#include <string>

namespace ferry::http {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t'; }

// The token of "Bearer <token>", the scheme compared without case; nullopt for another scheme.
std::optional<std::string_view> bearer_token(std::string_view header) {
  while (!header.empty() && is_space(header.front())) header.remove_prefix(1);
  while (!header.empty() && is_space(header.back())) header.remove_suffix(1);
  constexpr std::string_view scheme = "bearer";
  if (header.size() <= scheme.size() || !is_space(header[scheme.size()])) return std::nullopt;
  for (size_t i = 0; i < scheme.size(); ++i) {
    const char c = header[i] >= 'A' && header[i] <= 'Z' ? static_cast<char>(header[i] - 'A' + 'a') : header[i];
    if (c != scheme[i]) return std::nullopt;
  }
  header.remove_prefix(scheme.size());
  while (!header.empty() && is_space(header.front())) header.remove_prefix(1);
  if (header.empty()) return std::nullopt;
  return header;
}

// Every byte is compared whatever the first difference, so the answer's timing says nothing about
// how much of a key was right (only whether the lengths match).
bool same_key(std::string_view token, const std::string& key) {
  if (token.size() != key.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < key.size(); ++i) diff |= static_cast<unsigned char>(token[i] ^ key[i]);
  return diff == 0;
}

template <class F>
void for_each_key(const config::ServerConfig& server, F f) {
  KeyIndex index = 0;
  if (!server.api_key.empty()) f(index++, server.api_key);
  for (const std::string& key : server.file_api_keys) {
    if (key != server.api_key) f(index++, key);
  }
}

}  // namespace

size_t key_count(const config::ServerConfig& server) {
  size_t n = 0;
  for_each_key(server, [&](KeyIndex, const std::string&) { ++n; });
  return n;
}

std::optional<KeyIndex> authenticate(const config::ServerConfig& server, std::string_view authorization) {
  if (key_count(server) == 0) return kNoKey;
  const auto token = bearer_token(authorization);
  if (!token) return std::nullopt;
  std::optional<KeyIndex> match;
  // No early exit: which key matched (or that none did) takes the same time to find.
  for_each_key(server, [&](KeyIndex index, const std::string& key) {
    if (same_key(*token, key) && !match) match = index;
  });
  return match;
}

std::string www_authenticate(std::string_view authorization) {
  // RFC 6750 section 3: error="invalid_token" when a token came and was refused.
  return authorization.empty() ? "Bearer realm=\"ferry\"" : "Bearer realm=\"ferry\", error=\"invalid_token\"";
}

}  // namespace ferry::http
