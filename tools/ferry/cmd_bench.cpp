// `ferry bench`: prefill and decode speed in the style of llama-bench.
//   ferry bench --synthetic glm-5.3-flash-12-layers.json --type q4_k -p 512,2048 -n 128 -d 0,4096,32768 -r 3
// For each depth d: the slot is filled with d tokens once (untimed), then "pp P @ d" times one prefill step
// of P tokens and "tg N @ d" times N greedy decode steps of one token (each fed the token it drew).
// Reports t/s (mean ± sd over the repetitions) and ms per token; on the CUDA backend also peak device
// memory, the bytes a decoded token reads, and that traffic per second against the device's measured
// copy bandwidth. With --split the model runs as pipeline stages (several may share a device) and the
// hand-off bytes and device microseconds per step are reported; with --slots N, "tg N @ d" also runs
// as N requests decoding at once through the server's own engine (bench_slots.hpp). With --mtp K,
// "tg N mtpK @ d" decodes N tokens with K MTP drafts a step (model/speculative.hpp), each fed the
// model's own continuation, and reports the drafts' acceptance. --op-times breaks the timed prefill steps
// down by op group (gpu/op_times.hpp); --kernel-times lists the timed decode steps kernel by kernel from
// CUPTI's records (gpu/kernel_times.hpp).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "config/memory_options.hpp"
#include "kv/random_slot_state.hpp"
#include "gpu/backend_factory.hpp"
#include "gpu/kernel_times.hpp"
#include "model/formats/gguf.hpp"
#include "model/speculative.hpp"
#include "tools/ferry/bench_experts.hpp"
#include "tools/ferry/bench_slots.hpp"
#include "tools/ferry/commands.hpp"
#include "tools/ferry/synthetic_source.hpp"
#if FERRY_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu/bandwidth.hpp"
#include "gpu/cuda_check.hpp"
#include "gpu/cuda_stage.hpp"
#endif

