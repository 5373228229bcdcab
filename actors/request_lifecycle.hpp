#pragma once
// The life of a request in the engine, as one explicit enum. Ordering invariant: every status after
// `decoding` is terminal, so `status > RequestStatus::decoding` answers "has it ended?". Exactly one
// function maps terminal states to the API's finish reason.
#include <cstdint>
#include <string_view>

namespace ferry::actors {

enum class RequestStatus : uint8_t {
  queued,           // admitted, waiting for a slot
  prefilling,       // in a slot, prompt chunks being computed
  decoding,         // in a slot, generating
  // terminal from here on
  finished_stop,    // a stop token was drawn (or the client matched a stop string)
  finished_length,  // max_tokens or the slot's context reached
  cancelled,        // by the client, an admin or the drain deadline
  failed,           // the backend failed a step this request was part of
  rejected,         // never admitted: queue full, draining, too long, backend down
};

// Why a request ended other than normally; names the case for the HTTP status and the message.
enum class EndCause : uint8_t {
  none,              // finished normally
  client_cancelled,  // disconnect or explicit cancel
  stop_string,       // the bridge matched a stop string and asked the engine to stop
  admin_cancelled,   // POST /v1/requests/{id}/cancel or a slot release
  drain_deadline,    // shutdown: did not finish within --drain-timeout
  queue_full,        // rejected: 429
  draining,          // rejected: 503, the server is shutting down
  too_long,          // rejected: 400, prompt + max_tokens do not fit the context
  invalid_request,   // rejected: 400, e.g. an empty prompt or a token id outside the vocabulary
  backend_failed,    // failed or rejected: 503, the backend reported an error
};

constexpr bool is_terminal(RequestStatus s) { return s > RequestStatus::decoding; }

// "stop", "length", "cancelled", "error", "rejected"; empty for a live status.
std::string_view finish_reason(RequestStatus s);
std::string_view status_name(RequestStatus s);
std::string_view cause_name(EndCause c);

}  // namespace ferry::actors
