#pragma once
// When a decoding slot speculates, and with how many drafts (`--mtp auto|off|K`). A verify set of
// K + 1 rows confirms 1 + p + ... + p^K tokens on average at acceptance p; its cost over a 1-row
// step grows with K (kVerifyRowCost each: the goal the verify-step benchmark checks). Auto picks
// the K in 1..kMaxDrafts of the best ratio, from the slot's own acceptance once it has drafted enough,
// and stops drafting where no K beats plain decoding, or where the step already carries many slots
// (their rows amortise the weights: a draft row then costs nearly as much as a real one).
#include <cstdint>
#include <string>

#include "config/expected.hpp"
#include "model/speculative.hpp"

namespace ferry::actors {

struct MtpSetting {
  bool enabled = false;
  bool adaptive = true;  // auto: K from the acceptance; else K = drafts
  uint32_t drafts = 1;
};

inline constexpr uint32_t kMaxDrafts = 3;
inline constexpr double kVerifyRowCost = 0.1;    // a draft row's cost over a decode step (batch 1; the goal)
inline constexpr uint32_t kMaxSpeculatingSlots = 4;
inline constexpr uint64_t kAcceptanceWarmup = 8;  // drafts before the slot's own acceptance counts
inline constexpr double kAssumedAcceptance = 0.75;

// Parses "auto", "off" or K (1..kMaxDrafts); the error names the value.
Expected<MtpSetting> parse_mtp_setting(const std::string& text);

// Drafts for a slot's next step: 0 turns speculation off for it.
uint32_t drafts_for(const MtpSetting& mtp, const model::SpecCounts& counts, size_t decoding_slots);

}  // namespace ferry::actors