namespace ferry::cli {
namespace {

struct Options {
  std::string model, synthetic, type = "q4_k", backend = "auto", prompt = "512", gen = "128", depth = "0";
  std::string recipe, kv_type = "auto";
  uint32_t reps = 3;
  uint64_t seed = 1;
  bool json = false;
  bool measure_bandwidth = true;
  bool op_times = false;  // CUDA: per-op times of the timed prefill steps (gpu/op_times.hpp)
  bool kernel_times = false;    // CUDA: per-kernel times of the timed decode steps (gpu/kernel_times.hpp)
  std::string kernel_timeline;  // with them: each tg test's last step, kernel by kernel, to this file
  std::string split = "none", devices;
  uint32_t slots = 1, micro_batches = 0;
  uint32_t mtp = 0;  // drafts a step of "tg N mtpK @ d" (0: not run)
  std::optional<uint32_t> kv_resident;  // CUDA: latent rows per DSA layer and slot on the device (unset: the plan's)
  std::string fill = "prefill";  // how a depth is reached: prefill, or random (kv/random_slot_state.hpp)
  config::MemoryOptionsText memory;
  float route_skew = 0;
  float temperature = 0.0f, top_p = 1.0f;  // of every step's draw (0: greedy)
};

struct Result {
  std::string test;
  uint32_t tokens = 0, depth = 0;
  bool decode = false;
  std::vector<double> seconds;
  double mean_tps() const {
    if (slots) return slots->aggregate_tps;
    double s = 0;
    for (double x : seconds) s += tokens / x;
    return s / static_cast<double>(seconds.size());
  }
  double sd_tps() const {
    if (seconds.size() < 2) return 0;
    const double m = mean_tps();
    double v = 0;
    for (double x : seconds) v += (tokens / x - m) * (tokens / x - m);
    return std::sqrt(v / static_cast<double>(seconds.size() - 1));
  }
  double ms_per_token() const { return 1000.0 / mean_tps(); }
  uint64_t bytes_per_token = 0;
  std::optional<SlotsResult> slots;  // a --slots run: its aggregate is the test's rate
};

Expected<std::vector<uint32_t>> parse_list(const std::string& s, const char* what) {
  std::vector<uint32_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      const unsigned long v = std::stoul(item, &used);
      if (used != item.size() || v > 1u << 24) throw std::invalid_argument(item);
      out.push_back(static_cast<uint32_t>(v));
    } catch (const std::exception&) {
      return Error(std::string(what) + ": '" + item + "' is not a token count");
    }
  }
  if (out.empty()) return Error(std::string(what) + ": empty list");
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// `steps` verify steps of a token and `drafts` drafts of slot 0 from depth d (the stages go back to
// the set's start before each: the rollback's copies are in the time), with the MTP block's drafts
// after each when `draft`, `reps` times. Its "t/s" is steps a second.
Result time_verify(model::Pipeline& b, const std::function<void()>& back_to_depth,
                   const std::function<std::vector<int32_t>(size_t)>& tokens, uint32_t d, uint32_t drafts, bool draft,
                   uint32_t steps, uint32_t reps, std::string& failure) {
  Result r{"verify" + std::to_string(drafts + 1) + (draft ? " mtp" : "") + " @ d" + std::to_string(d), steps, d, false,
           {}, 0, std::nullopt};
  for (uint32_t rep = 0; rep < reps && failure.empty(); ++rep) {
    back_to_depth();
    // A set at position 0 starts its slot over (not a decode step a graph replays): depth 0 is 1.
    uint32_t at = d;
    if (at == 0) {
      if (auto res = b.step({model::SlotRows{0, 0, tokens(1), false, true, {}}}); !res) failure = res.error().message;
      at = 1;
    }
    model::SlotRows rows{0, at, tokens(drafts + 1), false, true, {}};
    rows.verify = drafts;
    rows.draft = draft ? drafts : 0;
    const double t0 = now_s();
    for (uint32_t i = 0; i < steps && failure.empty(); ++i) {
      if (auto res = b.step({rows}); !res) failure = res.error().message;
    }
    r.seconds.push_back(now_s() - t0);
  }
  return r;
}

int bench(const Options& o) {
  const auto pp = parse_list(o.prompt, "-p");
  const auto tg = parse_list(o.gen, "-n");
  const auto depths = parse_list(o.depth, "-d");
  for (const auto* list : {&pp, &tg, &depths}) {
    if (!*list) {
      std::fprintf(stderr, "ferry bench: %s\n", list->error().message.c_str());
      return 2;
    }
  }
  if (o.model.empty() == o.synthetic.empty()) {
    std::fprintf(stderr, "ferry bench: give exactly one of --model FILE and --synthetic CONFIG.json\n");
    return 2;
  }
  const uint32_t max_p = *std::max_element(pp->begin(), pp->end());
  const uint32_t max_n = *std::max_element(tg->begin(), tg->end());
  const uint32_t max_d = *std::max_element(depths->begin(), depths->end());
  gpu::BackendOptions bo;
  bo.kind = o.backend;
  bo.max_slots = std::max<uint32_t>(1, o.slots);
  bo.max_step_rows = std::max<uint32_t>(max_p, 512) + bo.max_slots;
  bo.max_context = (max_d + std::max(max_p, max_n * o.reps + 8) + 64 + 255) / 256 * 256;
  bo.kv_resident = o.kv_resident;
  Status split_error = gpu::parse_kv_type_option(o.kv_type, bo);
  if (!split_error) split_error = config::parse_split(o.split, bo.split);
  if (!split_error && !o.devices.empty()) split_error = config::parse_devices(o.devices, bo.split);
  if (split_error) {
    std::fprintf(stderr, "ferry bench: %s\n", split_error->message.c_str());
    return 2;
  }
  if (const auto errors = config::parse_memory_options(o.memory, bo.memory); !errors.empty()) {
    for (const auto& e : errors) std::fprintf(stderr, "ferry bench: %s\n", e.c_str());
    return 2;
  }
  bo.route_skew = o.route_skew;
  bo.mtp = o.mtp > 0;

  // The ceilings are measured first: the model may leave no device memory for the copies.
  double copy_bw = 0, host_bw = 0;
  bool record = false;  // --kernel-times on a CUDA device
#if FERRY_HAVE_CUDA
  int visible = 0;
  if (o.measure_bandwidth && bo.kind != "cpu" && cudaGetDeviceCount(&visible) == cudaSuccess && visible > 0) {
    try {
      const int device = config::stage_device(bo.split, 0, 1);
      copy_bw = gpu::measure_copy_bandwidth(device, uint64_t{1} << 31, 20);
      host_bw = gpu::measure_host_to_device_bandwidth(device, uint64_t{1} << 30, 10);
    } catch (const gpu::CudaError& e) {
      std::fprintf(stderr, "ferry bench: bandwidth not measured: %s\n", e.what());
    }
  }
  // Before the model: the decode graphs are instantiated with the kernel records on. Without a device
  // there is nothing to record (the CPU backend runs; the report says so).
  record = o.kernel_times && bo.kind != "cpu" && cudaGetDeviceCount(&visible) == cudaSuccess && visible > 0;
  if (record) {
    if (auto e = gpu::start_kernel_records()) {
      std::fprintf(stderr, "ferry bench: --kernel-times: %s\n", e->message.c_str());
      return 2;
    }
  }
#endif
  Expected<gpu::OpenedModel> opened = Error(ErrorCode::internal, "no model");
  std::string model_name;
  if (!o.synthetic.empty()) {
    auto source = read_synthetic_source(o.synthetic, o.type, o.recipe);
    if (!source) {
      std::fprintf(stderr, "ferry bench: %s\n", source.error().message.c_str());
      return 2;
    }
    const std::string types = o.recipe.empty() ? o.type : "recipe " + o.recipe + ", else " + o.type;
    spdlog::warn("SYNTHETIC weights ({}, seed {}): pseudo-random values of the shape in {}; speed only, no meaning",
                 types, o.seed, o.synthetic);
    opened = gpu::open_synthetic_pipeline(source->hparams, source->type, o.seed, bo, source->rules);
    model_name = o.synthetic + " (synthetic " + types + ")";
  } else {
    opened = gpu::open_pipeline(o.model, bo);
    model_name = o.model;
  }
  if (!opened) {
    std::fprintf(stderr, "ferry bench: %s\n", opened.error().message.c_str());
    return 2;
  }
  gpu::OpenedModel& om = opened.value();
  model::Pipeline& b = *om.pipeline;
  if (om.plan.tiered()) std::fprintf(stderr, "memory plan:\n%s", gpu::format_plan(om.plan).c_str());
  const uint32_t V = b.hparams().vocab_size;
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V) - 1);
  auto random_tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = tok(rng);
    return t;
  };
  std::string failure;
  // One step of slot 0 (then the expert policy, as the server runs it); the token it drew, or -1
  // with `failure` set.
  auto step = [&](uint32_t start, std::vector<int32_t> tokens) {
    model::SamplingParams sp;
    sp.temperature = o.temperature;
    sp.top_p = o.top_p;
    sp.seed = o.seed;
    auto res = b.step({model::SlotRows{0, start, std::move(tokens), false, true, sp}});
    om.rebalance();
    if (!res) {
      if (failure.empty()) failure = res.error().message;
      return int32_t{-1};
    }
    return (*res)[0].sampled;
  };
  // Fills slot 0 with `d` tokens once (the pipeline splits it into steps it can take) and keeps the
  // slot's fixed state; `back_to_depth` then returns the slot to d tokens without filling it again
  // (the rows [0, d) are untouched by what follows), so a 32K depth costs one fill, not one per test.
  std::vector<model::SlotStateImage> at_depth;
  auto fill = [&](uint32_t d) {
    if (auto e = b.reset_slot(0)) failure = e->message;
    if (d > 0 && o.fill == "random") {
      std::vector<model::SlotStateImage> drawn;
      for (const auto& s : b.stages()) drawn.push_back(kv::random_slot_state(s->state_layout(), d, o.seed + d));
      if (auto e = b.restore_slot(0, drawn); e && failure.empty()) failure = e->message;
    } else if (d > 0) {
      step(0, random_tokens(d));
    }
    auto image = b.save_slot(0, false);
    if (image) {
      at_depth = std::move(image.value());
    } else if (failure.empty()) {
      failure = image.error().message;
    }
  };
  auto back_to_depth = [&] {
    if (auto e = b.restore_slot(0, at_depth); e && failure.empty()) failure = e->message;
  };

  // A depth reached by drawing its state, not by a prefill, says so in every test name.
  auto rnd = [&](uint32_t d) { return o.fill == "random" && d > 0 ? std::string(" rnd") : std::string(); };
  std::fprintf(stderr, "ferry bench: %s on %s\n", model_name.c_str(), b.describe().c_str());
  if (o.fill == "random") {
    std::fprintf(stderr, "ferry bench: --fill random: each depth's KV rows, indexer keys and KDA state are DRAWN at "
                         "random (tests marked rnd): decode reads as many rows as at that depth, but the indexer's "
                         "selections (and a window's hit rate) are not those of real text\n");
  }
  // Warm-up: one prefill of each size and a few decode steps at depth 0 (cuBLAS heuristics, graphs).
  for (uint32_t p : *pp) step(0, random_tokens(p));
  std::vector<Result> results;
  std::vector<model::StageCounters> before(b.stages().size());
  std::vector<ExpertRow> expert_rows;
  std::vector<std::string> handoffs;  // per depth and link: bytes and copy time per decode step
  std::vector<std::string> windows;   // per depth and stage: the resident KV window over the decode tests
  std::vector<std::string> op_tables;  // --op-times: per pp test, the breakdown of its timed steps
  std::vector<std::string> kernel_tables;  // --kernel-times: per tg test, its timed steps kernel by kernel
  std::string timelines;                   // --kernel-timeline: each tg test's last step
  // --op-times: on or off for every CUDA stage; off, the stages' totals summed.
  auto time_ops = [&](bool on, const std::string& test) {
#if FERRY_HAVE_CUDA
    gpu::OpTimeTotals sum;
    bool any = false;
    for (const auto& s : b.stages()) {
      auto* cs = dynamic_cast<gpu::CudaStage*>(s.get());
      if (cs == nullptr) continue;
      any = true;
      cs->time_ops(on);
      const gpu::OpTimeTotals t = cs->take_op_times();
      if (on) continue;
      sum.add(t);
      sum.steps = t.steps;  // every stage times each step once
    }
    if (!on && any) op_tables.push_back(gpu::format_op_times(sum, test + ", ms a chunk summed over the stages"));
#else
    (void)on, (void)test;
#endif
  };
  for (uint32_t d : *depths) {
    fill(d);
    for (uint32_t p : *pp) {
      Result r{"pp" + std::to_string(p) + " @ d" + std::to_string(d) + rnd(d), p, d, false, {}, 0, std::nullopt};
      if (o.op_times) time_ops(true, r.test);
      for (uint32_t rep = 0; rep < o.reps; ++rep) {
        back_to_depth();  // every repetition starts from the same depth
        const auto tokens = random_tokens(p);
        const double t0 = now_s();
        step(d, tokens);
        r.seconds.push_back(now_s() - t0);
      }
      if (o.op_times) time_ops(false, r.test);
      results.push_back(r);
      std::fprintf(stderr, "  %-18s %10.1f t/s\n", r.test.c_str(), r.mean_tps());
    }
    // Decode repetitions follow each other: repetition i starts i*(n+1) tokens deeper, which is noise
    // next to the depths measured.
    back_to_depth();
    uint32_t pos = d;
    int32_t t = tok(rng);
    for (int i = 0; i < 2; ++i) t = step(pos++, {t});  // graph capture
    for (size_t i = 0; i < b.stages().size(); ++i) before[i] = b.stages()[i]->counters();
    for (uint32_t n : *tg) {
      Result r{"tg" + std::to_string(n) + " @ d" + std::to_string(d) + rnd(d), n, d, true, {}, 0, std::nullopt};
      const model::ExpertTierCounters tier_before = expert_counters(b);
      std::vector<gpu::StepWindow> windows_ns;  // --kernel-times: each step's, on the records' clock
      if (record) gpu::take_kernel_records();
      for (uint32_t rep = 0; rep < o.reps; ++rep) {
        const double t0 = now_s();
        for (uint32_t i = 0; i < n && failure.empty(); ++i) {
          if (record) windows_ns.push_back({gpu::kernel_clock_ns(), 0});
          t = step(pos++, {t});
          if (record) windows_ns.back().end = gpu::kernel_clock_ns();
        }
        r.seconds.push_back(now_s() - t0);
      }
      if (record) {
        const std::vector<gpu::KernelRecord> records = gpu::take_kernel_records();
        kernel_tables.push_back(gpu::format_kernel_times(gpu::summarize_kernel_times(records, windows_ns), r.test));
        if (!windows_ns.empty()) timelines += "# " + r.test + "\n" + gpu::format_kernel_timeline(records, windows_ns.back());
      }
#if FERRY_HAVE_CUDA
      for (const auto& s : b.stages()) {
        if (auto* cs = dynamic_cast<gpu::CudaStage*>(s.get())) r.bytes_per_token += cs->decode_bytes_per_token(d + n / 2);
      }
#endif
      if (om.plan.tiered()) {
        const model::ExpertTierCounters c = expert_counters(b);
        ExpertRow x{r.test, n * o.reps, r.mean_tps(), r.bytes_per_token, c};
        x.delta.routes -= tier_before.routes;
        x.delta.hits -= tier_before.hits;
        x.delta.bytes_mapped -= tier_before.bytes_mapped;
        x.delta.bytes_uploaded -= tier_before.bytes_uploaded;
        x.delta.promotions -= tier_before.promotions;
        expert_rows.push_back(x);
      }
      results.push_back(r);
      std::fprintf(stderr, "  %-18s %10.1f t/s\n", r.test.c_str(), r.mean_tps());
    }
    for (size_t i = 0; i < b.stages().size(); ++i) {
      const model::StageCounters c = b.stages()[i]->counters();
      if (c.kv_window_rows == 0) continue;
      const double steps = static_cast<double>(c.steps - before[i].steps);
      const uint64_t fetched = c.kv_fetched_rows - before[i].kv_fetched_rows, hits = c.kv_hits - before[i].kv_hits;
      char line[320];
      std::snprintf(line, sizeof line,
                    "tg @ d%u, stage %zu: %llu windowed steps of %.0f, %.1f rows and %.0f bytes fetched/step, "
                    "hit rate %.4f, %llu of %llu window rows resident, host KV %.1f MiB (slot 0)",
                    d, i, static_cast<unsigned long long>(c.kv_windowed_steps - before[i].kv_windowed_steps), steps,
                    steps > 0 ? static_cast<double>(fetched) / steps : 0.0,
                    steps > 0 ? static_cast<double>(c.kv_fetched_bytes - before[i].kv_fetched_bytes) / steps : 0.0,
                    hits + fetched > 0 ? static_cast<double>(hits) / static_cast<double>(hits + fetched) : 1.0,
                    static_cast<unsigned long long>(c.kv_resident_rows), static_cast<unsigned long long>(c.kv_window_rows),
                    c.kv_host_slot_bytes.empty() ? 0.0 : static_cast<double>(c.kv_host_slot_bytes[0]) / 1048576.0);
      windows.push_back(line);
    }
    for (size_t i = 0; i + 1 < b.stages().size(); ++i) {
      const model::StageCounters c = b.stages()[i]->counters();
      const double steps = static_cast<double>(c.steps - before[i].steps);
      const double timed = static_cast<double>(c.handoffs_timed - before[i].handoffs_timed);
      char line[256];
      std::snprintf(line, sizeof line, "tg @ d%u, stage %zu -> %zu: %.0f bytes/step, %.2f us/step of copy", d, i, i + 1,
                    steps > 0 ? static_cast<double>(c.handoff_bytes - before[i].handoff_bytes) / steps : 0.0,
                    timed > 0 ? 1000.0 * (c.handoff_ms - before[i].handoff_ms) / timed : 0.0);
      handoffs.push_back(line);
    }
    if (o.mtp > 0 && failure.empty()) {
      Result r{"tg" + std::to_string(max_n) + " mtp" + std::to_string(o.mtp) + " @ d" + std::to_string(d), max_n, d,
               true, {}, 0, std::nullopt};
      model::SpecCounts total;
      for (uint32_t rep = 0; rep < o.reps && failure.empty(); ++rep) {
        back_to_depth();
        model::SlotRows first{0, d, {tok(rng)}, false, true, {}};
        first.draft = o.mtp;
        auto res = b.step({first});
        if (!res) {
          failure = res.error().message;
          break;
        }
        model::SpecDecoder dec(d + 1, (*res)[0].sampled, (*res)[0].drafts);
        uint32_t made = 0;
        const double t0 = now_s();
        while (made < max_n) {
          const model::SlotRows rows = dec.rows(0, {}, o.mtp);
          res = b.step({rows});
          om.rebalance();
          if (!res) {
            failure = res.error().message;
            break;
          }
          made += static_cast<uint32_t>(dec.apply(rows, (*res)[0]).size());
        }
        r.seconds.push_back((now_s() - t0) * max_n / std::max<uint32_t>(made, 1));  // per max_n tokens
        total.drafted += dec.counts().drafted;
        total.accepted += dec.counts().accepted;
        total.steps += dec.counts().steps;
      }
      results.push_back(r);
      std::fprintf(stderr, "  %-18s %10.1f t/s, %llu of %llu drafts accepted, %.2f tokens a step\n", r.test.c_str(),
                   r.mean_tps(), static_cast<unsigned long long>(total.accepted),
                   static_cast<unsigned long long>(total.drafted),
                   total.steps ? static_cast<double>(max_n) * o.reps / static_cast<double>(total.steps) : 0.0);
      // The verify step alone, then with the MTP block's drafts after it: what a speculative step
      // costs against the tg step, and the decode rate it gives at the user's acceptance.
      const Result v = time_verify(b, back_to_depth, random_tokens, d, o.mtp, false, max_n, o.reps, failure);
      const Result vd = time_verify(b, back_to_depth, random_tokens, d, o.mtp, true, max_n, o.reps, failure);
      if (!failure.empty()) break;
      results.push_back(v);
      results.push_back(vd);
      const std::string tg_name = "tg" + std::to_string(max_n) + " @ d" + std::to_string(d);
      const auto tg_result = std::find_if(results.begin(), results.end(), [&](const Result& x) { return x.test == tg_name; });
      const double tg_ms = tg_result != results.end() ? tg_result->ms_per_token() : 0.0;
      for (const Result* x : {&v, &vd}) {
        std::fprintf(stderr, "  %-18s %10.3f ms a step, %.2fx the tg step (%.3f ms)\n", x->test.c_str(), x->ms_per_token(),
                     tg_ms > 0 ? x->ms_per_token() / tg_ms : 0.0, tg_ms);
      }
      // Tokens a step at acceptance p: 1 + p + ... + p^K (drafts accepted in a row, then the draw).
      constexpr double p = 0.883;
      const double tokens = (1.0 - std::pow(p, o.mtp + 1)) / (1.0 - p);
      std::fprintf(stderr, "  at %.1f%% acceptance: %.2f tokens a step, %.1f t/s, %.2fx tg\n", 100.0 * p, tokens,
                   1000.0 * tokens / vd.ms_per_token(), tg_ms > 0 ? tg_ms * tokens / vd.ms_per_token() : 0.0);
    }
    if (o.slots > 1 && failure.empty()) {
      SlotsBench sb;
      sb.slots = o.slots;
      sb.depth = d;
      sb.tokens = max_n;
      sb.prefill_chunk = std::max<uint32_t>(max_p, 512);
      sb.micro_batches = o.micro_batches;
      sb.split = bo.split;
      sb.seed = o.seed;
      auto sr = bench_slots(om, sb);
      if (!sr) {
        failure = sr.error().message;
        break;
      }
      Result r{"tg" + std::to_string(max_n) + " x" + std::to_string(o.slots) + " @ d" + std::to_string(d), max_n, d,
               true, {}, 0, std::nullopt};
      r.slots = sr.value();
      results.push_back(r);
      std::fprintf(stderr, "  %-18s %10.1f t/s aggregate (%u micro-batches)\n", r.test.c_str(), sr->aggregate_tps,
                   sr->micro_batches);
    }
    if (!failure.empty()) break;
  }
  if (!failure.empty()) {
    std::fprintf(stderr, "ferry bench: %s\n", failure.c_str());
    return 1;
  }
  // As the server does at shutdown: the route counts for the next run's warm start.
  if (om.experts && !bo.memory.expert_stats.empty()) {
    if (auto e = om.experts->save_counts(bo.memory.expert_stats)) std::fprintf(stderr, "ferry bench: %s\n", e->message.c_str());
  }

  uint64_t peak = 0, weights = 0;
  std::string device = b.describe();
