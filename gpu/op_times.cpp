#include "gpu/op_times.hpp"

#include <cstdio>
#include <utility>

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
  for (size_t i = 0; i < kOpGroups; ++i) {
    ms[i] += o.ms[i];
    gemm_ms[i] += o.gemm_ms[i];
    convert_ms[i] += o.convert_ms[i];
    marks[i] += o.marks[i];
  }
  steps += o.steps;
}

std::string format_op_times(const OpTimeTotals& t, const std::string& what) {
  const double steps = t.steps > 0 ? t.steps : 1;
  const double total = t.total_ms() / steps;
  std::string out = what + " (" + std::to_string(t.steps) + " steps; CUDA events on the compute stream):\n";
  char line[160];
  std::snprintf(line, sizeof line, "  %-16s %10s %7s %10s %10s %8s\n", "op group", "ms a step", "share", "cuBLAS ms",
                "fp16 ms", "marks");
  out += line;
  double gemm = 0, convert = 0;
  for (size_t i = 0; i < kOpGroups; ++i) {
    gemm += t.gemm_ms[i] / steps;
    convert += t.convert_ms[i] / steps;
    if (t.marks[i] == 0) continue;
    const double ms = t.ms[i] / steps;
    std::snprintf(line, sizeof line, "  %-16s %10.3f %6.1f%% %10.3f %10.3f %8.1f\n",
                  op_group_name(static_cast<OpGroup>(i)), ms, total > 0 ? 100.0 * ms / total : 0.0,
                  t.gemm_ms[i] / steps, t.convert_ms[i] / steps, static_cast<double>(t.marks[i]) / steps);
    out += line;
  }
  std::snprintf(line, sizeof line, "  %-16s %10.3f %7s %10.3f %10.3f\n", "total", total, "", gemm, convert);
  out += line;
  return out;
}

Event& OpTimes::event(size_t i) {
  while (events_.size() <= i) events_.emplace_back(true);
  return events_[i];
}

void OpTimes::begin(cudaStream_t s) {
  used_ = 0;
  grouped_ = 0;
  event(used_++).record(s);
}

void OpTimes::record(OpPart p, cudaStream_t s) {
  if (used_ == 0) begin(s);
  event(used_).record(s);
  if (tags_.size() < used_) tags_.resize(used_);
  tags_[used_ - 1] = Interval{OpGroup::count, p, false};
  ++used_;
}

void OpTimes::mark(OpGroup g, cudaStream_t s) {
  record(OpPart::other, s);
  tags_[used_ - 2].ends_group = true;
  for (size_t i = grouped_; i + 1 < used_; ++i) tags_[i].group = g;
  grouped_ = used_ - 1;
}

void OpTimes::part(OpPart p, cudaStream_t s) { record(p, s); }

void OpTimes::finish() {
  const size_t used = std::exchange(used_, 0);
  const size_t grouped = std::exchange(grouped_, 0);
  if (grouped == 0) return;
  FERRY_CUDA(cudaEventSynchronize(events_[used - 1].get()));
  // Parts after the step's last group mark belong to no group: nothing marks them, none are charged.
  for (size_t i = 0; i < grouped; ++i) {
    const Interval& t = tags_[i];
    const size_t g = static_cast<size_t>(t.group);
    const float ms = events_[i + 1].since(events_[i]);
    totals_.ms[g] += ms;
    if (t.part == OpPart::gemm) totals_.gemm_ms[g] += ms;
    if (t.part == OpPart::convert) totals_.convert_ms[g] += ms;
    if (t.ends_group) ++totals_.marks[g];
  }
  ++totals_.steps;
}

OpTimeTotals OpTimes::take() {
  OpTimeTotals t = totals_;
  totals_ = OpTimeTotals{};
  return t;
}

}  // namespace ferry::gpu
