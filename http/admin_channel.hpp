#pragma once
// How an admin client actor talks to its console, whatever the transport: the WebSocket session
// (http/admin_ws.cpp) posts to its connection's strand; tests record. Every call is thread-safe and
// non-blocking.
#include <cstdint>
#include <string>

namespace ferry::http {

class AdminChannel {
 public:
  virtual ~AdminChannel() = default;
  // Queues one text message. False when the console is gone, or has left so many messages unread
  // that it is being dropped (back-pressure): the caller must stop sending to it.
  virtual bool send(std::string text) = 0;
  // Closes the connection with a WebSocket close code, after the messages already queued.
  virtual void close(uint16_t code, std::string reason) = 0;
};

// WebSocket close codes the console uses.
constexpr uint16_t kCloseGoingAway = 1001;       // the server is stopping
constexpr uint16_t kClosePolicyViolation = 1008;  // no or a wrong admin token

}  // namespace ferry::http
