#include "model/cpu/cpu_stage.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "model/cpu/sampler.hpp"

namespace ferry::model {
namespace {

// The streams of a step's rows, in host memory.
class CpuHandoff final : public Handoff {
 public:
  CpuHandoff(std::vector<float> streams, uint32_t rows) : streams(std::move(streams)), rows_(rows) {}
  uint32_t rows() const override { return rows_; }
  uint64_t bytes() const override { return streams.size() * sizeof(float); }
  std::vector<float> streams;

 private:
  uint32_t rows_;
};

}  // namespace

CpuStage::CpuStage(std::shared_ptr<const Glm5Weights> weights, std::shared_ptr<ThreadPool> pool, LayerRange layers,
                   const CpuStageOptions& options)
    : weights_(std::move(weights)),
      pool_(std::move(pool)),
      layers_(layers),
      forward_(*weights_, *pool_),
      layout_(weights_->hparams(), layers, layers.end == weights_->hparams().n_layers, options.kv),
      max_context_(options.max_context != 0 ? options.max_context : weights_->hparams().context_length),
      max_step_rows_(options.max_step_rows) {
  for (uint32_t i = 0; i < options.max_slots; ++i) {
    slots_.push_back(std::make_unique<SequenceState>(hparams(), layers, last(), options.kv));
  }
  kept_.resize(options.max_slots);
  if (options.mtp && last() && forward_.has_mtp()) mtp_.emplace(forward_, options.max_slots);
}

Status CpuStage::reset_slot(uint32_t slot) {
  if (slot >= slots_.size()) return Error(ErrorCode::invalid_plan, "slot " + std::to_string(slot) + " does not exist");
  slots_[slot]->reset();
  kept_[slot].reset();
  if (mtp_) mtp_->reset(slot);
  return std::nullopt;
}

Status CpuStage::prepare_rollback(const SlotRows& r) {
  std::optional<Kept>& kept = kept_[r.slot];
  if (r.start != 0 && r.start != slots_[r.slot]->tokens()) {
    // validate_rows let it through: the rows start at the kept verify start.
    SlotStateImage image = std::move(kept->image);
    std::vector<float> pending = std::move(kept->mtp_pending);
    if (auto e = restore_slot(r.slot, image)) return e;  // forgets the kept state
    if (mtp_) mtp_->set_pending(r.slot, std::move(pending));
  }
  kept.reset();
  if (r.verify == 0) return std::nullopt;
  auto image = save_slot(r.slot, false);
  if (!image) return image.error();
  kept_[r.slot] = Kept{std::move(*image), mtp_ ? mtp_->pending(r.slot) : std::vector<float>{}};
  return std::nullopt;
}

Expected<StageOutput> CpuStage::run(const std::vector<SlotRows>& rows, const Handoff* in) {
  const auto begin = std::chrono::steady_clock::now();
  std::vector<uint32_t> held(slots_.size()), restart(slots_.size(), kNoRestart);
  for (size_t i = 0; i < slots_.size(); ++i) {
    held[i] = slots_[i]->tokens();
    if (kept_[i]) restart[i] = kept_[i]->image.tokens;
  }
  const RowLimits limits{max_slots(), max_context_, max_step_rows_, first() ? hparams().vocab_size : 0};
  if (auto e = validate_rows(rows, held, limits, restart)) return *e;
  for (const SlotRows& r : rows) {
    if (r.draft > 0 && last() && !mtp_) {
      return Error(ErrorCode::invalid_plan, "slot " + std::to_string(r.slot) + " asks for drafts, but " +
                                                (forward_.has_mtp() ? "this stage does not run the MTP block"
                                                                    : "the model has no MTP block"));
    }
  }
  const uint32_t n = total_rows(rows);
  const size_t width = size_t{hparams().hc_mult} * hparams().hidden_size;
  std::vector<float> streams;
  if (!first()) {
    const auto* h = dynamic_cast<const CpuHandoff*>(in);
    if (h == nullptr || h->rows() != n) {
      return Error(ErrorCode::internal, describe_layers(layers_) + ": no handoff of " + std::to_string(n) + " rows");
    }
    streams = h->streams;
  }
  std::vector<ForwardRows> batch;
  for (const SlotRows& r : rows) {
    if (r.start == 0) {
      slots_[r.slot]->reset();
      if (mtp_) mtp_->reset(r.slot);
    }
    if (auto e = prepare_rollback(r)) return *e;
    if (!r.tokens.empty()) batch.push_back({slots_[r.slot].get(), r.tokens});
  }
  if (first()) forward_.embed_streams(batch, streams);
  if (streams.size() != n * width) return Error(ErrorCode::internal, "the handoff has the wrong size");
  forward_.run_layers(layers_, batch, streams.data());

  StageOutput out;
  if (last()) {
    out.results = head(rows, streams.data());
  } else {
    out.handoff = std::make_shared<CpuHandoff>(std::move(streams), n);
    counters_.handoff_bytes += out.handoff->bytes();
  }
  ++counters_.steps;
  counters_.rows += n;
  counters_.compute_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count();
  return out;
}

// The final norm over the rows whose logits are needed (every row when the MTP block runs: it reads
// them all), the output head over the former (read once per step for every slot: it is the largest
// matrix), then each slot's draws, the verdict on its drafts and the MTP block's entries and drafts.
std::vector<SlotResult> CpuStage::head(const std::vector<SlotRows>& rows, const float* streams) {
  const size_t D = hparams().hidden_size, V = hparams().vocab_size, width = size_t{hparams().hc_mult} * D;
  std::vector<float> hidden, selected;  // hidden: every row's, with the MTP block
  if (mtp_) forward_.final_hidden(streams, total_rows(rows), hidden);
  std::vector<float> logit_streams;
  std::vector<size_t> first_logit(rows.size(), 0), first_row(rows.size(), 0);
  size_t row = 0, logit_rows = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const size_t n = rows[i].tokens.size();
    const size_t from = n == 0 ? 0 : rows[i].logits_all ? 0 : n - 1 - rows[i].verify;
    first_logit[i] = logit_rows;
    first_row[i] = row;
    if (n > 0 && mtp_) {
      selected.insert(selected.end(), hidden.begin() + static_cast<ptrdiff_t>((row + from) * D),
                      hidden.begin() + static_cast<ptrdiff_t>((row + n) * D));
    } else if (n > 0) {
      logit_streams.insert(logit_streams.end(), streams + (row + from) * width, streams + (row + n) * width);
    }
    logit_rows += n - from;
    row += n;
  }
  if (!mtp_) forward_.final_hidden(logit_streams.data(), logit_rows, selected);
  std::vector<float> logits(logit_rows * V);
  forward_.logits(selected.data(), logit_rows, logits.data());

