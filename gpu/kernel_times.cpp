#include "gpu/kernel_times.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#if FERRY_HAVE_CUPTI
#include <cupti.h>

#include "gpu/graph_kernels.hpp"
#endif

namespace ferry::gpu {

#if FERRY_HAVE_CUPTI
namespace {

// CUPTI hands full buffers to its own worker thread's callback as well as to the flush that
// take_kernel_records() asks for: the records they append are shared with the caller's thread, and
// a C callback without user data reaches them only through this one recorder. The mutex is why this
// is the only state of the kind in gpu/ (STYLE rule 11).
struct Recorder {
  std::mutex m;
  std::vector<KernelRecord> records;
  bool registered = false, on = false;
  size_t dropped = 0;
};
Recorder& recorder() {
  static Recorder r;
  return r;
}

constexpr size_t kBufferBytes = size_t{8} << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  std::vector<KernelRecord> got;
  CUpti_Activity* a = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS) {
    if (a->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && a->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
    got.push_back({short_kernel_name(k->name != nullptr ? k->name : "(kernel)"), k->start, k->end, k->streamId,
                   k->graphId});
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, stream, &dropped);
  std::free(buffer);
  Recorder& r = recorder();
  const std::lock_guard<std::mutex> lock(r.m);
  r.dropped += dropped;
  if (r.on) r.records.insert(r.records.end(), got.begin(), got.end());
}

Status cupti_status(CUptiResult code, const char* call) {
  if (code == CUPTI_SUCCESS) return std::nullopt;
  const char* what = nullptr;
  cuptiGetResultString(code, &what);
  return Error(ErrorCode::unsupported, std::string(call) + ": " + (what != nullptr ? what : "CUPTI error"));
}

}  // namespace

Status start_kernel_records() {
  Recorder& r = recorder();
  if (!r.registered) {
    if (auto e = cupti_status(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
                              "cuptiActivityRegisterCallbacks")) {
      return e;
    }
    r.registered = true;
  }
  {
    const std::lock_guard<std::mutex> lock(r.m);
    r.records.clear();
    r.dropped = 0;
    r.on = true;
  }
  return cupti_status(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
}

void stop_kernel_records() {
  Recorder& r = recorder();
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const std::lock_guard<std::mutex> lock(r.m);
  r.on = false;
  r.records.clear();
}

std::vector<KernelRecord> take_kernel_records() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  Recorder& r = recorder();
  const std::lock_guard<std::mutex> lock(r.m);
  if (r.dropped > 0) std::fprintf(stderr, "kernel records: CUPTI dropped %zu records\n", r.dropped);
  r.dropped = 0;
  std::vector<KernelRecord> out;
  out.swap(r.records);
  return out;
}

uint64_t kernel_clock_ns() {
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  return t;
}
#else
Status start_kernel_records() {
  return Error(ErrorCode::unsupported, "kernel records need CUPTI, which this build was made without");
}
void stop_kernel_records() {}
std::vector<KernelRecord> take_kernel_records() { return {}; }
uint64_t kernel_clock_ns() { return 0; }
#endif

namespace {

// The records inside `w`, in start order.
std::vector<const KernelRecord*> step_kernels(const std::vector<KernelRecord>& records, const StepWindow& w) {
  std::vector<const KernelRecord*> k;
  for (const KernelRecord& r : records) {
    if (r.start >= w.begin && r.end <= w.end) k.push_back(&r);
  }
  std::stable_sort(k.begin(), k.end(), [](const KernelRecord* a, const KernelRecord* b) { return a->start < b->start; });
  return k;
}

double us(uint64_t later, uint64_t earlier) { return later > earlier ? static_cast<double>(later - earlier) / 1e3 : 0.0; }

}  // namespace

KernelTimes summarize_kernel_times(const std::vector<KernelRecord>& records, const std::vector<StepWindow>& steps) {
  KernelTimes t;
  std::map<std::string, KernelTimeRow> by_name;
  for (const StepWindow& w : steps) {
    const std::vector<const KernelRecord*> k = step_kernels(records, w);
    ++t.steps;
    t.host_us += us(w.end, w.begin);
    if (k.empty()) continue;
    std::map<uint32_t, uint64_t> stream_end;
    uint64_t latest = k.front()->start;
    for (const KernelRecord* r : k) {
      KernelTimeRow& row = by_name[r->name];
      row.name = r->name;
      row.count += 1;
      row.total_us += us(r->end, r->start);
      row.own_us += us(r->end, std::max(r->start, latest));
      row.idle_us += us(r->start, latest);
      if (auto at = stream_end.find(r->stream); at != stream_end.end()) row.gap_us += us(r->start, at->second);
      stream_end[r->stream] = r->end;
      latest = std::max(latest, r->end);
      t.graph_kernels += r->graph != 0;
    }
    t.kernels += static_cast<double>(k.size());
    t.streams += static_cast<double>(stream_end.size());
    t.span_us += us(latest, k.front()->start);
  }
  for (auto& [name, row] : by_name) t.rows.push_back(row);
  if (t.steps == 0) return t;
  const double n = t.steps;
  for (KernelTimeRow& row : t.rows) {
    row.count /= n, row.total_us /= n, row.own_us /= n, row.gap_us /= n, row.idle_us /= n;
    t.busy_us += row.total_us, t.gap_us += row.gap_us, t.idle_us += row.idle_us;
  }
  t.kernels /= n, t.graph_kernels /= n, t.streams /= n, t.span_us /= n, t.host_us /= n;
  std::stable_sort(t.rows.begin(), t.rows.end(), [](const KernelTimeRow& a, const KernelTimeRow& b) {
    return a.own_us + a.idle_us > b.own_us + b.idle_us;
  });
  return t;
}

std::string format_kernel_times(const KernelTimes& t, const std::string& what) {
  std::string s;
  char line[320];
  std::snprintf(line, sizeof line,
                "%s: %u steps; a step %.1f kernels (%.1f in graphs) on %.1f streams, span %.1f us (host %.1f us), "
                "kernels' durations %.1f us, gaps on their streams %.1f us, idle %.1f us\n",
                what.c_str(), t.steps, t.kernels, t.graph_kernels, t.streams, t.span_us, t.host_us, t.busy_us, t.gap_us,
                t.idle_us);
  s += line;
  std::snprintf(line, sizeof line, "| %-44s | %6s | %9s | %9s | %9s | %9s |\n", "kernel", "a step", "total us", "own us",
                "gap us", "idle us");
  s += line;
  for (const KernelTimeRow& r : t.rows) {
    std::snprintf(line, sizeof line, "| %-44.44s | %6.2f | %9.2f | %9.2f | %9.2f | %9.2f |\n", r.name.c_str(), r.count,
                  r.total_us, r.own_us, r.gap_us, r.idle_us);
    s += line;
  }
  return s;
}

std::string format_kernel_timeline(const std::vector<KernelRecord>& records, const StepWindow& step) {
  const std::vector<const KernelRecord*> k = step_kernels(records, step);
  std::string s = "start_us,duration_us,gap_us,stream,name\n";
  std::map<uint32_t, uint64_t> stream_end;
  for (const KernelRecord* r : k) {
    auto at = stream_end.find(r->stream);
    char line[320];
    std::snprintf(line, sizeof line, "%.3f,%.3f,%.3f,%u,\"%s\"\n", us(r->start, k.front()->start), us(r->end, r->start),
                  at != stream_end.end() ? us(r->start, at->second) : 0.0, r->stream, r->name.c_str());
    s += line;
    stream_end[r->stream] = r->end;
  }
  return s;
}

}  // namespace ferry::gpu
