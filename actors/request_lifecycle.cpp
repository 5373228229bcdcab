#include "actors/request_lifecycle.hpp"

namespace ferry::actors {

std::string_view finish_reason(RequestStatus s) {
  switch (s) {
    case RequestStatus::queued:
    case RequestStatus::prefilling:
    case RequestStatus::decoding: return {};
    case RequestStatus::finished_stop: return "stop";
    case RequestStatus::finished_length: return "length";
    case RequestStatus::cancelled: return "cancelled";
    case RequestStatus::failed: return "error";
    case RequestStatus::rejected: return "rejected";
  }
  return {};
}

std::string_view status_name(RequestStatus s) {
  switch (s) {
    case RequestStatus::queued: return "queued";
    case RequestStatus::prefilling: return "prefilling";
    case RequestStatus::decoding: return "decoding";
    case RequestStatus::finished_stop: return "finished_stop";
    case RequestStatus::finished_length: return "finished_length";
    case RequestStatus::cancelled: return "cancelled";
    case RequestStatus::failed: return "failed";
    case RequestStatus::rejected: return "rejected";
  }
  return "unknown";
}

std::string_view cause_name(EndCause c) {
  switch (c) {
    case EndCause::none: return "none";
    case EndCause::client_cancelled: return "client_cancelled";
    case EndCause::stop_string: return "stop_string";
    case EndCause::admin_cancelled: return "admin_cancelled";
    case EndCause::drain_deadline: return "drain_deadline";
    case EndCause::queue_full: return "queue_full";
    case EndCause::draining: return "draining";
    case EndCause::too_long: return "too_long";
    case EndCause::invalid_request: return "invalid_request";
    case EndCause::backend_failed: return "backend_failed";
  }
  return "unknown";
}

}  // namespace ferry::actors
