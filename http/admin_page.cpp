// The page's bytes come from http/admin_page.html with .incbin (as the default model's do), so the
// page stays a plain HTML file that a browser opens as it is; http/CMakeLists.txt makes this file
// depend on it.
#include "http/admin_page.hpp"

__asm__(
    ".section .rodata.ferry_admin_page,\"a\",@progbits\n"
    ".global ferry_admin_page_begin\n"
    "ferry_admin_page_begin:\n"
    ".incbin \"" FERRY_SOURCE_DIR "/http/admin_page.html\"\n"
    ".global ferry_admin_page_end\n"
    "ferry_admin_page_end:\n"
    ".previous\n");
extern "C" const char ferry_admin_page_begin[];
extern "C" const char ferry_admin_page_end[];

namespace ferry::http {

std::string_view admin_page_html() {
  return {ferry_admin_page_begin, static_cast<size_t>(ferry_admin_page_end - ferry_admin_page_begin)};
}

HeaderList admin_page_headers() {
  return {
      {"Content-Type", "text/html; charset=utf-8"},
      {"Cache-Control", "no-store"},
      {"X-Frame-Options", "DENY"},
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; "
       "frame-ancestors 'none'"},
  };
}

}  // namespace ferry::http
