#include "http/api_error.hpp"

namespace ferry::http {

ApiError invalid_field(std::string param, std::string message, std::string code) {
  ApiError e;
  e.param = std::move(param);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

ApiError make_error(unsigned status, std::string type, std::string code, std::string message) {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.code = std::move(code);
  e.message = std::move(message);
  return e;
}

ApiError error_for(actors::EndCause cause, const std::string& message, uint32_t retry_after_s) {
  using actors::EndCause;
  ApiError e;
  e.message = message;
  switch (cause) {
    case EndCause::queue_full:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "queue_full";
      e.retry_after_s = retry_after_s;
      break;
    case EndCause::draining:
      e.status = 503;
      e.type = "server_error";
      e.code = "shutting_down";
      e.retry_after_s = retry_after_s;
      break;
    case EndCause::too_long:
      e.status = 400;
      e.code = "context_length_exceeded";
      e.param = "max_tokens";
      break;
    case EndCause::invalid_request:
      e.status = 400;
      e.code = "invalid_value";
      break;
    case EndCause::backend_failed:
      e.status = 500;
      e.type = "server_error";
      e.code = "backend_failed";
      break;
    case EndCause::drain_deadline:
      e.status = 503;
      e.type = "server_error";
      e.code = "shutting_down";
      break;
    case EndCause::admin_cancelled:
    case EndCause::client_cancelled:
    case EndCause::stop_string:
    case EndCause::none:
      e.status = 499;  // the request was cancelled before it produced an answer (nginx's convention)
      e.type = "cancelled";
      e.code = "cancelled";
      break;
  }
  if (e.message.empty()) e.message = std::string("request ended: ") + std::string(actors::cause_name(cause));
  return e;
}

}  // namespace ferry::http
