// The plan: order is a pure function of (seed, epoch); ranks cover every sample exactly once with
// equal batch counts; positions let a different world size continue the same global order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "zerowait/loader/sample_plan.hpp"

namespace zerowait {
namespace {

std::shared_ptr<const EpochOrder> order_of(const std::vector<uint64_t>& shards,
                                           ShuffleOptions shuffle, uint64_t epoch) {
  return std::make_shared<const EpochOrder>(shards, shuffle, epoch);
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
  for (ShuffleMode mode : {ShuffleMode::kNone, ShuffleMode::kQuasiRandom, ShuffleMode::kRandom,
                           ShuffleMode::kBlock}) {
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
            (std::vector<uint64_t>{8, 9, 6, 4, 3, 0, 5, 1, 7, 2}));
  EXPECT_EQ(epoch_order(one_shard, {ShuffleMode::kQuasiRandom, 1, 3, 2}, 0),
            (std::vector<uint64_t>{0, 2, 3, 4, 1, 5, 7, 9, 6, 8}));
}

// The random order is a keyed Feistel permutation, not a drawn array: check that it shuffles
// as a shuffle should. Over 100,000 samples, a sample's new position must not follow its old one
// (rank correlation near 0), each tenth of the order must draw from every tenth of the data set
// about equally, and samples that keep their place must be as rare as in a uniform permutation
// (one expected).
TEST(SamplePlan, RandomOrderShowsNoPattern) {
  const uint64_t n = 100000;
  const std::vector<uint64_t> shards = {n};
  const auto order = epoch_order(shards, {ShuffleMode::kRandom, 11, 64, 256}, 3);
  double sum_d2 = 0;
  uint64_t fixed = 0;
  std::vector<std::vector<uint64_t>> tenths(10, std::vector<uint64_t>(10, 0));
  for (uint64_t p = 0; p < n; ++p) {
    const double d = static_cast<double>(p) - static_cast<double>(order[p]);
    sum_d2 += d * d;
    fixed += order[p] == p;
    ++tenths[p * 10 / n][order[p] * 10 / n];
  }
  const double nd = static_cast<double>(n);
  const double spearman = 1 - 6 * sum_d2 / (nd * (nd * nd - 1));
  EXPECT_LT(std::abs(spearman), 0.01) << spearman;
  EXPECT_LT(fixed, 10u) << "expected about 1 fixed point, as a uniform permutation has";
  for (size_t a = 0; a < 10; ++a) {
    for (size_t b = 0; b < 10; ++b) {
      // 1,000 expected; a binomial's standard deviation here is about 30.
      EXPECT_NEAR(static_cast<double>(tenths[a][b]), 1000.0, 150.0) << a << ", " << b;
    }
  }
}

// Planning over a billion samples holds nothing per sample: the order is looked up, and a
// partition's batches come from positions alone, so resuming anywhere is exact and immediate.
TEST(SamplePlan, ABillionSamplesArePlannedWithoutAnArray) {
  const std::vector<uint64_t> shards(1000, 1000000);  // 10^9 samples
  const auto order = order_of(shards, {ShuffleMode::kRandom, 5, 64, 256}, 2);
  ASSERT_EQ(order->size(), 1000000000u);
  EXPECT_EQ(order->table_bytes(), 0u);
  const PartitionOptions options{256, 3, 8, false};
  RankPartition partition(order, 0, options);
  EXPECT_EQ(partition.batch_count(), (1000000000u + 2047) / 2048);
  std::vector<uint64_t> first, later, resumed;
  partition.batch(0, &first);
  std::set<uint64_t> distinct(first.begin(), first.end());
  EXPECT_EQ(distinct.size(), 256u);
  EXPECT_LT(*distinct.rbegin(), 1000000000u);
  // Resume at batch 123,456 with another world size: the same global positions follow.
  partition.batch(123456, &later);
  const uint64_t position = partition.position_after(123456);
  RankPartition again(order, position, {256 * 2, 1, 4, false});
  again.batch(0, &resumed);
  ASSERT_EQ(resumed.size(), 512u);
  // Rank 3 of 8 took the 4th run of 256 in each step of 2048; rank 1 of 4 takes runs 3 and 4.
  EXPECT_EQ(std::vector<uint64_t>(resumed.begin() + 256, resumed.end()),
            std::vector<uint64_t>(later.begin(), later.end()))
      << "rank 1 of 4 in batches of 512 covers ranks 2-3 of 8 in batches of 256";
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

Coverage cover(std::shared_ptr<const EpochOrder> order, uint64_t start, uint64_t batch_size,
               uint32_t world, bool drop_last) {
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
  std::vector<uint64_t> next_positions;
  for (uint64_t p = 240; p < 260; ++p) next_positions.push_back((*order)[p]);
  EXPECT_EQ(batch, next_positions);
}

TEST(SamplePlan, BlocksFollowTheShardsMeanSampleSize) {
  ShuffleOptions shuffle;
  shuffle.block_bytes = 1 << 20;
  EXPECT_EQ(samples_per_block(5000, 5000 * 100'000, shuffle), 10u);  // 1 MiB of 100 KB samples
  EXPECT_EQ(samples_per_block(3, 3 * 100'000, shuffle), 3u);         // a small shard: one block
  EXPECT_EQ(samples_per_block(10, 10ull * 200'000'000, shuffle), 1u);  // a sample over a block
  EXPECT_EQ(samples_per_block(70, 0, shuffle), 64u);  // size unknown: block_samples
}

// The block tests' data set: three shards of 100 KB samples, 9,234 in all; blocks of 1 MiB (10
// samples), windows of 8 blocks.
const std::vector<uint64_t> kBlockShards = {5000, 3000, 1234};
const std::vector<uint64_t> kBlockShardBytes = {5000 * 100'000, 3000 * 100'000, 1234 * 100'000};
ShuffleOptions block_shuffle(uint64_t seed) {
  ShuffleOptions shuffle;
  shuffle.mode = ShuffleMode::kBlock;
  shuffle.seed = seed;
  shuffle.block_bytes = 1 << 20;
  shuffle.window_bytes = 8 << 20;
  return shuffle;
}

// The block order reads a window's samples from its blocks only: each block's samples lie in
// one window, a window is blocks_per_window whole blocks, and inside it the samples are mixed.
TEST(SamplePlan, BlockOrderDrawsEachWindowFromItsBlocksOnly) {
  const std::vector<uint64_t>& shards = kBlockShards;
  const std::vector<uint64_t>& bytes = kBlockShardBytes;
  const ShuffleOptions shuffle = block_shuffle(5);
  const EpochOrder order(shards, shuffle, 3, bytes);
  ASSERT_EQ(order.size(), 9234u);
  std::vector<uint64_t> all(order.size());
  for (uint64_t p = 0; p < order.size(); ++p) all[p] = order[p];
  EXPECT_TRUE(is_permutation_of_all(all, 9234));
  EXPECT_LT(order.table_bytes(), 1000u * 16 + 64) << "no per-sample memory";

  // Block of a global index: (first index of its shard, local / 10).
  auto block_of = [](uint64_t global) {
    const uint64_t shard_first = global < 5000 ? 0 : global < 8000 ? 5000 : 8000;
    return std::pair(shard_first, (global - shard_first) / 10);
  };
  std::map<std::pair<uint64_t, uint64_t>, std::pair<uint64_t, uint64_t>> span;  // block: min, max
  for (uint64_t p = 0; p < all.size(); ++p) {
    auto [it, fresh] = span.try_emplace(block_of(all[p]), p, p);
    it->second.second = p;
  }
  std::vector<std::pair<uint64_t, uint64_t>> by_first;
  for (const auto& [block, range] : span) by_first.push_back(range);
  std::sort(by_first.begin(), by_first.end());
  uint64_t sorted_windows = 0;
  for (size_t w = 0; w < by_first.size(); w += 8) {
    const size_t end = std::min(by_first.size(), w + 8);
    const uint64_t window_first = by_first[w].first;
    const uint64_t window_end = end < by_first.size() ? by_first[end].first : all.size();
    for (size_t b = w; b < end; ++b) {
      ASSERT_LT(by_first[b].second, window_end) << "a block's samples leave its window";
    }
    sorted_windows += std::is_sorted(all.begin() + static_cast<ptrdiff_t>(window_first),
                                     all.begin() + static_cast<ptrdiff_t>(window_end));
  }
  EXPECT_EQ(sorted_windows, 0u);
  EXPECT_GT(span.size(), 900u);  // 500 + 300 + 124 blocks
}

// Node-stable: the blocks are dealt to 4 nodes; a node's share stays the same set of samples
// until the deal changes (every 3 epochs), shares are disjoint and cut to one size, and the
// share is shuffled anew each epoch.
TEST(SamplePlan, BlocksDealtToNodesStayWithTheirNodeUntilTheRedeal) {
  const std::vector<uint64_t>& shards = kBlockShards;
  const std::vector<uint64_t>& bytes = kBlockShardBytes;
  ShuffleOptions shuffle = block_shuffle(11);
  shuffle.nodes = 4;
  shuffle.redeal_every = 3;
  auto share = [&](uint32_t node, uint64_t epoch) {
    ShuffleOptions s = shuffle;
    s.node = node;
    const EpochOrder order(shards, s, epoch, bytes);
    EXPECT_EQ(order.size(), EpochOrder::size_of(shards, s, epoch, bytes));
    std::vector<uint64_t> samples(order.size());
    for (uint64_t p = 0; p < order.size(); ++p) samples[p] = order[p];
    return samples;
  };
  auto as_set = [](const std::vector<uint64_t>& v) { return std::set<uint64_t>(v.begin(), v.end()); };
  std::set<uint64_t> everyone;
  uint64_t size = 0;
  for (uint32_t node = 0; node < 4; ++node) {
    const auto e0 = share(node, 0), e1 = share(node, 1), e2 = share(node, 2), e3 = share(node, 3);
    if (node == 0) size = e0.size();
    EXPECT_EQ(e0.size(), size) << "every share is cut to the same size";
    EXPECT_EQ(as_set(e0).size(), e0.size()) << "no sample twice";
    // The 924 blocks give shares of 231 blocks; the cut drops at most a block's 10 samples a
    // share beyond what the short shard tails cost.
    EXPECT_GE(e0.size(), 9234u / 4 - 20);
    EXPECT_NE(e0, e1) << "shuffled anew each epoch";
    // Kept within a deal: a share cut short leaves out different samples each epoch, so the
    // shares agree up to the cut.
    std::vector<uint64_t> kept;
    const auto s0 = as_set(e0), s2 = as_set(e2), s3 = as_set(e3);
    std::set_intersection(s0.begin(), s0.end(), s2.begin(), s2.end(), std::back_inserter(kept));
    EXPECT_GE(kept.size(), e0.size() - 20) << "node " << node;
    kept.clear();
    std::set_intersection(s2.begin(), s2.end(), s3.begin(), s3.end(), std::back_inserter(kept));
    EXPECT_LT(kept.size(), e0.size() / 2) << "redealt at epoch 3";
    for (uint64_t i : e0) EXPECT_TRUE(everyone.insert(i).second) << "sample " << i << " twice";
  }
  EXPECT_GE(everyone.size(), 9234u - 4 * 20);

  ShuffleOptions random = shuffle;
  random.mode = ShuffleMode::kRandom;
  EXPECT_NE(random.validate().message().find("needs shuffle \"block\""), std::string::npos);
  ShuffleOptions past = shuffle;
  past.node = 4;
  EXPECT_NE(past.validate().message().find("node 4 is not below nodes 4"), std::string::npos);
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
