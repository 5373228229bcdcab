#pragma once
// An OpenAI-style error: what the client gets as `{"error": {...}}` with an HTTP status. Bad input
// names the offending field in `param` (a JSON path such as "messages[2].role").
#include <cstdint>
#include <string>

#include "actors/request_lifecycle.hpp"

namespace ferry::http {

struct ApiError {
  unsigned status = 400;
  std::string type = "invalid_request_error";  // invalid_request_error, authentication_error, ...
  std::string code;                             // machine-readable: invalid_value, context_length_exceeded, ...
  std::string param;                            // the field at fault, or empty
  std::string message;
  uint32_t retry_after_s = 0;                   // sent as Retry-After when non-zero (429, 503)
};

ApiError invalid_field(std::string param, std::string message, std::string code = "invalid_value");
ApiError make_error(unsigned status, std::string type, std::string code, std::string message);

// How an engine-side end (rejection, failure, cancel) reaches the client.
ApiError error_for(actors::EndCause cause, const std::string& message, uint32_t retry_after_s);

}  // namespace ferry::http
