// libFuzzer target for the HTTP request path (built and run by tools/fuzz.sh, not by CMake): the
// bytes of a connection go through Beast's request parser configured as the session configures it,
// then through the router (on a server still loading its model, where no request reaches the
// engine: every endpoint, auth and error path answers at once) and through both OpenAI body parsers.
// Nothing may crash, and every JSON answer must be valid JSON (Boost.JSON's parser also rejects
// invalid UTF-8), whatever bytes the request carried.
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "http/bridge_actor.hpp"
#include "http/openai_request.hpp"
#include "http/responses.hpp"
#include "http/router.hpp"

using namespace ferry;
using namespace ferry::http;
namespace bhttp = boost::beast::http;

// The router spawns a bridge only for a server with an engine; this one never has one.
actors::bridge_actor::behavior_type ferry::http::bridge(bridge_pointer, BridgeJob) { __builtin_trap(); }

namespace {

void check_json(const std::string& body) {
  boost::system::error_code ec;
  boost::json::parse(body, ec);
  if (ec) __builtin_trap();
}

void check_error(const ApiError& e) {
  if (e.status < 400 || e.status > 599 || e.message.empty()) __builtin_trap();
  check_json(to_json(e));
}

class CheckingChannel : public ResponseChannel {
 public:
  void send_json(unsigned status, std::string body, HeaderList headers) override {
    if (++answers > 1 || status < 100 || status > 599) __builtin_trap();  // exactly one answer
    bool text = false;
    for (const auto& [name, value] : headers) text = text || value.rfind("text/plain", 0) == 0;
    if (!text) check_json(body);
  }
  void start_events() override { __builtin_trap(); }  // nothing streams without an engine
  bool send_event(std::string) override { __builtin_trap(); }
  void end_events() override { __builtin_trap(); }
  void on_client_gone(std::function<void()>) override {}
  int answers = 0;
};

std::shared_ptr<ServerContext> loading_server() {
  auto ctx = std::make_shared<ServerContext>();
  ctx->config.server.api_key = "k0";
  ctx->config.server.file_api_keys = {"k1", "k2"};
  ctx->config.model.id = "glm-5.3-flash";
  return ctx;  // phase loading: no engine, no actor system
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<ServerContext> ctx = loading_server();
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  // As Session::do_read: a body limit, a header limit, the bytes in pieces as a socket delivers them.
  bhttp::request_parser<bhttp::string_body> parser;
  parser.body_limit(1 << 20);
  parser.header_limit(64 * 1024);
  parser.eager(true);
  boost::beast::error_code ec;
  // As Beast's read loop: the parser sees what has arrived and not been consumed; on need_more, the
  // next piece arrives and it sees the same bytes again with the piece after them.
  const size_t piece = 1 + (size ? data[0] % 97 : 0);
  size_t used = 0, arrived = 0;
  while (!parser.is_done() && arrived < input.size()) {
    arrived = std::min(input.size(), arrived + piece);
    for (;;) {
      const size_t consumed = parser.put(boost::asio::const_buffer(input.data() + used, arrived - used), ec);
      used += consumed;
      if (ec == bhttp::error::need_more) {
        ec = {};
        break;  // wait for the next piece
      }
      if (ec || parser.is_done() || consumed == 0 || used == arrived) break;
    }
    if (ec) break;
  }
  if (!ec && !parser.is_done() && parser.got_some()) parser.put_eof(ec);
  if (ec && ec != bhttp::error::need_more) {
    // What the session answers a request it cannot frame.
    check_error(invalid_field("", "malformed HTTP request: " + ec.message(), "bad_http"));
  }
  if (!parser.is_done()) return 0;

  bhttp::request<bhttp::string_body> req = parser.release();
  HttpRequest request;
  request.method = std::string(req.method_string());
  request.target = std::string(req.target());
  request.authorization = std::string(req[bhttp::field::authorization]);
  request.body = req.body();
  auto channel = std::make_shared<CheckingChannel>();
  route(ctx, request, channel);
  if (channel->answers != 1) __builtin_trap();

  // The bodies the router would parse once the model is loaded.
  auto chat = parse_chat_request(request.body);
  if (auto* e = std::get_if<ApiError>(&chat)) check_error(*e);
  auto completion = parse_completion_request(request.body);
  if (auto* e = std::get_if<ApiError>(&completion)) check_error(*e);
  return 0;
}
