#include "actors/expert_cache_actor.hpp"

#include <spdlog/spdlog.h>

namespace ferry::actors {

expert_cache_actor::behavior_type expert_cache(expert_cache_actor::stateful_pointer<ExpertCacheState> self,
                                               std::shared_ptr<model::ExpertPolicy> policy,
                                               std::vector<int> policy_stage, std::string stats_file) {
  self->state.policy = policy;
  self->state.policy_stage = std::move(policy_stage);
  if (!stats_file.empty()) {
    self->attach_functor([policy, stats_file] {
      if (auto e = policy->save_counts(stats_file)) spdlog::warn("--expert-stats: {}", e->message);
    });
  }
  return {
      [self](const ExpertReport& report) {
        ExpertCacheState& st = self->state;
        if (report.stage >= st.policy_stage.size() || st.policy_stage[report.stage] < 0) return;
        const auto s = static_cast<uint32_t>(st.policy_stage[report.stage]);
        st.policy->finished(s, report.finished);
        st.policy->observe(s, report.routes);
        std::vector<model::ExpertMove> moves = st.policy->propose(s);
        if (!moves.empty()) {
          self->send(caf::actor_cast<stage_actor>(self->current_sender()), ExpertMoves{std::move(moves)});
        }
      },
  };
}

}  // namespace ferry::actors
