#include "gpu/mtp_block.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "gpu/cuda_check.hpp"
#include "gpu/kernels.hpp"

namespace ferry::gpu {

static_assert(sizeof(SampleRow) == kSampleRowBytes, "gpu/mtp_sizes.hpp counts the greedy rows with kSampleRowBytes");

using T = model::Glm5Tensor;

CudaMtp::CudaMtp(const model::Glm5Hparams& hp, DeviceWeights block, std::optional<DeviceWeights> embed,
                 const DeviceWeights& trunk, Workspace& work, blas::Handle cublas, uint32_t slots, uint32_t context,
                 uint32_t max_rows, config::KvFormats kv, bool graphs, cudaStream_t stream)
    : hp_(hp),
      D_(hp.hidden_size),
      V_(hp.vocab_size),
      weights_(std::move(block)),
      embed_weights_(std::move(embed)),
      state_(hp, {hp.n_layers, hp.n_layers + 1}, slots, context, kv, stream),
      w_(work),
      runner_(hp, weights_, state_, work, nullptr, cublas, stream),
      s_(stream),
      slots_(slots),
      max_rows_(max_rows),
      output_norm_(trunk.output_norm),
      input_(max_rows),
      pending_valid_(slots, false),
      kept_(slots),
      pass_graphs_(graphs),
      draft_graphs_(graphs) {
  const DevLayer& l = weights_.layer(hp.n_layers);
  if (l.kind != model::LayerKind::dsa) throw CudaError("the MTP block is not a DSA layer", ErrorCode::unsupported);
  // The fp16 staging of the prefill GEMMs holds H*D columns: eh_proj reads 2*D.
  if (hp.hc_mult < 2) throw CudaError("the MTP block on the CUDA stage needs hc_mult >= 2", ErrorCode::unsupported);
  if (work.max_rows < max_rows || work.logit_rows == 0) throw CudaError("the MTP block's workspace is too small");
  embed_ = !l.m(T::nextn_embed_tokens).empty() ? &l.m(T::nextn_embed_tokens)
           : embed_weights_                   ? &embed_weights_->token_embd
                                              : &trunk.token_embd;
  head_ = !l.m(T::nextn_shared_head_head).empty() ? &l.m(T::nextn_shared_head_head) : &trunk.output;
  if (embed_->empty() || head_->empty() || output_norm_ == nullptr) {
    throw CudaError("the MTP block has no token embedding or head on this stage", ErrorCode::internal);
  }
  for (uint32_t j = 1; j < kMaxCudaDrafts; ++j) draft_input_.push_back(std::make_unique<StepInput>(slots));
  const size_t M = max_rows, D = D_;
  iota_ = DeviceBuffer(M * sizeof(int32_t));
  hidden_ = DeviceBuffer(M * D * sizeof(float));
  h_ = DeviceBuffer(M * D * sizeof(float));
  cat_ = DeviceBuffer(M * 2 * D * sizeof(float));
  x_ = DeviceBuffer(M * D * sizeof(float));
  out_ = DeviceBuffer(M * D * sizeof(float));
  sel_ = DeviceBuffer(size_t{slots} * D * sizeof(float));
  pending_ = DeviceBuffer(size_t{slots} * D * sizeof(float));
  kept_pending_ = DeviceBuffer(size_t{slots} * D * sizeof(float));
  ids_ = DeviceBuffer(size_t{kMaxCudaDrafts} * slots * sizeof(int32_t));
  ids_host_ = PinnedBuffer(size_t{kMaxCudaDrafts} * slots * sizeof(int32_t));
  std::vector<int32_t> iota(M);
  std::iota(iota.begin(), iota.end(), 0);
  FERRY_CUDA(cudaMemcpyAsync(iota_.get(), iota.data(), M * sizeof(int32_t), cudaMemcpyHostToDevice, s_));
  // Greedy draws (argmax, ties to the lowest id, as the CPU's argmax_token) of logit rows 0, 1, ...
  std::vector<SampleRow> greedy(w_.logit_rows);
  for (uint32_t j = 0; j < w_.logit_rows; ++j) greedy[j].logit_row = static_cast<int32_t>(j);
  greedy_ = DeviceBuffer(greedy.size() * sizeof(SampleRow));
  FERRY_CUDA(cudaMemcpyAsync(greedy_.get(), greedy.data(), greedy.size() * sizeof(SampleRow), cudaMemcpyHostToDevice, s_));
  FERRY_CUDA(cudaStreamSynchronize(s_));  // the host vectors go away
}

uint64_t CudaMtp::bytes() const {
  uint64_t b = weights_.bytes() + state_.bytes() + (embed_weights_ ? embed_weights_->bytes() : 0);
  for (const DeviceBuffer* x : {&iota_, &hidden_, &h_, &cat_, &x_, &out_, &sel_, &pending_, &kept_pending_, &ids_, &greedy_}) {
    b += x->bytes();
  }
  return b;
}

void CudaMtp::reset(uint32_t slot) {
  state_.zero_slot(slot, s_);
  pending_valid_[slot] = false;
  kept_[slot].reset();
}

void CudaMtp::keep(uint32_t slot) {
  kept_[slot] = Kept{state_.tokens[slot], pending_valid_[slot]};
  const size_t bytes = size_t{D_} * sizeof(float);
  FERRY_CUDA(cudaMemcpyAsync(kept_pending_.as<float>() + size_t{slot} * D_, pending_.as<float>() + size_t{slot} * D_,
                             bytes, cudaMemcpyDeviceToDevice, s_));
}

void CudaMtp::restore(uint32_t slot) {
  if (!kept_[slot]) return;
  state_.tokens[slot] = kept_[slot]->entries;
  pending_valid_[slot] = kept_[slot]->pending;
  const size_t bytes = size_t{D_} * sizeof(float);
  FERRY_CUDA(cudaMemcpyAsync(pending_.as<float>() + size_t{slot} * D_, kept_pending_.as<float>() + size_t{slot} * D_,
                             bytes, cudaMemcpyDeviceToDevice, s_));
  kept_[slot].reset();
}

void CudaMtp::restored(uint32_t slot, uint32_t tokens, bool with_rows) {
  kept_[slot].reset();
  pending_valid_[slot] = false;
  uint32_t& entries = state_.tokens[slot];
  entries = with_rows ? 0 : std::min(entries, tokens > 0 ? tokens - 1 : 0);
}

void CudaMtp::block(const StepGeometry& g, const int32_t* tokens, const float* h, uint32_t n) {
  const DevLayer& l = weights_.layer(hp_.n_layers);
  const size_t D = D_;
  embed_rows(*embed_, tokens, n, w_.x, 1, s_);
  rms_norm(w_.x, D, l.v(T::nextn_enorm), n, D_, hp_.rms_eps, cat_.as<float>(), 2 * D, s_);
  rms_norm(h, D, l.v(T::nextn_hnorm), n, D_, hp_.rms_eps, cat_.as<float>() + D, 2 * D, s_);
  runner_.mm(l.m(T::nextn_eh_proj), cat_.as<float>(), 2 * D, n, x_.as<float>(), D);
  runner_.plain_block(g, hp_.n_layers, x_.as<float>());
  rms_norm(x_.as<float>(), D, l.v(T::nextn_shared_head_norm), n, D_, hp_.rms_eps, out_.as<float>(), D, s_);
}

void CudaMtp::argmax(const float* x, uint32_t rows, int32_t* ids) {
  for (uint32_t j0 = 0; j0 < rows; j0 += w_.logit_rows) {
    const uint32_t cnt = std::min(w_.logit_rows, rows - j0);
    runner_.mm(*head_, x + size_t{j0} * D_, D_, cnt, w_.logits, V_);
    sample_rows(w_.logits, V_, greedy_.as<SampleRow>(), cnt, ids + j0, w_.sample_scratch, s_);
  }
}

void CudaMtp::record(uint32_t rows) {
  const size_t V = V_;
  for (uint32_t j0 = 0; j0 < rows; j0 += w_.logit_rows) {
    const uint32_t cnt = std::min(w_.logit_rows, rows - j0);
    runner_.mm(*head_, out_.as<float>() + size_t{j0} * D_, D_, cnt, w_.logits, V_);
    const size_t at = recorded_.size();
    recorded_.resize(at + cnt * V);
    FERRY_CUDA(cudaMemcpyAsync(recorded_.data() + at, w_.logits, cnt * V * sizeof(float), cudaMemcpyDeviceToHost, s_));
    FERRY_CUDA(cudaStreamSynchronize(s_));
  }
}

void CudaMtp::draft(const std::vector<uint32_t>& counts, const std::vector<StepGeometry>& gs) {
  int32_t* ids = ids_.as<int32_t>();
  const auto body = [&] {
    argmax(sel_.as<float>(), counts[0], ids);
    for (size_t j = 1; j < counts.size(); ++j) {
      block(gs[j - 1], ids + (j - 1) * slots_, j == 1 ? sel_.as<float>() : out_.as<float>(), counts[j]);
      argmax(out_.as<float>(), counts[j], ids + j * slots_);
    }
  };
  // The shape: the slots drafting a j-th token, a byte each (they only fall with j); one graph per
  // shape where every pass is of decode rows.
  uint64_t shape = 0;
  bool graphable = counts.size() <= 8;
  for (size_t j = 0; j < counts.size() && graphable; ++j) {
    graphable = counts[j] <= kMaxMatvecTokens;
    shape |= uint64_t{counts[j]} << (8 * j);
  }
  if (graphable) {
    draft_graphs_.run(shape, s_, body);
  } else {
    body();
  }
}

void CudaMtp::extend(const std::vector<model::SlotRows>& rows, std::vector<model::SlotResult>& results) {
  const size_t D = D_;
  const uint32_t total = model::total_rows(rows);
  if (total == 0) return;
  if (total > max_rows_) throw CudaError("the MTP block got more rows than its workspace holds", ErrorCode::internal);
  // The trunk's final hidden state of every row of the step: the head's norm over its streams.
  hc_head(w_.R, iota_.as<int32_t>(), total, hp_.hc_mult, D_, output_norm_, hp_.rms_eps, hidden_.as<float>(), s_);
  const size_t row_bytes = D * sizeof(float);
  auto hidden_row = [&](size_t r) { return hidden_.as<float>() + r * D; };
  auto pending_of = [&](uint32_t slot) { return pending_.as<float>() + size_t{slot} * D; };
  struct Drafting {
    size_t result = 0;
    uint32_t slot = 0, draft = 0, entries = 0, last = 0;  // entries after the step; its last entry's row
  };
  std::vector<model::SlotRows> pass;
  std::vector<Drafting> drafting;
  uint32_t row = 0, entry_rows = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const model::SlotRows& r = rows[i];
    const auto n = static_cast<uint32_t>(r.tokens.size());
    if (n == 0) continue;
    const uint32_t first_row = row;
    row += n;
    const uint32_t kept = r.sample ? n - r.verify + std::min(results[i].accepted, r.verify) : n;
    const int32_t next = r.sample ? results[i].sampled : -1;
    const uint32_t from = state_.tokens[r.slot], start = r.start, end = start + kept;
    // One entry short of the positions held (one waits for its token) or complete; an older gap (a
    // state restored from an image with rows) cannot be filled: the slot drafts nothing.
    if (from + 1 < start || from > end) continue;
    model::SlotRows m;
    m.slot = r.slot;
    m.start = from;
    bool waits = false;
    for (uint32_t p = from; p < end; ++p) {
      const int32_t token = p + 1 < end ? r.tokens[p + 1 - start] : next;
      if (token < 0) {
        waits = true;
        break;
      }
      m.tokens.push_back(token);
    }
    const auto entries = static_cast<uint32_t>(m.tokens.size());
    float* h = h_.as<float>() + size_t{entry_rows} * D;
    uint32_t at = 0;
    if (entries > 0 && from + 1 == start) {
      // The pending state of the position before the rows; lost to a restore, it enters as zeros.
      if (pending_valid_[r.slot]) {
        FERRY_CUDA(cudaMemcpyAsync(h, pending_of(r.slot), row_bytes, cudaMemcpyDeviceToDevice, s_));
      } else {
        FERRY_CUDA(cudaMemsetAsync(h, 0, row_bytes, s_));
      }
      at = 1;
    }
    if (entries > at) {
      const uint32_t p0 = from + at;  // >= start
      FERRY_CUDA(cudaMemcpyAsync(h + size_t{at} * D, hidden_row(first_row + (p0 - start)), (entries - at) * row_bytes,
                                 cudaMemcpyDeviceToDevice, s_));
    }
    if (waits) {
      FERRY_CUDA(cudaMemcpyAsync(pending_of(r.slot), hidden_row(first_row + (end - 1 - start)), row_bytes,
                                 cudaMemcpyDeviceToDevice, s_));
      pending_valid_[r.slot] = true;
    } else {
      pending_valid_[r.slot] = false;
    }
    if (entries == 0) continue;
    state_.tokens[r.slot] = from + entries;
    if (next >= 0 && r.draft > 0) {
      drafting.push_back({i, r.slot, std::min(r.draft, kMaxCudaDrafts), from + entries, entry_rows + entries - 1});
    }
    entry_rows += entries;
    pass.push_back(std::move(m));
  }
  if (pass.empty()) return;
  const StepGeometry g = input_.stage(pass, false, 1, s_);
  // Steps of decode rows replay the pass from a graph (its launches depend on the rows' shape only);
  // a prefill's entries run eagerly, as the trunk's do.
  const auto pass_body = [&] { block(g, input_.tokens(), h_.as<float>(), entry_rows); };
  if (entry_rows <= kMaxMatvecTokens) {
    pass_graphs_.run(DecodeGraphs::shape(g.rows, g.segments, g.max_seg_rows), s_, pass_body);
  } else {
    pass_body();
  }
  if (record_) record(entry_rows);
  if (drafting.empty()) return;

