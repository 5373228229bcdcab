#include "model/step.hpp"

#include <string>
#include <vector>

namespace ferry::model {

uint32_t total_rows(std::span<const SlotRows> rows) {
  uint64_t n = 0;
  for (const SlotRows& r : rows) n += r.tokens.size();
  return static_cast<uint32_t>(n);
}

Status validate_rows(std::span<const SlotRows> rows, std::span<const uint32_t> held, const RowLimits& limits,
                     std::span<const uint32_t> restart) {
  auto bad = [](std::string m) { return Error(ErrorCode::invalid_plan, std::move(m)); };
  std::vector<bool> seen(limits.slots, false);
  uint64_t count = 0;
  for (const SlotRows& r : rows) {
    const std::string slot = "slot " + std::to_string(r.slot);
    if (r.slot >= limits.slots) return bad(slot + " does not exist (" + std::to_string(limits.slots) + " slots)");
    if (seen[r.slot]) return bad(slot + " appears twice in one step");
    seen[r.slot] = true;
    const bool restarts = r.slot < restart.size() && restart[r.slot] != kNoRestart && r.start == restart[r.slot];
    if (r.start != 0 && r.start != held[r.slot] && !restarts) {
      return bad(slot + ": rows start at " + std::to_string(r.start) + " but the slot holds " +
                 std::to_string(held[r.slot]) + " tokens");
    }
    if (r.verify > 0 && (r.verify >= r.tokens.size() || !r.sample)) {
      return bad(slot + ": " + std::to_string(r.verify) + " drafts to verify need a draw and at least one real " +
                 "token before them (the set has " + std::to_string(r.tokens.size()) + " rows)");
    }
    if (r.draft > 0 && !r.sample) return bad(slot + ": drafts asked for rows that draw no token");
    if (uint64_t{r.start} + r.tokens.size() > limits.context) {
      return bad(slot + ": position " + std::to_string(uint64_t{r.start} + r.tokens.size()) + " exceeds max_context " +
                 std::to_string(limits.context));
    }
    if (limits.vocab != 0) {
      for (int32_t t : r.tokens) {
        if (t < 0 || static_cast<uint32_t>(t) >= limits.vocab) {
          return bad(slot + ": token id " + std::to_string(t) + " is outside the vocabulary of " +
                     std::to_string(limits.vocab));
        }
      }
    }
    count += r.tokens.size();
  }
  if (count > limits.step_rows) {
    return bad("the step has " + std::to_string(count) + " rows, more than the " + std::to_string(limits.step_rows) +
               " a step takes");
  }
  return std::nullopt;
}

}  // namespace ferry::model
