#pragma once
// GET /admin: the admin console's page, one self-contained HTML file (http/admin_page.html: no CDN,
// no build step) assembled into the binary. It draws the actor graph, the slots, the queue, the
// stages' step times and a throughput chart from the /admin/ws WebSocket of the same origin, with
// cancel, release and drain buttons.
#include <string_view>

#include "http/response_channel.hpp"

namespace ferry::http {

std::string_view admin_page_html();
// Content type, no caching, and a policy that keeps the page to its own origin and out of frames.
HeaderList admin_page_headers();

}  // namespace ferry::http
