// `ferry eval-ref --model M.gguf --reference CASE_DIR [--chunk N] [--tolerance T]`: runs a reference
// case (tools/reference/make_fixtures.py) through the CPU forward pass, prefilling in chunks of N, then
// feeding the reference's decode tokens one by one, and compares logits (max |delta|, top-1) and the
// DSA pool selections with transformers'. Exit 1 above tolerance.
//
// `--compare-to-f32 F32.gguf`: for a quantized conversion, compares M with the f32 conversion of the
// same checkpoint instead (top-1 agreement and mean KL(f32 || M) over every prompt and decode row;
// exit 1 below --min-top1 or above --max-kl). This needs only the case's token ids, so --reference
// may also be a JSON file of ids without logits (an evaluation window of a trained case).
//
// `--kv-type f32|f16|int8` stores the DSA latent rows so (default: f32 on the CPU forward pass, int8 on
// CUDA); `--kv-index-type` the indexer's cached keys and gates (CPU forward pass only: how the choice of
// f32 for them was measured). `--compare-kv-f32` runs the case a second time with f32 KV on the same
// backend and compares the two (top-1, mean KL(f32 || kv-type), and on the CPU the DSA selections;
// exit 1 below --min-top1 or above --max-kl).
//
// On the CPU forward pass a model with an MTP block also reports how often the block's draft equals the
// trunk's next top-1 over the case's text (the greedy acceptance of one draft a step); `--min-mtp-accept`
// bounds it (exit 1 below), and with it a case of token ids only (an evaluation window) is enough.
//
// `--backend cuda`, or `--split` on any backend: runs the case through the model's stages instead
// (logits, and on a CUDA last stage the MTP block's: no DSA selections), split as --split and --devices
// say; with `--compare-cpu`
// it also runs the CPU forward pass on the same file and requires top-1 agreement >= --min-top1 with
// it (the check for quantized files).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>

#include "gpu/backend_factory.hpp"
#include "model/cpu/glm5_forward.hpp"
#include "model/glm5/glm5_weights.hpp"
#include "model/cpu/sampler.hpp"
#include "config/kv_type.hpp"
#include "config/memory_options.hpp"
#include "tools/ferry/bench_experts.hpp"
#include "tools/ferry/commands.hpp"
#include "tools/ferry/reference_case.hpp"
#if FERRY_HAVE_CUDA
#include "gpu/cuda_stage.hpp"
#endif

