#pragma once
// The live actor graph as the admin actor keeps it (STYLE rule 4: a plain class, no CAF): the last
// report of every actor, the engine's last snapshot, each stage's status and recent step time, the
// requests that ended lately and the token throughput. Every change bumps a revision; a client that
// saw revision R asks for view(R) and gets only what changed after it (a delta), or everything (a
// full view) when it saw nothing yet or is too far behind to be told every removal.
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "actors/messages.hpp"

namespace ferry::actors {

class AdminGraph {
 public:
  using Clock = std::chrono::steady_clock;

  struct Limits {
    size_t removed = 1024;  // removals remembered for deltas; a client further behind gets a full view
    size_t finished = 32;   // ended requests kept for the page
    Clock::duration throughput_window = std::chrono::seconds(1);
  };

  AdminGraph() : AdminGraph(Limits{}) {}
  explicit AdminGraph(Limits limits) : limits_(limits) {}

  // An actor's report. An ended report removes the actor; a bridge's goes to the finished list.
  void note(const ActorReport& report, Clock::time_point now);
  // The scheduler's report with its engine snapshot (slots, queue, totals).
  void note(const ActorReport& report, const EngineSnapshot& engine, Clock::time_point now);
  // A stage's report with its status.
  void note(const ActorReport& report, const StageStatus& stage, Clock::time_point now);
  // An actor that went away without its last report (it failed, or the system is stopping).
  void forget(const std::string& name);

  // Everything that changed after revision `since` (0: everything).
  AdminView view(uint64_t since, Clock::time_point now) const;
  ThroughputSample throughput(Clock::time_point now) const;

  uint64_t revision() const { return rev_; }
  bool has(const std::string& name) const { return actors_.count(name) != 0; }

 private:
  struct Entry {
    ActorReport report;
    uint64_t rev = 0;
  };
  struct StageEntry {
    StageView view;
    uint64_t rev = 0;
  };
  struct Sample {
    Clock::time_point at;
    uint64_t generated = 0;
    uint64_t prompt = 0;
  };

  void note_actor(const ActorReport& report);

  Limits limits_;
  uint64_t rev_ = 0;
  std::map<std::string, Entry> actors_;
  std::deque<std::pair<uint64_t, std::string>> removed_;  // (revision, name), oldest first
  uint64_t removed_floor_ = 0;  // the newest revision whose removal was dropped from removed_
  EngineSnapshot engine_;
  uint64_t engine_rev_ = 0;
  std::map<uint32_t, StageEntry> stage_entries_;
  std::deque<std::pair<uint64_t, ActorReport>> finished_;
  std::deque<Sample> samples_;
};

}  // namespace ferry::actors