  // Drafts: the slots asking for the most first, so that those asking for a j-th are a prefix.
  std::stable_sort(drafting.begin(), drafting.end(), [](const Drafting& a, const Drafting& b) { return a.draft > b.draft; });
  const auto count = static_cast<uint32_t>(drafting.size());
  for (uint32_t k = 0; k < count; ++k) {
    FERRY_CUDA(cudaMemcpyAsync(sel_.as<float>() + size_t{k} * D, out_.as<float>() + size_t{drafting[k].last} * D,
                               row_bytes, cudaMemcpyDeviceToDevice, s_));
  }
  const uint32_t most = drafting.front().draft;
  // Each further draft's rows staged first (their uploads precede the drafting in stream order).
  std::vector<uint32_t> counts{count};
  std::vector<StepGeometry> gs;
  for (uint32_t j = 1; j < most; ++j) {
    // The block fed its own output and draft: entries past the kept ones, dropped below.
    std::vector<model::SlotRows> more;
    for (const Drafting& d : drafting) {
      if (d.draft <= j) break;
      more.push_back(model::SlotRows{d.slot, d.entries + j - 1, {0}, false, false, {}});
    }
    counts.push_back(static_cast<uint32_t>(more.size()));
    gs.push_back(draft_input_[j - 1]->stage(more, false, 1, s_));
  }
  draft(counts, gs);
  int32_t* ids = ids_.as<int32_t>();
  int32_t* host = ids_host_.as<int32_t>();
  FERRY_CUDA(cudaMemcpyAsync(host, ids, size_t{most} * slots_ * sizeof(int32_t), cudaMemcpyDeviceToHost, s_));
  FERRY_CUDA(cudaStreamSynchronize(s_));
  for (uint32_t k = 0; k < count; ++k) {
    std::vector<int32_t>& out = results[drafting[k].result].drafts;
    for (uint32_t j = 0; j < drafting[k].draft; ++j) out.push_back(host[size_t{j} * slots_ + k]);
  }
}

}  // namespace ferry::gpu
