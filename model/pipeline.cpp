#include "model/pipeline.hpp"

#include <algorithm>

namespace ferry::model {

Expected<std::unique_ptr<Pipeline>> Pipeline::make(std::vector<std::shared_ptr<Stage>> stages) {
  if (stages.empty()) return Error(ErrorCode::internal, "a pipeline needs at least one stage");
  const Glm5Hparams& hp = stages.front()->hparams();
  std::vector<LayerRange> ranges;
  for (const auto& s : stages) ranges.push_back(s->layers());
  uint32_t next = 0;
  for (const LayerRange& r : ranges) {
    if (r.first != next || r.end <= r.first) {
      return Error(ErrorCode::internal, "stages do not cover the trunk in order at " + describe_layers(r));
    }
    next = r.end;
  }
  if (next != hp.n_layers) return Error(ErrorCode::internal, "the stages end at layer " + std::to_string(next));
  if (auto e = check_stage_ranges(hp, ranges)) return *e;
  for (size_t i = 0; i + 1 < stages.size(); ++i) {
    if (auto e = stages[i]->connect(*stages[i + 1])) return *e;
  }
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(stages)));
}

Status Pipeline::reset_slot(uint32_t slot) {
  for (const auto& s : stages_) {
    if (auto e = s->reset_slot(slot)) return e;
  }
  return std::nullopt;
}

Expected<std::vector<SlotResult>> Pipeline::run_chunk(const std::vector<SlotRows>& rows) {
  std::shared_ptr<const Handoff> in;
  for (const auto& s : stages_) {
    auto out = s->run(rows, in.get());
    if (!out) return out.error();
    if (s->last()) return std::move(out->results);
    in = std::move(out->handoff);
  }
  return Error(ErrorCode::internal, "the pipeline has no last stage");
}

Expected<std::vector<SlotResult>> Pipeline::step(const std::vector<SlotRows>& rows) {
  const uint32_t cap = std::min_element(stages_.begin(), stages_.end(), [](const auto& a, const auto& b) {
                         return a->max_step_rows() < b->max_step_rows();
                       })->get()->max_step_rows();
  std::vector<SlotResult> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i].slot = rows[i].slot;
  // Pieces: whole slots while they fit, a long slot in consecutive pieces of which only the last
  // samples (the earlier ones return nothing, unless every row's logits are asked).
  std::vector<SlotRows> chunk;
  std::vector<size_t> source;
  std::vector<bool> final_piece;
  uint32_t used = 0;
  auto flush = [&]() -> Status {
    if (chunk.empty()) return std::nullopt;
    auto res = run_chunk(chunk);
    if (!res) return res.error();
    for (size_t i = 0; i < chunk.size(); ++i) {
      SlotResult& dst = out[source[i]];
      const SlotRows& whole = rows[source[i]];
      if (final_piece[i] && whole.sample) {
        dst.sampled = (*res)[i].sampled;
        dst.accepted = (*res)[i].accepted;
        dst.drafts = std::move((*res)[i].drafts);
      }
      if (final_piece[i] || whole.logits_all) {
        dst.logits.insert(dst.logits.end(), (*res)[i].logits.begin(), (*res)[i].logits.end());
      }
    }
    chunk.clear();
    source.clear();
    final_piece.clear();
    used = 0;
    return std::nullopt;
  };
  for (size_t i = 0; i < rows.size(); ++i) {
    const SlotRows& r = rows[i];
    // A verify set goes in one piece: its stages keep the state at its start.
    if (r.verify > 0 && r.tokens.size() > cap - used) {
      if (r.tokens.size() > cap) {
        return Error(ErrorCode::invalid_plan, "slot " + std::to_string(r.slot) + ": a verify set of " +
                                                  std::to_string(r.tokens.size()) + " rows exceeds a step's " +
                                                  std::to_string(cap));
      }
      if (auto e = flush()) return *e;
    }
    size_t done = 0;
    while (done < r.tokens.size()) {
      if (used == cap) {
        if (auto e = flush()) return *e;
      }
      const size_t take = std::min<size_t>(r.tokens.size() - done, cap - used);
      const bool last = done + take == r.tokens.size();
      SlotRows piece;
      piece.slot = r.slot;
      piece.start = r.start + static_cast<uint32_t>(done);
      piece.tokens.assign(r.tokens.begin() + static_cast<ptrdiff_t>(done),
                          r.tokens.begin() + static_cast<ptrdiff_t>(done + take));
      piece.logits_all = r.logits_all;
      // An earlier piece draws nothing: its last row's token is the next piece's first (the MTP block
      // pairs them); without logits_all it returns that row's logits, which are dropped.
      piece.sample = last && r.sample;
      piece.sampling = last ? r.sampling : SamplingParams{};
      piece.verify = last ? r.verify : 0;
      piece.draft = last ? r.draft : 0;
      chunk.push_back(std::move(piece));
      source.push_back(i);
      final_piece.push_back(last);
      used += static_cast<uint32_t>(take);
      done += take;
    }
  }
  if (auto e = flush()) return *e;
  return out;
}

Expected<std::vector<SlotStateImage>> Pipeline::save_slot(uint32_t slot, bool with_rows) {
  std::vector<SlotStateImage> images;
  for (const auto& s : stages_) {
    auto image = s->save_slot(slot, with_rows);
    if (!image) return image.error();
    images.push_back(std::move(image.value()));
  }
  return images;
}

Status Pipeline::restore_slot(uint32_t slot, const std::vector<SlotStateImage>& images) {
  if (images.size() != stages_.size()) {
    return Error(ErrorCode::invalid_input, std::to_string(images.size()) + " state images for " +
                                               std::to_string(stages_.size()) + " stages");
  }
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (auto e = stages_[i]->restore_slot(slot, images[i])) return e;
  }
  return std::nullopt;
}

std::string Pipeline::describe() const {
  std::string s;
  for (size_t i = 0; i < stages_.size(); ++i) s += (i ? "; " : "") + stages_[i]->describe();
  return stages_.size() == 1 ? s : std::to_string(stages_.size()) + " stages: " + s;
}

}  // namespace ferry::model
