#include "gpu/op_times.hpp"

#include <cstdio>

namespace ferry::gpu {

const char* op_group_name(OpGroup g) {
  switch (g) {
    case OpGroup::embed: return "embed";
    case OpGroup::mhc_pre: return "mhc_pre";
    case OpGroup::mhc_post: return "mhc_post";
    case OpGroup::kda_proj: return "kda_proj";
    case OpGroup::kda_conv: return "kda_conv";
    case OpGroup::kda_recurrence: return "kda_recurrence";
    case OpGroup::kda_out: return "kda_out";
    case OpGroup::dsa_proj: return "dsa_proj";
    case OpGroup::indexer_proj: return "indexer_proj";
    case OpGroup::indexer_select: return "indexer_select";
    case OpGroup::sparse_mla: return "sparse_mla";
    case OpGroup::dsa_out: return "dsa_out";
    case OpGroup::moe_router: return "moe_router";
    case OpGroup::moe_shared: return "moe_shared";
    case OpGroup::moe_experts: return "moe_experts";
    case OpGroup::dense_ffn: return "dense_ffn";
    case OpGroup::head: return "head";
    case OpGroup::count: break;
  }
  return "?";
}

double OpTimeTotals::total_ms() const {
  double t = 0;
  for (double x : ms) t += x;
  return t;
}

void OpTimeTotals::add(const OpTimeTotals& o) {
  for (size_t i = 0; i < kOpGroups; ++i) ms[i] += o.ms[i], marks[i] += o.marks[i];
  steps += o.steps;
}

std::string format_op_times(const OpTimeTotals& t, const std::string& what) {
  const double steps = t.steps > 0 ? t.steps : 1;
  const double total = t.total_ms() / steps;
  std::string out = what + " (" + std::to_string(t.steps) + " steps; CUDA events on the compute stream):\n";
  char line[128];
  std::snprintf(line, sizeof line, "  %-16s %10s %7s %8s\n", "op group", "ms a step", "share", "marks");
  out += line;
  for (size_t i = 0; i < kOpGroups; ++i) {
    if (t.marks[i] == 0) continue;
    const double ms = t.ms[i] / steps;
    std::snprintf(line, sizeof line, "  %-16s %10.3f %6.1f%% %8.1f\n", op_group_name(static_cast<OpGroup>(i)), ms,
                  total > 0 ? 100.0 * ms / total : 0.0, static_cast<double>(t.marks[i]) / steps);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-16s %10.3f\n", "total", total);
  out += line;
  return out;
}

Event& OpTimes::event(size_t i) {
  while (events_.size() <= i) events_.emplace_back(true);
  return events_[i];
}

void OpTimes::begin(cudaStream_t s) {
  used_ = 0;
  event(used_++).record(s);
}

void OpTimes::mark(OpGroup g, cudaStream_t s) {
  if (used_ == 0) begin(s);
  event(used_).record(s);
  if (groups_.size() < used_) groups_.resize(used_);
  groups_[used_ - 1] = g;
  ++used_;
}

void OpTimes::finish() {
  if (used_ < 2) {
    used_ = 0;
    return;
  }
  FERRY_CUDA(cudaEventSynchronize(events_[used_ - 1].get()));
  for (size_t i = 1; i < used_; ++i) {
    const size_t g = static_cast<size_t>(groups_[i - 1]);
    totals_.ms[g] += events_[i].since(events_[i - 1]);
    ++totals_.marks[g];
  }
  ++totals_.steps;
  used_ = 0;
}

OpTimeTotals OpTimes::take() {
  OpTimeTotals t = totals_;
  totals_ = OpTimeTotals{};
  return t;
}

}  // namespace ferry::gpu
