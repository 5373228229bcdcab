#include "actors/spec_policy.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

namespace ferry::actors {

Expected<MtpSetting> parse_mtp_setting(const std::string& text) {
  MtpSetting m;
  if (text == "off") return m;
  m.enabled = true;
  if (text == "auto") return m;
  m.adaptive = false;
  if (text.size() == 1 && text[0] >= '1' && text[0] <= '0' + static_cast<int>(kMaxDrafts)) {
    m.drafts = static_cast<uint32_t>(text[0] - '0');
    return m;
  }
  return Error(ErrorCode::invalid_input,
               "--mtp " + text + ": expected auto, off or a draft count 1.." + std::to_string(kMaxDrafts));
}

uint32_t drafts_for(const MtpSetting& mtp, const model::SpecCounts& counts, size_t decoding_slots,
                    const StepCosts* costs) {
  if (!mtp.enabled || decoding_slots > kMaxSpeculatingSlots) return 0;
  if (!mtp.adaptive) return mtp.drafts;
  const auto base = static_cast<uint32_t>(std::max<size_t>(1, decoding_slots));
  if (costs != nullptr && !costs->ms(base)) return 0;  // plain steps first: drafts are measured against them
  const double p = counts.drafted >= kAcceptanceWarmup
                       ? static_cast<double>(counts.accepted) / static_cast<double>(counts.drafted)
                       : kAssumedAcceptance;
  uint32_t best = 0;
  double best_rate = 1.0;  // plain decoding: one token per step of cost 1
  double tokens = 1.0, term = 1.0;
  for (uint32_t k = 1; k <= kMaxDrafts; ++k) {
    term *= p;
    tokens += term;
    const std::optional<double> measured = costs != nullptr ? costs->ratio(base * (k + 1), base) : std::nullopt;
    const double cost = measured.value_or(1.0 + kVerifyRowCost * k);
    const double rate = tokens / cost;
    if (rate > best_rate) best = k, best_rate = rate;
  }
  return best;
}

}  // namespace ferry::actors
