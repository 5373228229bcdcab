#pragma once
// The admin console's WebSocket, /admin/ws, on the API's port (the HTTP session hands over a
// connection that asks for the upgrade) or on --admin-port (http/admin_server.hpp). Before the
// upgrade: the engine must be up, the Origin (when sent) must be the server's own, and the token
// must be configured unless the console listens on loopback; a wrong bearer token is a 401. After
// it: one session per connection on its strand (STYLE rule 11), a bounded queue of outgoing
// messages (rule 10: a console that leaves --admin-queue-limit of them unread is dropped), and an
// admin client actor that speaks the protocol (http/admin_json.hpp).
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http.hpp>

#include <memory>
#include <string_view>

#include "config/serve_config.hpp"
#include "http/server_context.hpp"

namespace ferry::http {

using AdminUpgradeRequest = boost::beast::http::request<boost::beast::http::string_body>;

void serve_admin_websocket(const std::shared_ptr<ServerContext>& context, boost::asio::ip::tcp::socket socket,
                           AdminUpgradeRequest request);

// The console listens on a loopback address (--admin-host with --admin-port, else --host): then it
// may run without --admin-token.
bool admin_listens_on_loopback(const config::ServerConfig& server);

// The request is for the console's WebSocket on this listener: /admin/ws (any query).
bool is_admin_websocket(std::string_view target);

}  // namespace ferry::http