#if FERRY_HAVE_CUDA
  std::map<int, uint64_t> peak_by_device;
  for (const auto& s : b.stages()) {
    auto* cs = dynamic_cast<gpu::CudaStage*>(s.get());
    if (cs == nullptr) continue;
    const gpu::DeviceMemoryReport m = cs->memory();
    weights += m.weight_bytes;
    peak_by_device[cs->device()] = m.peak_bytes;
  }
  for (const auto& [dev, bytes] : peak_by_device) peak += bytes;
  // Launches a token (issue 15): the one-row decode graph's kernels, over the stages.
  size_t launches = 0, products = 0;
  for (const auto& s : b.stages()) {
    auto* cs = dynamic_cast<gpu::CudaStage*>(s.get());
    if (cs == nullptr) continue;
    for (const std::string& k : cs->decode_graph_kernels(1, 1, 1)) {
      if (k.rfind("(mem", 0) == 0) continue;  // copies and memsets are nodes, not launches
      ++launches;
      products += k.rfind("int16_kernel", 0) == 0 || k.rfind("matvec_", 0) == 0 || k.rfind("wide_kernel", 0) == 0;
    }
  }
  if (launches > 0) {
    std::fprintf(stderr, "ferry bench: one-row decode graph: %zu kernels a step, %zu of them matvecs\n", launches,
                 products);
  }
