#pragma once
// The expert-cache actor: a thin shell around model::ExpertPolicy (STYLE rule 4). Tiered stages report
// their routes and finished swaps after every step; it answers a stage with the swaps worth making
// now, which the stage starts between its steps and finishes without stalling them. Off the hot
// path: a stage never waits for it. When it ends, it writes the route counts to --expert-stats (the
// next start places the experts by them).
#include <memory>
#include <string>
#include <vector>

#include "actors/protocol.hpp"
#include "model/expert_policy.hpp"

namespace ferry::actors {

struct ExpertCacheState {
  std::shared_ptr<model::ExpertPolicy> policy;
  std::vector<int> policy_stage;  // per pipeline stage: its number in the policy, -1 none
};

// Answers each report's sender (a stage actor). `stats_file`: where the counts are written at the
// end (empty: nowhere).
expert_cache_actor::behavior_type expert_cache(expert_cache_actor::stateful_pointer<ExpertCacheState> self,
                                               std::shared_ptr<model::ExpertPolicy> policy,
                                               std::vector<int> policy_stage, std::string stats_file);

}  // namespace ferry::actors
