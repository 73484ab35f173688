// The plan: order is a pure function of (seed, epoch); ranks cover every sample exactly once with
// equal batch counts; positions let a different world size continue the same global order.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "zerowait/loader/sample_plan.hpp"

namespace zerowait {
namespace {

std::shared_ptr<const std::vector<uint64_t>> order_of(const std::vector<uint64_t>& shards,
                                                      ShuffleOptions shuffle, uint64_t epoch) {
  return std::make_shared<const std::vector<uint64_t>>(epoch_order(shards, shuffle, epoch));
}

bool is_permutation_of_all(const std::vector<uint64_t>& order, uint64_t total) {
  std::vector<uint64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint64_t> expected(total);
  std::iota(expected.begin(), expected.end(), 0);
  return sorted == expected;
}

TEST(SamplePlan, EveryModeIsAPermutationAndDeterministic) {
  const std::vector<uint64_t> shards = {1000, 37, 0, 4096, 5000};
  for (ShuffleMode mode : {ShuffleMode::kNone, ShuffleMode::kQuasiRandom, ShuffleMode::kRandom}) {
    ShuffleOptions shuffle{mode, 42, 512, 3};
    const auto a = epoch_order(shards, shuffle, 7);
    EXPECT_TRUE(is_permutation_of_all(a, 10133)) << shuffle_mode_name(mode);
    EXPECT_EQ(a, epoch_order(shards, shuffle, 7)) << shuffle_mode_name(mode);
    if (mode != ShuffleMode::kNone) {
      EXPECT_NE(a, epoch_order(shards, shuffle, 8)) << "epochs must differ";
      shuffle.seed = 43;
      EXPECT_NE(a, epoch_order(shards, shuffle, 7)) << "seeds must differ";
    }
  }
}

TEST(SamplePlan, KnownOrderIsStableAcrossBuilds) {
  // Pins the algorithm: a change here silently changes every user's order and breaks resume of
  // saved states, so it must be deliberate (and the loader state version bumped).
  const std::vector<uint64_t> one_shard = {10};
  EXPECT_EQ(epoch_order(one_shard, {ShuffleMode::kRandom, 1, 4096, 4}, 0),
            (std::vector<uint64_t>{8, 0, 7, 3, 6, 9, 5, 2, 1, 4}));
  EXPECT_EQ(epoch_order(one_shard, {ShuffleMode::kQuasiRandom, 1, 3, 2}, 0),
            (std::vector<uint64_t>{0, 2, 3, 4, 1, 5, 7, 9, 6, 8}));
}

TEST(SamplePlan, QuasiRandomKeepsWindowsTogether) {
  // Blocks of 100 samples, windows of 2 blocks: every run of 200 positions of the order draws
  // from exactly two blocks.
  const std::vector<uint64_t> shards = {1000};
  ShuffleOptions shuffle{ShuffleMode::kQuasiRandom, 5, 100, 2};
  const auto order = epoch_order(shards, shuffle, 0);
  for (size_t w = 0; w < order.size(); w += 200) {
    std::set<uint64_t> blocks;
    for (size_t i = w; i < w + 200; ++i) blocks.insert(order[i] / 100);
    EXPECT_EQ(blocks.size(), 2u) << "window at " << w;
  }
  // ...and samples inside a window are shuffled, not left in file order.
  EXPECT_FALSE(std::is_sorted(order.begin(), order.begin() + 200));
}

struct Coverage {
  std::map<uint64_t, int> seen;
  uint64_t padded = 0;
  std::vector<uint64_t> batch_counts;
};

Coverage cover(std::shared_ptr<const std::vector<uint64_t>> order, uint64_t start,
               uint64_t batch_size, uint32_t world, bool drop_last) {
  Coverage c;
  std::vector<uint64_t> batch;
  for (uint32_t rank = 0; rank < world; ++rank) {
    RankPartition p(order, start, {batch_size, rank, world, drop_last});
    c.batch_counts.push_back(p.batch_count());
    EXPECT_EQ(RankPartition::count_batches(order->size(), start, p.options()), p.batch_count());
    for (uint64_t j = 0; j < p.batch_count(); ++j) {
      const uint64_t padded = p.batch(j, &batch);
      EXPECT_FALSE(batch.empty());
      EXPECT_LE(batch.size(), batch_size);
      c.padded += padded;
      for (size_t i = 0; i + padded < batch.size(); ++i) ++c.seen[batch[i]];
    }
  }
  return c;
}

TEST(SamplePlan, RanksCoverEverySampleExactlyOnceWithEqualBatchCounts) {
  const std::vector<uint64_t> shards = {500, 333, 171};  // 1004 samples
  const auto order = order_of(shards, {ShuffleMode::kQuasiRandom, 3, 128, 2}, 1);
  for (uint32_t world : {1u, 2u, 3u, 8u}) {
    for (uint64_t batch_size : {1u, 7u, 32u, 1004u}) {
      SCOPED_TRACE("world " + std::to_string(world) + " batch " + std::to_string(batch_size));
      const Coverage c = cover(order, 0, batch_size, world, false);
      EXPECT_EQ(c.seen.size(), 1004u);
      for (const auto& [index, times] : c.seen) ASSERT_EQ(times, 1) << "sample " << index;
      EXPECT_EQ(std::set<uint64_t>(c.batch_counts.begin(), c.batch_counts.end()).size(), 1u);

      const Coverage dropped = cover(order, 0, batch_size, world, true);
      const uint64_t step = batch_size * world;
      EXPECT_EQ(dropped.seen.size(), 1004 / step * step);
      EXPECT_EQ(dropped.padded, 0u);
      for (const auto& [index, times] : dropped.seen) ASSERT_EQ(times, 1);
    }
  }
}

TEST(SamplePlan, FewerTailSamplesThanRanksArePadded) {
  const auto order = order_of({10}, {ShuffleMode::kRandom, 0, 4096, 4}, 0);
  // batch 4 x 8 ranks: no full step; 10 samples over 8 ranks: sizes 1 or 2, none padded.
  Coverage c = cover(order, 0, 4, 8, false);
  EXPECT_EQ(c.seen.size(), 10u);
  EXPECT_EQ(c.padded, 0u);
  // 3 samples over 8 ranks: 5 ranks get one padding repeat each.
  const auto small = order_of({3}, {ShuffleMode::kNone, 0, 4096, 4}, 0);
  c = cover(small, 0, 4, 8, false);
  EXPECT_EQ(c.seen.size(), 3u);
  EXPECT_EQ(c.padded, 5u);
  for (uint64_t n : c.batch_counts) EXPECT_EQ(n, 1u);
}

TEST(SamplePlan, ResumeWithAnotherWorldSizeContinuesTheGlobalOrder) {
  const auto order = order_of({777, 555}, {ShuffleMode::kQuasiRandom, 9, 200, 2}, 4);
  // 3 ranks consume 5 batches of 16 each, then 2 ranks (batch 20) take over from that position.
  RankPartition before(order, 0, {16, 0, 3, false});
  const uint64_t position = before.position_after(5);
  EXPECT_EQ(position, 5u * 16 * 3);
  std::map<uint64_t, int> seen;
  std::vector<uint64_t> batch;
  for (uint32_t rank = 0; rank < 3; ++rank) {
    RankPartition p(order, 0, {16, rank, 3, false});
    for (uint64_t j = 0; j < 5; ++j) {
      p.batch(j, &batch);
      for (uint64_t i : batch) ++seen[i];
    }
  }
  const Coverage rest = cover(order, position, 20, 2, false);
  for (const auto& [index, times] : rest.seen) seen[index] += times;
  EXPECT_EQ(seen.size(), 1332u);
  for (const auto& [index, times] : seen) ASSERT_EQ(times, 1) << "sample " << index;
  // The first resumed step is exactly the next 40 positions of the global order.
  RankPartition r0(order, position, {20, 0, 2, false});
  r0.batch(0, &batch);
  EXPECT_EQ(batch, std::vector<uint64_t>(order->begin() + 240, order->begin() + 260));
}

TEST(SamplePlan, InvalidOptionsAreNamed) {
  EXPECT_EQ((PartitionOptions{0, 0, 1, false}).validate().code(), ErrorCode::kInvalidArgument);
  const Status rank = PartitionOptions{1, 2, 2, false}.validate();
  EXPECT_NE(rank.message().find("rank 2"), std::string::npos) << rank.message();
  EXPECT_FALSE(parse_shuffle_mode("sorted").is_ok());
  EXPECT_EQ((ShuffleOptions{ShuffleMode::kQuasiRandom, 0, 0, 1}).validate().code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zerowait
