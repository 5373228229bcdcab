#pragma once
// Token sampling from one row of logits, as SamplingParams asks: temperature 0 is greedy (argmax, ties
// to the lowest id); otherwise top-k, then top-p (smallest prefix of the sorted distribution whose
// mass reaches top_p), then min-p (drop tokens below min_p times the best one's probability), and one
// draw whose uniform number is a hash of (seed, position): the same seed and position give the same
// token on every run and every backend that uses this function.
#include <cstdint>
#include <span>

#include "model/backend.hpp"

namespace ferry::model {

// Uniform in [0, 1) from (seed, position): splitmix64 of both, the top 53 bits.
double sampling_uniform(uint64_t seed, uint64_t position);

int32_t argmax_token(std::span<const float> logits);

// `position` is the position the sampled token will have in its sequence.
int32_t sample_token(std::span<const float> logits, const SamplingParams& p, uint64_t position);

}  // namespace ferry::model