  std::vector<SlotResult> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const SlotRows& r = rows[i];
    out[i].slot = r.slot;
    const size_t n = r.tokens.size();
    if (n == 0) continue;
    const size_t count = r.logits_all ? n : 1 + r.verify;
    const float* mine = logits.data() + first_logit[i] * V;
    size_t kept = n;
    if (r.sample) {
      // Row n - 1 - verify + j draws the token after it; draft j stands where draw j goes.
      const float* draws = mine + (count - 1 - r.verify) * V;
      uint32_t a = 0;
      int32_t y = -1;
      for (;; ++a) {
        const std::span<const float> lr(draws + size_t{a} * V, V);
        y = sample_token(lr, r.sampling, uint64_t{r.start} + n - r.verify + a);
        if (a == r.verify || r.tokens[n - r.verify + a] != y) break;
      }
      out[i].sampled = y;
      out[i].accepted = a;
      kept = n - r.verify + a;
    }
    if (mtp_) {
      out[i].drafts = mtp_->extend(*slots_[r.slot], r.slot, r.start, r.tokens, hidden.data() + first_row[i] * D,
                                   static_cast<uint32_t>(kept), r.sample ? out[i].sampled : -1, r.draft);
    }
    if (returns_logits(r)) out[i].logits.assign(mine, mine + count * V);
  }
  return out;
}

DsaCache& CpuStage::cache_of(SequenceState& state, const StatePartSpec& part) {
  return part.mtp ? state.mtp(part.layer - hparams().n_layers) : state.dsa(part.layer);
}

