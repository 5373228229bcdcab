#include "http/server_limits.hpp"

#include <boost/asio/ip/address.hpp>
#include <sys/resource.h>

#include <algorithm>

namespace ferry::http {

OpenFileLimit raise_open_file_limit() {
  OpenFileLimit out;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return out;
  out.before = out.now = limit.rlim_cur;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) out.now = raised.rlim_cur;
  }
  return out;
}

uint32_t connection_limit(const config::ServerConfig& server, uint64_t open_file_limit) {
  if (server.max_connections != 0) return server.max_connections;
  return static_cast<uint32_t>(std::clamp<uint64_t>(open_file_limit / 2, 16, 32768));
}

std::optional<std::string> public_bind_warning(const std::string& host, size_t keys) {
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(host, ec);
  if (ec || keys > 0) return std::nullopt;
  const bool loopback = address.is_loopback() ||
                        (address.is_v6() && address.to_v6().is_v4_mapped() &&
                         address.to_v6().to_v4().is_loopback());
  if (loopback) return std::nullopt;
  return "listening on " + host + (address.is_unspecified() ? " (every interface)" : "") +
         " without an API key: anyone who can reach this address can use the server and cancel its requests "
         "(set --api-key or --api-key-file)";
}

}  // namespace ferry::http
