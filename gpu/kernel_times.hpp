#pragma once
// Kernel by kernel timelines of steps (issue 15: where a graphed decode step's time goes, which ncu
// could not say in a session's time and nsys is not installed for): CUPTI's activity records of
// every kernel the process runs (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, which gives each node of a
// replayed graph its own start and end), cut into steps by host clock windows and summed per kernel
// name. `ferry bench --kernel-times` prints them for its decode tests. Builds without CUPTI (the
// Volta tree has none, a build without CUDA neither) answer `unsupported`; the summaries need no device.
//
// CUPTI's recording is process-wide, so this is a set of free functions over one recorder. Start it
// before the graphs to be timed are instantiated: a graph made before may not be traced.
#include <cstdint>
#include <string>
#include <vector>

#include "config/expected.hpp"

namespace ferry::gpu {

struct KernelRecord {
  std::string name;          // short_kernel_name() of the kernel
  uint64_t start = 0, end = 0;  // ns on CUPTI's clock (kernel_clock_ns())
  uint32_t stream = 0;       // CUPTI's stream id
  uint32_t graph = 0;        // the graph it ran in (0: launched on its own)
};

// Starts recording every kernel from now on (again after stop_kernel_records()).
Status start_kernel_records();
// Stops recording and drops what was not taken; CUPTI detaches from the process.
void stop_kernel_records();
// The records of every kernel that ended since the last take (call after the device synchronised).
std::vector<KernelRecord> take_kernel_records();
// Now on the records' clock (0 without CUPTI).
uint64_t kernel_clock_ns();

// A step's host window on that clock: its kernels are those that start and end inside it.
struct StepWindow {
  uint64_t begin = 0, end = 0;
};

// Per kernel name over the steps, means a step: launches, their durations summed (kernels beside
// each other count both), `own` (the part of the step's span in which this kernel is the latest to
// end of those started: the spans' shares, which with `idle` add up to the span), `gap` (start minus
// the end of the kernel before it on its stream, where positive: what the chain waits between
// launches) and `idle` (start minus the latest end of every kernel before it, where positive: no
// kernel of the step runs).
struct KernelTimeRow {
  std::string name;
  double count = 0, total_us = 0, own_us = 0, gap_us = 0, idle_us = 0;
};

struct KernelTimes {
  uint32_t steps = 0;
  double kernels = 0, graph_kernels = 0;  // a step: all, and those of graphs
  double streams = 0;                     // distinct stream ids a step
  double span_us = 0;                     // first start to last end, a step
  double busy_us = 0, gap_us = 0, idle_us = 0;  // the rows' sums
  double host_us = 0;                     // the windows, a step
  std::vector<KernelTimeRow> rows;        // by own time, the largest first
};
KernelTimes summarize_kernel_times(const std::vector<KernelRecord>& records, const std::vector<StepWindow>& steps);
// The table of `t` headed by `what`.
std::string format_kernel_times(const KernelTimes& t, const std::string& what);
// One step's kernels in start order: offset from the step's first start, duration, gap, stream, name.
std::string format_kernel_timeline(const std::vector<KernelRecord>& records, const StepWindow& step);

}  // namespace ferry::gpu
