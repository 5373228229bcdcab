#pragma once
// When a decoding slot speculates, and with how many drafts (`--mtp auto|off|K`). A verify set of
// K + 1 rows confirms 1 + p + ... + p^K tokens on average at acceptance p; a step of K + 1 rows a
// slot costs more than one of a row a slot by the ratio the engine measured (actors/step_costs.hpp),
// or, for a K not measured yet, by kVerifyRowCost a draft row (the goal: optimistic, so that auto
// tries that K and measures it). Auto first measures plain steps (no drafts while the 1-row cost is
// unknown), then picks the K in 1..kMaxDrafts of the best ratio of tokens to cost, from the slot's
// own acceptance once it has drafted enough, and stops drafting where no K beats plain decoding, or
// where the step already carries many slots (their rows amortise the weights).
#include <cstdint>
#include <string>

#include "actors/step_costs.hpp"
#include "config/expected.hpp"
#include "model/speculative.hpp"

namespace ferry::actors {

struct MtpSetting {
  bool enabled = false;
  bool adaptive = true;  // auto: K from the acceptance; else K = drafts
  uint32_t drafts = 1;
};

inline constexpr uint32_t kMaxDrafts = 3;
inline constexpr double kVerifyRowCost = 0.1;    // a draft row's cost over a decode step before one is measured
inline constexpr uint32_t kMaxSpeculatingSlots = 4;
inline constexpr uint64_t kAcceptanceWarmup = 8;  // drafts before the slot's own acceptance counts
inline constexpr double kAssumedAcceptance = 0.75;

// Parses "auto", "off" or K (1..kMaxDrafts); the error names the value.
Expected<MtpSetting> parse_mtp_setting(const std::string& text);

// Drafts for a slot's next step (`decoding_slots` decoding, this one included): 0 turns speculation
// off for it. Null `costs`: none can be measured (micro-batched steps overlap), every K at the goal's.
uint32_t drafts_for(const MtpSetting& mtp, const model::SpecCounts& counts, size_t decoding_slots,
                    const StepCosts* costs);

}  // namespace ferry::actors