#endif
  if (o.json) {
    std::printf("{\"model\": \"%s\", \"backend\": \"%s\", \"weight_bytes\": %llu, \"peak_device_bytes\": %llu, "
                "\"copy_bandwidth_Bps\": %.0f, \"results\": [",
                model_name.c_str(), device.c_str(), static_cast<unsigned long long>(weights),
                static_cast<unsigned long long>(peak), copy_bw);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::string per_slot;
      if (r.slots) {
        for (double x : r.slots->per_slot_tps) per_slot += (per_slot.empty() ? "" : ", ") + std::to_string(x);
        per_slot = ", \"per_slot_tps\": [" + per_slot + "], \"overlap_s\": " + std::to_string(r.slots->overlap_s);
      }
      std::printf("%s\n  {\"test\": \"%s\", \"tokens\": %u, \"depth\": %u, \"tps_mean\": %.3f, \"tps_sd\": %.3f, "
                  "\"ms_per_token\": %.4f, \"bytes_per_token\": %llu%s}",
                  i ? "," : "", r.test.c_str(), r.tokens, r.depth, r.mean_tps(), r.sd_tps(), r.ms_per_token(),
                  static_cast<unsigned long long>(r.bytes_per_token), per_slot.c_str());
    }
    std::printf("\n]}\n");
    return 0;
  }
  std::printf("model: %s\nbackend: %s\n", model_name.c_str(), device.c_str());
  if (peak) std::printf("weights on device: %.2f GiB, peak device memory: %.2f GiB\n", weights / 1073741824.0, peak / 1073741824.0);
  if (copy_bw > 0) std::printf("measured device copy bandwidth: %.0f GB/s (read + write)\n", copy_bw / 1e9);
  if (!om.plan.stages.empty()) std::printf("KV: %s\n", gpu::kv_resident_line(om.plan).c_str());
  std::printf("\n| %-18s | %18s | %10s | %14s | %14s |\n", "test", "t/s", "ms/token", "bytes/token", "of copy BW");
  std::printf("| %-18s | %18s | %10s | %14s | %14s |\n", "---", "---", "---", "---", "---");
  for (const Result& r : results) {
    char tps[64], bpt[32] = "", frac[32] = "";
    std::snprintf(tps, sizeof tps, "%.2f ± %.2f", r.mean_tps(), r.sd_tps());
    if (r.bytes_per_token) {
      std::snprintf(bpt, sizeof bpt, "%.3f GB", r.bytes_per_token / 1e9);
      if (copy_bw > 0) {
        const double achieved = r.bytes_per_token * r.mean_tps();
        std::snprintf(frac, sizeof frac, "%.0f GB/s %.0f%%", achieved / 1e9, 100.0 * achieved / copy_bw);
      }
    }
    std::printf("| %-18s | %18s | %10.3f | %14s | %14s |\n", r.test.c_str(), tps, r.ms_per_token(), bpt, frac);
  }
  for (const Result& r : results) {
    if (!r.slots) continue;
    std::printf("\n%s: aggregate %.2f t/s over an overlap of %.2f s, %u micro-batches; per slot", r.test.c_str(),
                r.slots->aggregate_tps, r.slots->overlap_s, r.slots->micro_batches);
    for (double x : r.slots->per_slot_tps) std::printf(" %.2f", x);
    std::printf(" t/s\n");
  }
  if (!expert_rows.empty()) {
    const model::ExpertTierCounters c = expert_counters(b);
    std::printf("\nrouted experts: %u of %u in device pools, host store %.2f GiB; host-to-device bandwidth %.1f GB/s\n%s",
                c.pool_slots, om.plan.experts_total, static_cast<double>(om.plan.host.store_bytes) / 1073741824.0,
                host_bw / 1e9, format_expert_rows(expert_rows, copy_bw, host_bw).c_str());
  }
  if (!handoffs.empty()) std::printf("\nhand-off between stages:\n");
  for (const std::string& h : handoffs) std::printf("  %s\n", h.c_str());
  if (!windows.empty()) std::printf("\nresident KV window (--kv-resident %u):\n", om.plan.kv_resident);
  for (const std::string& w : windows) std::printf("  %s\n", w.c_str());
  if (o.op_times && op_tables.empty()) std::printf("\n--op-times: no CUDA stage, nothing timed\n");
  for (const std::string& t : op_tables) std::printf("\n%s", t.c_str());
  if (o.kernel_times && kernel_tables.empty()) std::printf("\n--kernel-times: no CUDA stage, nothing recorded\n");
  if (!kernel_tables.empty()) std::printf("\n--kernel-times (the tg figures above were taken with CUPTI recording):\n");
  for (const std::string& t : kernel_tables) std::printf("\n%s", t.c_str());
  if (!o.kernel_timeline.empty()) {
    if (std::FILE* f = std::fopen(o.kernel_timeline.c_str(), "w")) {
      std::fputs(timelines.c_str(), f);
      std::fclose(f);
    } else {
      std::fprintf(stderr, "ferry bench: --kernel-timeline: cannot write %s\n", o.kernel_timeline.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

CommandRun add_bench_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("bench", "Measure prefill and decode speed (llama-bench style)");
  sub->add_option("--model,-m", o->model, "GGUF model file")->check(CLI::ExistingFile);
  sub->add_option("--synthetic", o->synthetic, "config.json of a glm5_next shape: pseudo-random weights on the GPU")
      ->check(CLI::ExistingFile);
  sub->add_option("--type", o->type, "weight type of the synthetic model's large matrices")->capture_default_str();
  sub->add_option("--recipe", o->recipe,
                  "with --synthetic: REGEX=TYPE rules per tensor, as ferry convert --recipe (e.g. "
                  "model/glm5/recipes/maya-l.recipe); --type for the tensors no rule names")
      ->check(CLI::ExistingFile);
  sub->add_option("--backend", o->backend, "auto, cpu or cuda")->capture_default_str();
  sub->add_option("--kv-type", o->kv_type, "DSA latent rows: f32, f16, int8 or auto (int8 on CUDA, f32 on the CPU)")
      ->capture_default_str();
  sub->add_option("--kv-resident", o->kv_resident,
                  "CUDA: DSA latent rows per layer and slot kept on the device; past it a pinned host tier holds the "
                  "rest (0: the whole context; default: the memory plan's choice, as serve)");
  sub->add_option("--fill", o->fill,
                  "how each depth is reached: prefill (a real prefill of random tokens) or random (the slot's state "
                  "drawn at random: deep decode without the prefill; tests marked rnd)")
      ->check(CLI::IsMember({"prefill", "random"}))
      ->capture_default_str();
  sub->add_option("-p,--n-prompt", o->prompt, "prefill chunk sizes, comma-separated")->capture_default_str();
  sub->add_option("-n,--n-gen", o->gen, "decode lengths, comma-separated")->capture_default_str();
  sub->add_option("-d,--n-depth", o->depth, "tokens already in the sequence, comma-separated")->capture_default_str();
  sub->add_option("-r,--repetitions", o->reps, "timed repetitions of each test")->capture_default_str()->check(CLI::Range(1, 100));
  sub->add_option("--temperature", o->temperature, "sampling temperature of every step (0: greedy)")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--top-p", o->top_p, "nucleus cut of the draw when --temperature > 0")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--seed", o->seed, "seed of the synthetic weights and the prompt tokens")->capture_default_str();
  sub->add_option("--devices", o->devices, "CUDA devices of the stages, e.g. 0,1 (default: 0)");
  sub->add_option("--split", o->split,
                  "pipeline stages: the first layer of each stage after the first (3,6,9 = four stages), auto or none")
      ->capture_default_str();
  sub->add_option("--slots", o->slots,
                  "also decode this many requests at once through the engine's scheduler and stage actors")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  sub->add_option("--mtp", o->mtp, "also decode with this many MTP drafts a step, and time a verify step of that many drafts (0: not run)")
      ->capture_default_str()
      ->check(CLI::Range(0, 3));
  sub->add_option("--micro-batches", o->micro_batches, "with --slots: decode micro-batches (0: one per device)")
      ->capture_default_str();
  config::for_each_memory_option(o->memory, [&](const std::string& name, std::string& value, const std::string& help) {
    sub->add_option("--" + name, value, help)->capture_default_str();
  });
  sub->add_option("--route-skew", o->route_skew,
                  "with --synthetic: routers prefer experts by a stable random rank, choice score -S*ln(rank) (0: none)")
      ->capture_default_str();
  sub->add_flag("--json", o->json, "print the results as JSON");
  sub->add_flag("--op-times", o->op_times,
                "CUDA: time each op group of the timed prefill steps with events on the compute stream and print "
                "the breakdown a chunk (the repetitions' mean)");
  CLI::Option* kernel_times = sub->add_flag("--kernel-times", o->kernel_times,
                "CUDA: record every kernel of the timed decode steps with CUPTI (graph nodes each with start and end) "
                "and print, per kernel name, launches a step, their time, their share of the step's span and the idle "
                "gaps before them (the tg figures then include CUPTI's cost)");
  sub->add_option("--kernel-timeline", o->kernel_timeline,
                  "with --kernel-times: write each tg test's last step, kernel by kernel in start order, to this CSV file")
      ->needs(kernel_times);
  sub->add_flag("!--no-bandwidth", o->measure_bandwidth, "skip the copy-bandwidth measurement");
  return [o] { return bench(*o); };
}

}  // namespace ferry::cli
