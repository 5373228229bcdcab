#pragma once
// Byte sizes as users write them in budgets ("25.5GiB", "84 GiB", "512MiB", "1000000") and as
// ferry prints them.
#include <cstdint>
#include <string>
#include <string_view>

#include "config/expected.hpp"

namespace ferry::config {

// Accepts a non-negative number with an optional unit: B, KiB, MiB, GiB, TiB (powers of 1024) or
// KB, MB, GB, TB (powers of 1000); case-insensitive, spaces allowed before the unit. The error
// names the text and what was expected.
Expected<uint64_t> parse_byte_size(std::string_view text);
// "1.50 GiB", "512 B": binary units, two decimals above bytes.
std::string format_byte_size(uint64_t bytes);

}  // namespace ferry::config
