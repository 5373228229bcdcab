#pragma once
// Token sampling from one row of logits, as SamplingParams asks; the CUDA backend draws the same tokens
// with the same rule (model/cpu/sampling_rule.hpp, gpu/sampling.cu).
//
// Temperature <= 0 is greedy: the argmax, ties to the lowest id. Otherwise tokens are ordered by logit,
// higher first, ties to the lower id (NaN counts as -inf). The top token weighs 2^63, every other
// floor(2^63 * e^((l - top) / T)), an integer (0 below e^-45), so sums are exact. The first n tokens
// of the order are kept, n = min(K, n_p, n_m), at least 1:
//   K   = top_k (0, or >= the vocabulary: all tokens);
//   n_p = with top_p < 1, the fewest tokens whose weight reaches ceil(floor(top_p * 2^32) * S_K / 2^32)
//         (S_K: the weight of the first K), at least 1;
//   n_m = with min_p > 0, the rank of the first token lighter than ceil(min(min_p, 1) * 2^63).
// Then one draw: b = 53 bits of splitmix64 of (seed, position), and the token is the first of the
// kept ones at which the running weight exceeds floor(b * S / 2^53), S the kept weight. The same
// seed and position give the same token on every run and both backends.
#include <cstdint>
#include <span>

#include "model/step.hpp"

namespace ferry::model {

int32_t argmax_token(std::span<const float> logits);

// `position` is the position the sampled token will have in its sequence.
int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t position);

}  // namespace ferry::model
