// What a training job of many nodes asks of the object store, computed by running the loader's
// real plan (EpochOrder with node-stable block shuffling) for each node over a synthetic data set
// of fixed-size samples, without reading any data. It counts the node-local cache's block GETs
// per node per epoch, spreads them over the shards' hash-named key prefixes, and turns counts
// into rates with an epoch's duration. `zerowait plan` prints the result; docs/scale.md reads it.
// Thread-safety: plan_scale is a pure function of its options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/loader/sample_plan.hpp"

namespace zerowait {

struct ScalePlanOptions {
  uint32_t nodes = 1;
  uint32_t gpus_per_node = 8;
  // The synthetic data set: `samples` samples of `sample_bytes` each, packed in order into
  // `shards` shards of equal sample counts (the last one shorter), laid out like `zerowait pack`
  // lays them out: a 4 KiB header, then the samples back to back.
  uint64_t samples = 0;
  uint64_t sample_bytes = 0;
  uint64_t shards = 1;
  // The loader's shuffle; mode must be kBlock. nodes and node are set per simulated node.
  ShuffleOptions shuffle;
  // The node-local cache: its block size (one ranged GET each) and its capacity per node.
  uint64_t cache_block_bytes = 4ull << 20;
  uint64_t cache_bytes_per_node = 1ull << 40;
  // Epochs simulated: epoch 0 is cold (empty caches); later ones are warm.
  uint64_t epochs = 2;
  // How long an epoch takes; 0: from samples_per_second_per_gpu.
  double epoch_seconds = 0;
  double samples_per_second_per_gpu = 0;
  // Key prefixes the store serves at `prefix_get_limit` GET/s each. Shard i is named
  // shard-NNNNNN.zws and sits under pack's hash prefix of that name (65,536 of them); with fewer
  // prefixes, each serves an equal range of pack's.
  uint64_t prefixes = 65536;
  double prefix_get_limit = 5500;
  // Nodes simulated: all of them up to this many, else this many chosen at random (seeded by
  // shuffle.seed) and the totals extrapolated by nodes / simulated.
  uint32_t max_simulated_nodes = 64;
  // Checkpoints: a model's state of params x bytes_per_param written every `every_minutes`.
  double ckpt_params = 0;
  double ckpt_bytes_per_param = 16;
  double ckpt_every_minutes = 30;

  Status validate() const;
};

// Per node, per epoch: mean and max over the simulated nodes.
struct NodeEpochCounts {
  double samples = 0;
  double cold_gets = 0;      // epoch 0: distinct cache blocks the node's order touches
  double cold_bytes = 0;     // those blocks' bytes
  double useful_bytes = 0;   // bytes of the samples themselves
  double warm_gets = 0;      // per later epoch: blocks an LRU cache of the node's size refetches
  double shards_opened = 0;  // distinct shards touched in epoch 0 (one metadata GET per process)
  double cache_bytes_needed = 0;  // distinct blocks over all simulated epochs, in bytes
};

struct ScalePlan {
  ScalePlanOptions options;
  uint32_t simulated_nodes = 0;  // == options.nodes unless extrapolated
  std::vector<uint32_t> simulated;  // which nodes
  uint64_t shard_samples = 0;       // per shard (the last may hold fewer)
  uint64_t dataset_bytes = 0;       // all shards
  uint64_t dataset_blocks = 0;      // cache blocks of all shards' data
  uint64_t samples_per_block = 0;   // loader blocks (shuffle.block_bytes)
  double epoch_seconds = 0;
  NodeEpochCounts mean;
  NodeEpochCounts max;
  // Cache blocks fetched in epoch 0 by all nodes together, and by more than one node (a cache
  // block holding loader blocks dealt to different nodes is downloaded by each of them). Counted
  // exactly when every node is simulated, else nodes x mean - dataset_blocks.
  double fetches_all_nodes = 0;
  double fetches_beyond_one = 0;
  // Store load, epoch 0 (cold) and warm epochs: all nodes together.
  double cold_gets_per_second = 0;  // data blocks
  double cold_bytes_per_second = 0;
  double cold_bytes_per_second_per_node = 0;  // what each node's network must carry
  double open_gets_per_second = 0;  // shard metadata, one per shard per process (GPU rank)
  double warm_gets_per_second = 0;
  // GETs/s per key prefix in epoch 0 (data blocks and shard opens), over the prefixes that hold
  // at least one shard.
  uint64_t prefixes_used = 0;
  double prefix_gets_per_second_max = 0;
  double prefix_gets_per_second_mean = 0;
  // The shortest cold epoch the prefix limit allows: the busiest prefix's GETs / the limit.
  double cold_epoch_store_seconds = 0;
  // Prefixes needed for the busiest to stay under the limit if load spread evenly over them.
  uint64_t prefixes_needed = 0;
  // Checkpoints.
  double ckpt_bytes = 0;
  double ckpt_bytes_per_second = 0;
  double ckpt_bytes_per_node = 0;  // each node writes its shard of the state
  // What reaches its limit first, in a sentence ("" when nothing does).
  std::string first_limit;
};

// Runs the plan for the simulated nodes and derives the rates. Errors: invalid options.
Result<ScalePlan> plan_scale(const ScalePlanOptions& options);

}  // namespace zerowait