namespace ferry::cli {
namespace {

struct Options {
  std::string model, reference, f32_model;
  size_t chunk = 0;
  double tolerance = 1e-3;
  double min_top1 = 0.99;
  double max_kl = 0.01;
  unsigned threads = 0;
  std::string backend = "cpu";
  bool compare_cpu = false;
  std::string kv_type = "auto", kv_index_type = "f32";
  std::optional<uint32_t> kv_resident;  // CUDA: latent rows per DSA layer on the device (unset: the plan's)
  bool compare_kv = false;
  double min_mtp_accept = -1;  // < 0: no bound (the agreement is reported whenever the model has MTP)
  std::string split = "none", devices;
  config::MemoryOptionsText memory;
};

struct Diff {
  double max_abs = 0;
  size_t top1 = 0, rows = 0;
  double kl_sum = 0;
};

// Over rows of two logit tables: max |a - b|, argmax agreement, KL(softmax a || softmax b).
Diff compare(const std::vector<float>& a, const std::vector<float>& b, size_t vocab) {
  Diff d;
  d.rows = vocab == 0 ? 0 : a.size() / vocab;
  for (size_t r = 0; r < d.rows; ++r) {
    const std::span<const float> ra(a.data() + r * vocab, vocab), rb(b.data() + r * vocab, vocab);
    double ma = ra[0], mb = rb[0];
    for (size_t i = 0; i < vocab; ++i) {
      d.max_abs = std::max(d.max_abs, std::abs(double(ra[i]) - double(rb[i])));
      ma = std::max(ma, double(ra[i]));
      mb = std::max(mb, double(rb[i]));
    }
    if (model::argmax_token(ra) == model::argmax_token(rb)) ++d.top1;
    double za = 0, zb = 0;
    for (size_t i = 0; i < vocab; ++i) {
      za += std::exp(ra[i] - ma);
      zb += std::exp(rb[i] - mb);
    }
    double kl = 0;
    for (size_t i = 0; i < vocab; ++i) {
      const double la = ra[i] - ma - std::log(za), lb = rb[i] - mb - std::log(zb);
      kl += std::exp(la) * (la - lb);
    }
    d.kl_sum += kl;
  }
  return d;
}

// The MTP block's drafts on the case's text: row t (fed the trunk's hidden state at t and token t+1)
// drafts token t+2; plain greedy decoding there picks the trunk's top-1 of row t+1, so the share of rows
// that agree is the greedy acceptance of one draft a step (K = 1) on this text, teacher-forced.
// Also against the text's own token t+2 (the case's decode tokens are greedy, a window's are the text).
struct MtpAgreement {
  size_t rows = 0, with_trunk = 0, text_rows = 0, with_text = 0;
};

MtpAgreement mtp_agreement(const CaseRun& run, const ReferenceCase& ref) {
  MtpAgreement a;
  const size_t V = ref.vocab, n = ref.input_ids.size() + ref.decode_tokens.size();
  if (V == 0 || run.mtp.size() != (n - 1) * V) return a;
  auto token = [&](size_t i) { return i < ref.input_ids.size() ? ref.input_ids[i] : ref.decode_tokens[i - ref.input_ids.size()]; };
  auto trunk_row = [&](size_t i) {
    return i < ref.input_ids.size() ? run.prefill.data() + i * V : run.decode.data() + (i - ref.input_ids.size()) * V;
  };
  for (size_t t = 0; t + 1 < n; ++t) {
    const int32_t draft = model::argmax_token(std::span<const float>(run.mtp.data() + t * V, V));
    ++a.rows;
    a.with_trunk += draft == model::argmax_token(std::span<const float>(trunk_row(t + 1), V));
    if (t + 2 < n) {
      ++a.text_rows;
      a.with_text += draft == token(t + 2);
    }
  }
  return a;
}

// Prints the agreement; false when it is below a bound that was asked for.
bool report_mtp_agreement(const Options& o, const CaseRun& run, const ReferenceCase& ref) {
  if (run.mtp.empty()) return o.min_mtp_accept < 0;
  const MtpAgreement a = mtp_agreement(run, ref);
  const double share = a.rows ? double(a.with_trunk) / double(a.rows) : 0.0;
  std::printf("mtp      drafts equal the trunk's next top-1 in %zu/%zu rows (%.2f%%: greedy K=1 acceptance on this "
              "text), the text's token in %zu/%zu\n",
              a.with_trunk, a.rows, 100.0 * share, a.with_text, a.text_rows);
  if (o.min_mtp_accept < 0) return true;
  const bool ok = share >= o.min_mtp_accept;
  std::printf("%s (MTP acceptance >= %.2f%%)\n", ok ? "PASS" : "FAIL", 100.0 * o.min_mtp_accept);
  return ok;
}

// Prefill and decode logits of a run in one table.
std::vector<float> all_logits(const CaseRun& r) {
  std::vector<float> a(r.prefill);
  a.insert(a.end(), r.decode.begin(), r.decode.end());
  return a;
}

// `run` (KV in `type`) against `base` (f32 KV): top-1, mean KL and, where both have them, the DSA
// selections; the verdict against the bounds.
int report_kv(const Options& o, const CaseRun& base, const CaseRun& run, config::KvType type, size_t vocab) {
  const Diff d = compare(all_logits(base), all_logits(run), vocab);
  const double top1 = d.rows ? double(d.top1) / double(d.rows) : 1.0;
  const double kl = d.rows ? d.kl_sum / double(d.rows) : 0.0;
  std::printf("vs f32 KV  kv %s: top-1 %zu/%zu (%.2f%%), mean KL %.3e, max|delta| %.3e\n",
              std::string(config::kv_type_name(type)).c_str(), d.top1, d.rows, 100.0 * top1, kl, d.max_abs);
  for (const auto& [layer, want] : base.selections) {
    auto it = run.selections.find(layer);
    size_t same = 0;
    if (it != run.selections.end()) {
      for (size_t pos = 0; pos < want.size() && pos < it->second.size(); ++pos) same += it->second[pos] == want[pos];
    }
    std::printf("dsa        layer %s: %zu/%zu queries select the f32-KV run's pools\n", layer.c_str(), same, want.size());
  }
  const bool ok = top1 >= o.min_top1 && kl <= o.max_kl;
  std::printf("%s (top-1 >= %.2f%%, mean KL <= %.3g)\n", ok ? "PASS" : "FAIL", 100.0 * o.min_top1, o.max_kl);
  return ok ? 0 : 1;
}

// The CPU forward pass over a model file, with the pieces it needs.
struct CpuModel {
  std::unique_ptr<model::Glm5Weights> weights;
  std::unique_ptr<model::ThreadPool> pool;
  std::unique_ptr<model::Glm5Forward> forward;
};

std::optional<CpuModel> open_model(const std::string& path, unsigned threads) {
  auto w = model::Glm5Weights::load(path);
  if (!w) {
    std::fprintf(stderr, "ferry eval-ref: %s: %s\n", path.c_str(), w.error().message.c_str());
    return std::nullopt;
  }
  CpuModel m;
  m.weights = std::move(w.value());
  m.pool = std::make_unique<model::ThreadPool>(threads);
  m.forward = std::make_unique<model::Glm5Forward>(*m.weights, *m.pool);
  return m;
}

int eval_ref_backend(const Options& o, const ReferenceCase& ref, config::KvType kv) {
  gpu::BackendOptions bo;
  bo.kind = o.backend;
  bo.kv_type = kv;
  bo.kv_resident = o.kv_resident;
  bo.max_slots = 1;
  bo.threads = o.threads;
  bo.max_context = static_cast<uint32_t>(ref.input_ids.size() + ref.decode_tokens.size() + 16);
  bo.mtp = !ref.mtp.empty();  // the last stage runs the MTP block: its logits are compared too
  if (auto e = config::parse_split(o.split, bo.split)) {
    std::fprintf(stderr, "ferry eval-ref: %s\n", e->message.c_str());
    return 2;
  }
  if (!o.devices.empty()) {
    if (auto e = config::parse_devices(o.devices, bo.split)) {
      std::fprintf(stderr, "ferry eval-ref: %s\n", e->message.c_str());
      return 2;
    }
  }
  if (const auto errors = config::parse_memory_options(o.memory, bo.memory); !errors.empty()) {
    for (const auto& e : errors) std::fprintf(stderr, "ferry eval-ref: %s\n", e.c_str());
    return 2;
  }
  auto opened = gpu::open_pipeline(o.model, bo);
  if (!opened) {
    std::fprintf(stderr, "ferry eval-ref: %s\n", opened.error().message.c_str());
    return 2;
  }
  model::Pipeline& b = *opened->pipeline;
  if (b.hparams().vocab_size != ref.vocab) {
    std::fprintf(stderr, "ferry eval-ref: the model's vocabulary has %u tokens, the reference's %u\n",
                 b.hparams().vocab_size, ref.vocab);
    return 2;
  }
  const size_t P = ref.input_ids.size(), S = ref.decode_tokens.size();
  const size_t chunk = o.chunk == 0 ? P : o.chunk;
  std::printf("case %s: prompt %zu, decode %zu, chunk %zu, %s (%s)\n", ref.name.c_str(), P, S, chunk, o.model.c_str(),
              b.describe().c_str());
#if FERRY_HAVE_CUDA
  // The CUDA MTP block's logits of every entry, in position order (one slot): the reference's rows.
  auto* mtp_stage = dynamic_cast<gpu::CudaStage*>(b.stages().back().get());
  if (mtp_stage != nullptr && !mtp_stage->drafts()) mtp_stage = nullptr;
  if (mtp_stage != nullptr) mtp_stage->record_mtp_logits(true);
#endif
  auto ran = run_case_pipeline(b, ref, chunk, [&] { opened->rebalance(); });
  if (!ran) {
    std::fprintf(stderr, "ferry eval-ref: %s\n", ran.error().message.c_str());
    return 2;
  }
  CaseRun& run = ran.value();
#if FERRY_HAVE_CUDA
  if (mtp_stage != nullptr) run.mtp = mtp_stage->take_mtp_logits();
#endif
  std::printf("speed    prefill %.1f tokens/s, decode %.1f tokens/s\n", double(P) / std::max(run.prefill_seconds, 1e-9),
              double(S) / std::max(run.decode_seconds, 1e-9));
  for (size_t i = 0; i < b.stages().size(); ++i) {
    const model::StageCounters c = b.stages()[i]->counters();
    if (c.kv_window_rows == 0) continue;
    std::printf("kv window stage %zu: --kv-resident %u, %llu windowed steps, %llu rows fetched, %llu hits, %llu of %llu "
                "window rows resident\n",
                i, opened->plan.kv_resident, static_cast<unsigned long long>(c.kv_windowed_steps),
                static_cast<unsigned long long>(c.kv_fetched_rows), static_cast<unsigned long long>(c.kv_hits),
                static_cast<unsigned long long>(c.kv_resident_rows), static_cast<unsigned long long>(c.kv_window_rows));
  }
  if (opened->plan.tiered()) {
    const model::ExpertTierCounters c = expert_counters(b);
    std::printf("experts  %u pool slots of %u experts: %llu routes, %llu in the pool, %llu read from host memory, "
                "%llu uploaded; %llu swaps\n",
                c.pool_slots, opened->plan.experts_total, static_cast<unsigned long long>(c.routes),
                static_cast<unsigned long long>(c.hits), static_cast<unsigned long long>(c.misses_mapped),
                static_cast<unsigned long long>(c.misses_uploaded), static_cast<unsigned long long>(c.promotions));
  }
  if (o.compare_kv) {
    bo.kv_type = config::KvType::f32;
    auto base_model = gpu::open_pipeline(o.model, bo);
    if (!base_model) {
      std::fprintf(stderr, "ferry eval-ref: %s\n", base_model.error().message.c_str());
      return 2;
    }
    auto base = run_case_pipeline(*base_model->pipeline, ref, chunk, [&] { base_model->rebalance(); });
    if (!base) {
      std::fprintf(stderr, "ferry eval-ref: %s\n", base.error().message.c_str());
      return 2;
    }
    return report_kv(o, base.value(), run, kv, ref.vocab);
  }
  const Diff pre = compare(ref.prefill, run.prefill, ref.vocab);
  const Diff dec = compare(ref.decode, run.decode, ref.vocab);
  if (ref.has_logits) {
    std::printf("prefill  max|delta| %.3e  top-1 %zu/%zu\n", pre.max_abs, pre.top1, pre.rows);
    std::printf("decode   max|delta| %.3e  top-1 %zu/%zu\n", dec.max_abs, dec.top1, dec.rows);
  }
  if (o.compare_cpu) {
    auto cpu = open_model(o.model, o.threads);
    if (!cpu) return 2;
    const CaseRun base = run_case(*cpu->forward, ref, chunk, false, config::KvFormats{kv, config::KvType::f32});
    const Diff d = compare(all_logits(base), all_logits(run), ref.vocab);
    const double top1 = d.rows ? double(d.top1) / double(d.rows) : 1.0;
    std::printf("vs cpu   (both kv %s) top-1 %zu/%zu (%.2f%%), mean KL %.3e, max|delta| %.3e\n",
                std::string(config::kv_type_name(kv)).c_str(), d.top1, d.rows, 100.0 * top1, d.rows ? d.kl_sum / double(d.rows) : 0.0, d.max_abs);
    const bool ok = top1 >= o.min_top1;
    std::printf("%s (top-1 agreement with the CPU backend >= %.2f%%)\n", ok ? "PASS" : "FAIL", 100.0 * o.min_top1);
    return ok ? 0 : 1;
  }
  double worst = std::max(pre.max_abs, dec.max_abs);
  if (!ref.mtp.empty() && run.mtp.empty()) {
    std::printf("mtp      not compared: the last stage runs no MTP block (the model file has none, or the backend is cpu)\n");
  } else if (!ref.mtp.empty()) {
    if (run.mtp.size() != ref.mtp.size()) {
      std::printf("mtp      %zu rows of logits, the reference has %zu\n", run.mtp.size() / ref.vocab,
                  ref.mtp.size() / ref.vocab);
      std::printf("FAIL (the MTP block's entries)\n");
      return 1;
    }
    const Diff m = compare(ref.mtp, run.mtp, ref.vocab);
    std::printf("mtp      max|delta| %.3e  top-1 %zu/%zu\n", m.max_abs, m.top1, m.rows);
    worst = std::max(worst, m.max_abs);
  }
  const bool ok = worst <= o.tolerance;
  std::printf("%s (tolerance %.1e)\n", ok ? "PASS" : "FAIL", o.tolerance);
  return ok ? 0 : 1;
}

int eval_ref(const Options& o) {
  auto loaded = ReferenceCase::load(o.reference);
  if (!loaded) {
    std::fprintf(stderr, "ferry eval-ref: %s\n", loaded.error().message.c_str());
    return 2;
  }
  const ReferenceCase& ref = *loaded;
  const bool compares_models = o.compare_kv || (o.backend == "cpu" ? !o.f32_model.empty() : o.compare_cpu);
  if (!ref.has_logits && !compares_models && !(o.backend == "cpu" && o.min_mtp_accept >= 0)) {
    std::fprintf(stderr, "ferry eval-ref: %s has token ids but no reference logits (no logits_files): use it with %s\n",
                 o.reference.c_str(), o.backend == "cpu" ? "--compare-to-f32 or --min-mtp-accept" : "--compare-cpu");
    return 2;
  }
  auto kind = gpu::resolve_backend_kind(o.backend);
  if (!kind) {
    std::fprintf(stderr, "ferry eval-ref: %s\n", kind.error().message.c_str());
    return 2;
  }
  Expected<config::KvType> kv = o.kv_type == "auto" ? gpu::default_kv_type(kind.value()) : config::parse_kv_type(o.kv_type);
  Expected<config::KvType> kv_index = config::parse_kv_type(o.kv_index_type);
  if (!kv || !kv_index) {
    std::fprintf(stderr, "ferry eval-ref: --kv-type/--kv-index-type: %s\n", (!kv ? kv : kv_index).error().message.c_str());
    return 2;
  }
  const bool cpu_forward = o.backend == "cpu" && o.split == "none" && o.devices.empty();
  if (!cpu_forward && kv_index.value() != config::KvType::f32) {
    std::fprintf(stderr, "ferry eval-ref: --kv-index-type other than f32 is for the CPU forward pass only\n");
    return 2;
  }
  if (!cpu_forward) return eval_ref_backend(o, ref, kv.value());
  const config::KvFormats formats{kv.value(), kv_index.value()};
  auto backend = open_model(o.model, o.threads);
  if (!backend) return 2;
  const model::Glm5Hparams& hp = backend->weights->hparams();
  if (hp.vocab_size != ref.vocab) {
    std::fprintf(stderr, "ferry eval-ref: the model's vocabulary has %u tokens, the reference's %u\n", hp.vocab_size,
                 ref.vocab);
    return 2;
  }
  const size_t P = ref.input_ids.size(), S = ref.decode_tokens.size();
  const size_t chunk = o.chunk == 0 ? P : o.chunk;
  std::printf("case %s: prompt %zu, decode %zu, chunk %zu, %s (cpu, %u threads)\n", ref.name.c_str(), P, S, chunk,
              o.model.c_str(), backend->pool->size());
  const CaseRun run = run_case(*backend->forward, ref, chunk, o.f32_model.empty(), formats);
  std::printf("speed    prefill %.1f tokens/s, decode %.1f tokens/s\n", double(P) / std::max(run.prefill_seconds, 1e-9),
              double(S) / std::max(run.decode_seconds, 1e-9));

  if (o.compare_kv) {
    const CaseRun base = run_case(*backend->forward, ref, chunk, true);
    std::printf("kv         latent %s, indexer keys/gates %s\n", std::string(config::kv_type_name(formats.latent)).c_str(),
                std::string(config::kv_type_name(formats.index)).c_str());
    return report_kv(o, base, run, formats.latent, ref.vocab);
  }
  if (!o.f32_model.empty()) {
    auto base = open_model(o.f32_model, o.threads);
    if (!base) return 2;
    const CaseRun ref32 = run_case(*base->forward, ref, chunk, false);
    std::vector<float> a(ref32.prefill), b(run.prefill);
    a.insert(a.end(), ref32.decode.begin(), ref32.decode.end());
    b.insert(b.end(), run.decode.begin(), run.decode.end());
    const Diff d = compare(a, b, ref.vocab);
    const double top1 = d.rows ? double(d.top1) / double(d.rows) : 1.0;
    const double kl = d.rows ? d.kl_sum / double(d.rows) : 0.0;
    std::string vs_ref;
    if (ref.has_logits) {
      char text[64];
      std::snprintf(text, sizeof text, " (prefill vs reference %.3e)", compare(ref.prefill, run.prefill, ref.vocab).max_abs);
      vs_ref = text;
    }
    std::printf("vs f32   %s: top-1 %zu/%zu (%.2f%%), mean KL %.3e, max|delta| %.3e%s\n", o.f32_model.c_str(), d.top1,
                d.rows, 100.0 * top1, kl, d.max_abs, vs_ref.c_str());
    const bool ok = top1 >= o.min_top1 && kl <= o.max_kl;
    std::printf("%s (top-1 >= %.2f%%, mean KL <= %.3g)\n", ok ? "PASS" : "FAIL", 100.0 * o.min_top1, o.max_kl);
    return ok ? 0 : 1;
  }

  if (o.min_mtp_accept >= 0 && run.mtp.empty()) {
    std::fprintf(stderr, "ferry eval-ref: --min-mtp-accept: %s has no MTP block\n", o.model.c_str());
    return 2;
  }
  const bool accept_ok = report_mtp_agreement(o, run, ref);
  if (!ref.has_logits) return accept_ok ? 0 : 1;
  const Diff pre = compare(ref.prefill, run.prefill, ref.vocab);
  const Diff dec = compare(ref.decode, run.decode, ref.vocab);
  std::printf("prefill  max|delta| %.3e  top-1 %zu/%zu\n", pre.max_abs, pre.top1, pre.rows);
  std::printf("decode   max|delta| %.3e  top-1 %zu/%zu\n", dec.max_abs, dec.top1, dec.rows);
  double worst = std::max(pre.max_abs, dec.max_abs);
  if (!ref.mtp.empty()) {
    if (run.mtp.empty()) {
      std::printf("mtp      not compared: the model file has no MTP block\n");
    } else {
      const Diff m = compare(ref.mtp, run.mtp, ref.vocab);
      std::printf("mtp      max|delta| %.3e  top-1 %zu/%zu\n", m.max_abs, m.top1, m.rows);
      worst = std::max(worst, m.max_abs);
    }
  }
  for (const auto& [layer, want] : ref.selections) {
    auto it = run.selections.find(layer);
    size_t same = 0, total = want.size();
    if (it != run.selections.end()) {
      for (size_t pos = 0; pos < want.size() && pos < it->second.size(); ++pos) same += it->second[pos] == want[pos];
    }
    if (layer == "mtp" && run.mtp.empty()) continue;
    std::printf("dsa      layer %s: %zu/%zu queries select the reference's pools\n", layer.c_str(), same, total);
  }
  const bool ok = worst <= o.tolerance;
  std::printf("%s (tolerance %.1e)\n", ok ? "PASS" : "FAIL", o.tolerance);
  return ok && accept_ok ? 0 : 1;
}

}  // namespace

CommandRun add_eval_ref_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "eval-ref", "Compare the forward pass (CPU, or CUDA with --backend cuda) with a transformers reference case");
  sub->add_option("--model", o->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  sub->add_option("--reference", o->reference,
                  "case directory (reference.json, *_logits.f32), or a case JSON file (token ids without logits "
                  "serve --compare-to-f32 and --compare-cpu)")
      ->required()
      ->check(CLI::ExistingPath);
  sub->add_option("--chunk", o->chunk, "prefill chunk size in tokens (0: the whole prompt at once)");
  sub->add_option("--tolerance", o->tolerance, "largest accepted |logit difference| (f32 weights)");
  sub->add_option("--compare-to-f32", o->f32_model, "compare with this f32 conversion instead (quantized models)")
      ->check(CLI::ExistingFile);
  sub->add_option("--min-top1", o->min_top1, "with --compare-to-f32: smallest accepted top-1 agreement (0..1)");
  sub->add_option("--max-kl", o->max_kl, "with --compare-to-f32: largest accepted mean KL divergence");
  sub->add_option("--threads", o->threads, "worker threads (0: every hardware thread)");
  sub->add_option("--backend", o->backend, "cpu (the forward pass with DSA selections and MTP), cuda or auto")
      ->capture_default_str();
  sub->add_option("--kv-type", o->kv_type, "DSA latent rows: f32, f16, int8 or auto (int8 on CUDA, f32 on the CPU)")
      ->capture_default_str();
  sub->add_option("--kv-resident", o->kv_resident,
                  "CUDA: DSA latent rows per layer kept on the device (smaller than the case: the windowed path; "
                  "default: the memory plan's choice)");
  sub->add_option("--kv-index-type", o->kv_index_type, "CPU forward pass: the indexer's cached keys and gates (f32, f16, int8)")
      ->capture_default_str();
  sub->add_option("--min-mtp-accept", o->min_mtp_accept,
                  "CPU forward pass: require this share (0..1) of MTP drafts to equal the trunk's next top-1 on the "
                  "case's text (greedy K=1 acceptance; also takes a case of token ids only)");
  sub->add_flag("--compare-kv-f32", o->compare_kv, "also run with f32 KV on the same backend; require top-1 and KL");
  sub->add_flag("--compare-cpu", o->compare_cpu, "with --backend cuda: also run the CPU backend, require top-1 agreement");
  sub->add_option("--split", o->split,
                  "run through pipeline stages: the first layer of each stage after the first (e.g. 2,4), auto or "
                  "none")
      ->capture_default_str();
  sub->add_option("--devices", o->devices, "CUDA devices of the stages, e.g. 0,0 (default: 0)");
  config::for_each_memory_option(o->memory, [&](const std::string& name, std::string& value, const std::string& help) {
    sub->add_option("--" + name, value, help)->capture_default_str();
  });
  return [o] { return eval_ref(*o); };
}

}  // namespace ferry::cli
