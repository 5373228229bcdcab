#include "model/speculative.hpp"

#include <algorithm>

namespace ferry::model {

SpecDecoder::SpecDecoder(uint32_t start, int32_t next, std::vector<int32_t> drafts)
    : start_(start), feed_{next}, drafts_(std::move(drafts)) {}

uint32_t SpecDecoder::confirmed() const { return start_ + static_cast<uint32_t>(feed_.size()); }

SlotRows SpecDecoder::rows(uint32_t slot, const SamplingParams& sampling, uint32_t k) const {
  SlotRows r;
  r.slot = slot;
  r.start = start_;
  r.tokens = feed_;
  r.sampling = sampling;
  r.draft = k;
  // After rejections in a row the feed grows by one each: past k + 1 tokens it goes without drafts,
  // which confirms it whole.
  if (feed_.size() <= size_t{k} + 1) {
    const size_t v = std::min<size_t>(k, drafts_.size());
    r.tokens.insert(r.tokens.end(), drafts_.begin(), drafts_.begin() + static_cast<ptrdiff_t>(v));
    r.verify = static_cast<uint32_t>(v);
  }
  return r;
}

std::vector<int32_t> SpecDecoder::apply(const SlotRows& sent, const SlotResult& result) {
  const uint32_t a = std::min(result.accepted, sent.verify);
  const auto first_draft = sent.tokens.begin() + static_cast<ptrdiff_t>(sent.tokens.size() - sent.verify);
  std::vector<int32_t> out(first_draft, first_draft + a);
  out.push_back(result.sampled);
  ++counts_.steps;
  counts_.drafted += sent.verify;
  counts_.accepted += a;
  counts_.tokens += out.size();
  if (a == sent.verify) {
    start_ = sent.start + static_cast<uint32_t>(sent.tokens.size());
    feed_ = {result.sampled};
  } else {
    // The stages go back to sent.start: the next set feeds again what this one kept.
    feed_.assign(sent.tokens.begin(), first_draft + a);
    feed_.push_back(result.sampled);
  }
  drafts_ = result.drafts;
  return out;
}

}  // namespace ferry::model
