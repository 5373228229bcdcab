#pragma once
// Text from outside (a URL path, a query value, a field's value or name) that goes back to the
// client inside a JSON answer. Boost.JSON writes a string's bytes as they are, so invalid UTF-8 in
// them would make the body invalid JSON; and a value echoed whole could be megabytes long.
#include <cstddef>
#include <string>
#include <string_view>

namespace ferry::http {

// `s` with every byte that is not part of a valid UTF-8 character replaced by U+FFFD.
std::string valid_utf8(std::string_view s);
// At most about `max_bytes` of `s` as valid UTF-8, cut at a character boundary with "..." when cut:
// what an error message quotes of a value.
std::string excerpt(std::string_view s, size_t max_bytes = 64);
// A number for a message: the shortest text that reads back as `v` ("0.7", "1e+300"), never the
// 300 digits std::to_string writes for 1e300.
std::string short_number(double v);

}  // namespace ferry::http