Expected<SlotStateImage> CpuStage::save_slot(uint32_t slot, bool with_rows) {
  if (slot >= slots_.size()) return Error(ErrorCode::invalid_plan, "slot " + std::to_string(slot) + " does not exist");
  SequenceState& state = *slots_[slot];
  SlotStateImage image;
  image.tokens = state.tokens();
  image.mtp_tokens = state.mtp_tokens();
  image.with_rows = with_rows;
  image.data.resize(layout_.image_floats(image.tokens, image.mtp_tokens, with_rows));
  layout_.for_each(image, [&](const StatePartSpec& p, uint64_t at, uint64_t n) {
    float* out = image.data.data() + at;
    switch (p.part) {
      case StatePart::kda_conv: std::copy_n(state.kda(p.layer).conv.data(), n, out); break;
      case StatePart::kda_recurrent: std::copy_n(state.kda(p.layer).s.data(), n, out); break;
      case StatePart::latent: cache_of(state, p).latent.to_image(0, n / p.width, out); break;
      case StatePart::index_key:
      case StatePart::index_gate: {  // the incomplete pool's rows: the image's last n / width positions
        const DsaCache& cache = cache_of(state, p);
        const size_t tail = n / p.width, from = (p.mtp ? image.mtp_tokens : image.tokens) - tail - cache.keys_from;
        (p.part == StatePart::index_key ? cache.index_k : cache.index_gate).to_image(from, tail, out);
        break;
      }
      case StatePart::pool_key: std::copy_n(cache_of(state, p).pool_keys.data(), n, out); break;
    }
  });
  return image;
}

Status CpuStage::restore_slot(uint32_t slot, const SlotStateImage& image) {
  if (slot >= slots_.size()) return Error(ErrorCode::invalid_plan, "slot " + std::to_string(slot) + " does not exist");
  if (auto e = layout_.check(image)) return e;
  SequenceState& state = *slots_[slot];
  kept_[slot].reset();
  if (mtp_) mtp_->reset(slot);
  if (image.with_rows) {
    state.reset();
  } else if (state.tokens() < image.tokens || state.mtp_tokens() < image.mtp_tokens) {
    return Error(ErrorCode::invalid_plan, "slot " + std::to_string(slot) + " holds " + std::to_string(state.tokens()) +
                                             " tokens, fewer than the " + std::to_string(image.tokens) +
                                             " of a state image without rows");
  }
  Status bad;
  layout_.for_each(image, [&](const StatePartSpec& p, uint64_t at, uint64_t n) {
    const float* in = image.data.data() + at;
    auto assign = [&](std::vector<float>& dst) { dst.assign(in, in + n); };
    auto rows = [&](kv::KvRows& dst) {
      if (bad) return;
      if (auto e = dst.from_image(in, n / p.width)) bad = e->prefixed("layer " + std::to_string(p.layer) + ": ");
    };
    switch (p.part) {
      case StatePart::kda_conv: assign(state.kda(p.layer).conv); break;
      case StatePart::kda_recurrent: assign(state.kda(p.layer).s); break;
      case StatePart::latent: rows(cache_of(state, p).latent); break;
      case StatePart::index_key:
      case StatePart::index_gate: {
        DsaCache& cache = cache_of(state, p);
        rows(p.part == StatePart::index_key ? cache.index_k : cache.index_gate);
        cache.keys_from = (p.mtp ? image.mtp_tokens : image.tokens) - n / p.width;  // the incomplete pool's start
        break;
      }
      case StatePart::pool_key: assign(cache_of(state, p).pool_keys); break;
    }
  });
  if (bad) {
    state.reset();  // parts of the image went in: the slot starts over rather than hold a mixture
    return bad;
  }
  state.set_tokens(image.tokens, image.mtp_tokens);
  return std::nullopt;
}

std::string CpuStage::describe() const {
  return "cpu, " + std::to_string(pool_->size()) + " threads, " + describe_layers(layers_);
}

std::vector<std::shared_ptr<Stage>> make_cpu_stages(std::shared_ptr<const Glm5Weights> weights,
                                                    const std::vector<LayerRange>& ranges, unsigned threads,
                                                    const CpuStageOptions& options) {
  auto pool = std::make_shared<ThreadPool>(threads);
  std::vector<std::shared_ptr<Stage>> stages;
  for (const LayerRange& r : ranges) stages.push_back(std::make_shared<CpuStage>(weights, pool, r, options));
  return stages;
}

}  // namespace ferry::model
