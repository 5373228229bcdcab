#include "config/expected.hpp"

namespace ferry {

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_input: return "invalid input";
    case ErrorCode::io: return "i/o error";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::invalid_plan: return "invalid plan";
    case ErrorCode::out_of_memory: return "out of memory";
    case ErrorCode::device_error: return "device error";
    case ErrorCode::device_lost: return "device lost";
    case ErrorCode::internal: return "internal error";
  }
  return "error";
}

}  // namespace ferry
