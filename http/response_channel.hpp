#pragma once
// How a request's bridge actor answers its HTTP client, whatever the transport: the Beast session
// implements it by posting to the connection's strand; tests implement it by recording. Every call
// is thread-safe and non-blocking.
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ferry::http {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

class ResponseChannel {
 public:
  virtual ~ResponseChannel() = default;
  // A whole JSON response; ends the exchange.
  virtual void send_json(unsigned status, std::string body, HeaderList headers = {}) = 0;
  // Starts a server-sent-event stream (200, text/event-stream, chunked).
  virtual void start_events() = 0;
  // One event: `data: <payload>\n\n`. False when the client is gone or has stopped reading and its
  // queue is full (back-pressure): the caller must stop generating for it.
  virtual bool send_event(std::string payload) = 0;
  // Ends the stream; ends the exchange.
  virtual void end_events() = 0;
  // Called once if the client goes away before the exchange ended (at once if it already has).
  virtual void on_client_gone(std::function<void()> callback) = 0;
};

}  // namespace ferry::http
