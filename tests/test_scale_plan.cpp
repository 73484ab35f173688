// The scale plan (src/loader/scale_plan.cpp) against counts made here straight from EpochOrder,
// and `zerowait plan --json`.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "testing/testing.hpp"
#include "zerowait/loader/sample_plan.hpp"
#include "zerowait/loader/scale_plan.hpp"
#include "zerowait/shard/format.hpp"

namespace zerowait {
namespace {

// A small job: 3 nodes, 12,000 samples of 10,000 bytes in 6 shards, loader blocks of 64 KiB
// (6 samples), cache blocks of 256 KiB, a cache that holds every node's share.
ScalePlanOptions small_job() {
  ScalePlanOptions o;
  o.nodes = 3;
  o.gpus_per_node = 2;
  o.samples = 12000;
  o.sample_bytes = 10000;
  o.shards = 6;
  o.shuffle.mode = ShuffleMode::kBlock;
  o.shuffle.seed = 7;
  o.shuffle.block_bytes = 64 << 10;
  o.shuffle.window_bytes = 1 << 20;
  o.cache_block_bytes = 256 << 10;
  o.cache_bytes_per_node = 1ull << 30;
  o.epochs = 3;
  o.epoch_seconds = 100;
  return o;
}

// The (shard, cache block) pairs node `node`'s epoch touches, counted from EpochOrder directly.
std::set<std::pair<uint64_t, uint64_t>> blocks_touched(const ScalePlanOptions& o, uint32_t node,
                                                       uint64_t epoch) {
  const uint64_t per_shard = (o.samples + o.shards - 1) / o.shards;
  std::vector<uint64_t> shard_samples, shard_bytes;
  for (uint64_t first = 0; first < o.samples; first += per_shard) {
    shard_samples.push_back(std::min(per_shard, o.samples - first));
    shard_bytes.push_back(shard_samples.back() * o.sample_bytes);
  }
  ShuffleOptions shuffle = o.shuffle;
  shuffle.nodes = o.nodes;
  shuffle.node = node;
  const EpochOrder order(shard_samples, shuffle, epoch, shard_bytes);
  std::set<std::pair<uint64_t, uint64_t>> blocks;
  for (uint64_t p = 0; p < order.size(); ++p) {
    const uint64_t begin = format::kHeaderSize + order[p] % per_shard * o.sample_bytes;
    const uint64_t end = begin + o.sample_bytes;
    for (uint64_t b = begin / o.cache_block_bytes; b <= (end - 1) / o.cache_block_bytes; ++b) {
      blocks.insert({order[p] / per_shard, b});
    }
  }
  return blocks;
}

TEST(ScalePlan, ColdGetsPerNodeAreTheBlocksItsEpochOrderTouches) {
  const ScalePlanOptions o = small_job();
  const ScalePlan plan = plan_scale(o).value();
  ASSERT_EQ(plan.simulated_nodes, 3u);
  double sum = 0, max = 0;
  for (uint32_t node = 0; node < o.nodes; ++node) {
    const double gets = static_cast<double>(blocks_touched(o, node, 0).size());
    sum += gets;
    max = std::max(max, gets);
  }
  EXPECT_GT(sum, 0);
  EXPECT_DOUBLE_EQ(plan.mean.cold_gets, sum / 3);
  EXPECT_DOUBLE_EQ(plan.max.cold_gets, max);
  EXPECT_DOUBLE_EQ(plan.fetches_all_nodes, sum);
  EXPECT_DOUBLE_EQ(plan.cold_gets_per_second, sum / o.epoch_seconds);
}

TEST(ScalePlan, FetchesAcrossNodesAreTheDistinctBlocksPlusTheOverlap) {
  const ScalePlanOptions o = small_job();
  const ScalePlan plan = plan_scale(o).value();
  std::map<std::pair<uint64_t, uint64_t>, int> nodes_by_block;
  for (uint32_t node = 0; node < o.nodes; ++node) {
    for (const auto& block : blocks_touched(o, node, 0)) ++nodes_by_block[block];
  }
  double beyond_one = 0;
  for (const auto& [block, nodes] : nodes_by_block) beyond_one += nodes - 1;
  // 256 KiB cache blocks hold parts of several 64 KiB loader blocks, dealt to different nodes.
  EXPECT_GT(beyond_one, 0);
  EXPECT_DOUBLE_EQ(plan.fetches_beyond_one, beyond_one);
  EXPECT_DOUBLE_EQ(plan.fetches_all_nodes,
                   static_cast<double>(nodes_by_block.size()) + plan.fetches_beyond_one);
}

TEST(ScalePlan, SharesThatDoNotShareBlocksAreFetchedOnce) {
  // One sample per cache block, and the 4 KiB header one block of its own: a cache block never
  // holds two nodes' samples, so every block is fetched by exactly one node.
  ScalePlanOptions o = small_job();
  o.sample_bytes = 4096;
  o.cache_block_bytes = 4096;
  o.shuffle.block_bytes = 16 * 4096;
  const ScalePlan plan = plan_scale(o).value();
  EXPECT_DOUBLE_EQ(plan.fetches_beyond_one, 0);
  std::set<std::pair<uint64_t, uint64_t>> all;
  for (uint32_t node = 0; node < o.nodes; ++node) {
    for (const auto& block : blocks_touched(o, node, 0)) EXPECT_TRUE(all.insert(block).second);
  }
  EXPECT_DOUBLE_EQ(plan.fetches_all_nodes, static_cast<double>(all.size()));
  // Every sample a node is given is one block; shares are cut to the smallest, so a few
  // samples (at most a loader block per node) sit out.
  EXPECT_DOUBLE_EQ(plan.fetches_all_nodes, plan.mean.samples * 3);
  EXPECT_LE(o.samples - plan.fetches_all_nodes, 3.0 * 16);
}

TEST(ScalePlan, WarmEpochsFetchNothingWhenTheCacheHoldsTheShare) {
  const ScalePlan plan = plan_scale(small_job()).value();
  EXPECT_EQ(plan.max.warm_gets, 0);
  EXPECT_EQ(plan.warm_gets_per_second, 0);
  EXPECT_LE(plan.max.cache_bytes_needed, 1ull << 30);
  EXPECT_EQ(plan.first_limit.rfind("nothing reaches its limit", 0), 0u) << plan.first_limit;
}

TEST(ScalePlan, WarmEpochsRefetchWhenTheCacheIsTooSmallOrSharesAreRedealt) {
  ScalePlanOptions small_cache = small_job();
  small_cache.cache_bytes_per_node = 4 * small_cache.cache_block_bytes;
  const ScalePlan tight = plan_scale(small_cache).value();
  EXPECT_GT(tight.mean.warm_gets, 0);
  EXPECT_EQ(tight.first_limit.rfind("breaks first: cache per node", 0), 0u) << tight.first_limit;

  ScalePlanOptions redeal = small_job();
  redeal.shuffle.redeal_every = 1;
  const ScalePlan redealt = plan_scale(redeal).value();
  EXPECT_GT(redealt.mean.warm_gets, 0);
  const ScalePlan kept = plan_scale(small_job()).value();
  EXPECT_GT(redealt.mean.cache_bytes_needed, kept.mean.cache_bytes_needed);
}

TEST(ScalePlan, ManyNodesAreSampledAndScaled) {
  ScalePlanOptions o = small_job();
  o.nodes = 40;
  o.max_simulated_nodes = 5;
  o.epochs = 1;
  const ScalePlan plan = plan_scale(o).value();
  EXPECT_EQ(plan.simulated_nodes, 5u);
  ASSERT_EQ(plan.simulated.size(), 5u);
  EXPECT_TRUE(std::is_sorted(plan.simulated.begin(), plan.simulated.end()));
  double sum = 0;
  for (uint32_t node : plan.simulated) sum += blocks_touched(o, node, 0).size();
  EXPECT_DOUBLE_EQ(plan.mean.cold_gets, sum / 5);
  EXPECT_DOUBLE_EQ(plan.fetches_all_nodes, sum / 5 * 40);
}

TEST(ScalePlan, PrefixLoadNamesTheLimitAndCheckpointRate) {
  ScalePlanOptions o = small_job();
  o.prefixes = 1;  // every shard under one prefix
  o.prefix_get_limit = 1;
  o.ckpt_params = 1e9;
  o.ckpt_bytes_per_param = 16;
  o.ckpt_every_minutes = 10;
  const ScalePlan plan = plan_scale(o).value();
  EXPECT_EQ(plan.prefixes_used, 1u);
  EXPECT_DOUBLE_EQ(plan.prefix_gets_per_second_max, plan.prefix_gets_per_second_mean);
  // Data GETs plus one shard open per shard a node touches, per rank.
  EXPECT_NEAR(plan.prefix_gets_per_second_max,
              plan.cold_gets_per_second + plan.open_gets_per_second, 1e-9);
  EXPECT_EQ(plan.first_limit.rfind("breaks first: GETs per prefix", 0), 0u) << plan.first_limit;
  EXPECT_DOUBLE_EQ(plan.ckpt_bytes_per_second, 16e9 / 600);
  EXPECT_DOUBLE_EQ(plan.ckpt_bytes_per_node, 16e9 / 3);
}

TEST(ScalePlan, RefusesOptionsItCannotPlan) {
  ScalePlanOptions o = small_job();
  o.shuffle.mode = ShuffleMode::kRandom;
  EXPECT_FALSE(plan_scale(o).is_ok());
  o = small_job();
  o.epoch_seconds = 0;
  EXPECT_FALSE(plan_scale(o).is_ok());
  o = small_job();
  o.shards = o.samples + 1;
  EXPECT_FALSE(plan_scale(o).is_ok());
}

TEST(ScalePlanCli, JsonParsesAndMatchesTheLibrary) {
  const testing::CommandResult r =
      testing::run_cli({"plan", "--nodes", "3", "--gpus-per-node", "2", "--samples", "1.2e4",
                        "--sample-bytes", "10000", "--shards", "6", "--seed", "7",
                        "--block-bytes", "64K", "--window-bytes", "1M", "--cache-block-bytes",
                        "256K", "--cache-gib", "1", "--epochs", "3", "--epoch-seconds", "100",
                        "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  const ScalePlan plan = plan_scale(small_job()).value();
  EXPECT_EQ(out["simulated_nodes"], 3);
  EXPECT_DOUBLE_EQ(out["per_node_mean"]["cold_gets"].get<double>(), plan.mean.cold_gets);
  EXPECT_DOUBLE_EQ(out["fetches_beyond_one"].get<double>(), plan.fetches_beyond_one);
  EXPECT_EQ(out["first_limit"], plan.first_limit);

  const testing::CommandResult table = testing::run_cli(
      {"plan", "--nodes", "3", "--samples", "12000", "--sample-bytes", "10000", "--shards", "6",
       "--samples-per-second-per-gpu", "100"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("GETs/s per prefix, max"), std::string::npos) << table.out;

  const testing::CommandResult bad =
      testing::run_cli({"plan", "--nodes", "3", "--samples", "100", "--sample-bytes", "1K"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("epoch"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace zerowait
