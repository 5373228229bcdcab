#include "kv/host_kv_tier.hpp"

#include <gtest/gtest.h>

#include <random>
#include <utility>
#include <vector>

#include "kv/clock_policy.hpp"
#include "kv/kv_rows.hpp"

namespace ferry::kv {
namespace {

using config::KvType;

std::vector<float> rows_of(uint32_t n, uint32_t w, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.5f);
  std::vector<float> x(size_t{n} * w);
  for (float& v : x) v = d(rng);
  return x;
}

std::unique_ptr<HostKvTier> tier(KvType t, uint32_t slots = 2, uint32_t layers = 2, uint32_t max_tokens = 64,
                                 uint32_t width = 16) {
  const HostKvShape s{slots, layers, max_tokens, width, t};
  auto made = HostKvTier::create(s, HostKvTier::bytes_for(s));
  EXPECT_TRUE(made) << (made ? "" : made.error().message);
  return made ? std::move(made.value()) : nullptr;
}

// A row reads back as the CPU cache (KvRows) of the same format decodes it: one codec for both.
TEST(HostKvTier, RowsReadBackAsTheCpuCacheDecodesThem) {
  for (KvType t : {KvType::f32, KvType::f16, KvType::int8}) {
    auto h = tier(t);
    ASSERT_TRUE(h);
    const uint32_t w = 16;
    const std::vector<float> x = rows_of(10, w, 5);
    ASSERT_FALSE(h->write(1, 0, 0, x.data(), 10, w));
    KvRows want(t, w);
    want.append(x.data(), 10, w);
    std::vector<float> got(w), scratch(w);
    for (uint32_t r = 0; r < 10; ++r) {
      h->decode(1, 0, r, got.data());
      const float* v = want.row(r, scratch.data());
      for (uint32_t c = 0; c < w; ++c) EXPECT_EQ(got[c], v[c]) << config::kv_type_name(t) << " row " << r;
    }
    EXPECT_EQ(h->tokens(1, 0), 10u);
    EXPECT_EQ(h->slot_bytes(1), 10 * config::kv_row_bytes(t, w));
    EXPECT_EQ(h->slot_bytes(0), 0u);
    EXPECT_EQ(h->row_scale(1, 0, 0) != nullptr, t == KvType::int8);
  }
}

TEST(HostKvTier, SlotsAreIsolated) {
  auto h = tier(KvType::int8);
  const std::vector<float> a = rows_of(8, 16, 1), b = rows_of(8, 16, 2);
  ASSERT_FALSE(h->write(0, 1, 0, a.data(), 8, 16));
  ASSERT_FALSE(h->write(1, 1, 0, b.data(), 8, 16));
  std::vector<float> before(16), after(16);
  h->decode(0, 1, 3, before.data());
  h->reset(1);
  ASSERT_FALSE(h->write(1, 1, 0, a.data(), 8, 16));
  h->truncate(1, 2);
  h->decode(0, 1, 3, after.data());
  EXPECT_EQ(before, after);
  EXPECT_EQ(h->tokens(0, 1), 8u);
  EXPECT_EQ(h->tokens(1, 1), 2u);
}

// Truncate and a rewritten prefix drop exactly the rows from the cut, in every layer, and tell the
// resident window, whose CLOCK then forgets exactly those rows of that slot.
TEST(HostKvTier, TruncateAndRewriteInvalidateExactlyTheRowsAfterTheCutOnBothTiers) {
  auto h = tier(KvType::f16);
  ClockPolicy window(64);
  std::vector<std::pair<uint32_t, uint32_t>> cuts;
  h->on_invalidate([&](uint32_t slot, uint32_t cut) {
    cuts.emplace_back(slot, cut);
    window.invalidate(slot, cut);
  });
  const std::vector<float> x = rows_of(20, 16, 3), y = rows_of(20, 16, 4);
  for (uint32_t s = 0; s < 2; ++s) {
    for (uint32_t l = 0; l < 2; ++l) ASSERT_FALSE(h->write(s, l, 0, x.data(), 20, 16));
    for (uint32_t p = 0; p < 20; ++p) window.place(row_key(s, p));
  }
  window.end_step();
  EXPECT_TRUE(cuts.empty());  // appends invalidate nothing

  h->truncate(0, 12);
  ASSERT_EQ(cuts.size(), 1u);
  EXPECT_EQ(cuts[0], std::make_pair(0u, 12u));
  EXPECT_EQ(h->tokens(0, 0), 12u);
  EXPECT_EQ(h->tokens(0, 1), 12u);
  EXPECT_EQ(h->tokens(1, 0), 20u);
  EXPECT_EQ(window.resident(), 32u);
  EXPECT_NE(window.lookup(row_key(0, 11)), ClockPolicy::kNone);
  EXPECT_EQ(window.lookup(row_key(0, 12)), ClockPolicy::kNone);
  EXPECT_NE(window.lookup(row_key(1, 19)), ClockPolicy::kNone);
  window.end_step();

  // Layer 0 of slot 1 rewritten from position 5: both layers lose rows 5.., then layer 0 gets the new
  // ones; layer 1 follows at 5 (an append).
  ASSERT_FALSE(h->write(1, 0, 5, y.data(), 3, 16));
  ASSERT_EQ(cuts.size(), 2u);
  EXPECT_EQ(cuts[1], std::make_pair(1u, 5u));
  EXPECT_EQ(h->tokens(1, 0), 8u);
  EXPECT_EQ(h->tokens(1, 1), 5u);
  ASSERT_FALSE(h->write(1, 1, 5, y.data(), 3, 16));
  EXPECT_EQ(cuts.size(), 2u);
  std::vector<float> got(16), want(16);
  h->decode(1, 0, 5, got.data());
  KvRows enc(KvType::f16, 16);
  enc.append(y.data(), 1, 16);
  const float* w0 = enc.row(0, want.data());
  for (int c = 0; c < 16; ++c) EXPECT_EQ(got[c], w0[c]);
  EXPECT_EQ(window.lookup(row_key(1, 4)) != ClockPolicy::kNone, true);
  EXPECT_EQ(window.lookup(row_key(1, 5)), ClockPolicy::kNone);
  EXPECT_EQ(window.resident(), 12u + 5u);
}

TEST(HostKvTier, RefusesWritesPastTheEndOrTheContext) {
  auto h = tier(KvType::int8, 1, 1, 8, 16);
  const std::vector<float> x = rows_of(9, 16, 6);
  auto gap = h->write(0, 0, 1, x.data(), 1, 16);
  ASSERT_TRUE(gap);
  EXPECT_NE(gap->message.find("holds 0 of 8"), std::string::npos) << gap->message;
  EXPECT_TRUE(h->write(0, 0, 0, x.data(), 9, 16));
  EXPECT_TRUE(h->write(1, 0, 0, x.data(), 1, 16));
  EXPECT_EQ(h->tokens(0, 0), 0u);
}

TEST(HostKvTier, ABudgetThatCannotHoldTheSlotsIsRefusedNamingIt) {
  const HostKvShape s{3, 11, 524288, 512, KvType::int8};
  EXPECT_EQ(HostKvTier::bytes_for(s), 3ull * 11 * 524288 * 516);
  auto made = HostKvTier::create(s, uint64_t{8} << 30);
  ASSERT_FALSE(made);
  EXPECT_EQ(made.error().code, ErrorCode::out_of_memory);
  const std::string& m = made.error().message;
  EXPECT_NE(m.find("--kv-host-budget"), std::string::npos) << m;
  EXPECT_NE(m.find("8.00 GiB"), std::string::npos) << m;
  EXPECT_NE(m.find("3 slots of 524288 tokens x 11 DSA layers"), std::string::npos) << m;
  EXPECT_NE(m.find("holds 2 slots"), std::string::npos) << m;
}

}  // namespace
}  // namespace ferry::kv
