// zw_bench_mixing: how well each shuffle mode mixes classes on a class-sorted pack, the worst case
// for any order that reads blocks of consecutive samples (packs made from an ImageFolder tree are
// sorted by class). The data set is ImageNet-1k's shape: 1,281,167 samples of 110 KB on average
// in 1,000 classes of equal size, sorted by class, in shards of 1 GB. For each order it reports,
// over the batches of one epoch (batch 256):
//   - distinct classes per batch (mean; 1% quantile), and the ratio to `random`'s mean;
//   - the largest share one class takes of a batch (mean);
// The reference is `random` (a uniform permutation) measured in the same run; `none` shows the
// unmixed extreme. Then, for the node-stable deal, how much of what a node reads one epoch it
// read the epoch before (what its cache can serve), against one global block order. Numbers are pure functions of the orders: no I/O, no timing.
//
//   zw_bench_mixing [--samples N] [--classes C] [--sample-bytes B] [--batch B]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "zerowait/loader/sample_plan.hpp"

namespace zerowait {
namespace {

struct Mixing {
  double distinct_mean = 0;
  double distinct_p01 = 0;
  double top_share_mean = 0;
};

// `samples`: the data set's size (a node's order covers only its share).
Mixing measure_share(const EpochOrder& order, uint64_t classes, uint64_t batch, uint64_t samples) {
  const uint64_t total = order.size();
  std::vector<uint32_t> count(classes, 0);
  std::vector<uint64_t> distinct;
  double top_share_sum = 0;
  for (uint64_t first = 0; first + batch <= total; first += batch) {
    std::fill(count.begin(), count.end(), 0);
    uint64_t d = 0;
    uint32_t top = 0;
    for (uint64_t p = first; p < first + batch; ++p) {
      const uint64_t cls = order[p] * classes / samples;  // sorted by class
      d += count[cls]++ == 0;
      top = std::max(top, count[cls]);
    }
    distinct.push_back(d);
    top_share_sum += static_cast<double>(top) / static_cast<double>(batch);
  }
  Mixing m;
  std::sort(distinct.begin(), distinct.end());
  double sum = 0;
  for (uint64_t d : distinct) sum += static_cast<double>(d);
  m.distinct_mean = sum / static_cast<double>(distinct.size());
  m.distinct_p01 = static_cast<double>(distinct[distinct.size() / 100]);
  m.top_share_mean = top_share_sum / static_cast<double>(distinct.size());
  return m;
}

Mixing measure(const EpochOrder& order, uint64_t classes, uint64_t batch) {
  return measure_share(order, classes, batch, order.size());
}

int run(int argc, char** argv) {
  uint64_t samples = 1'281'167, classes = 1000, sample_bytes = 110'000, batch = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    const uint64_t value = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--samples")) samples = value;
    else if (!std::strcmp(argv[i], "--classes")) classes = value;
    else if (!std::strcmp(argv[i], "--sample-bytes")) sample_bytes = value;
    else if (!std::strcmp(argv[i], "--batch")) batch = value;
    else {
      std::fprintf(stderr, "usage: %s [--samples N] [--classes C] [--sample-bytes B] [--batch B]\n",
                   argv[0]);
      return 2;
    }
  }
  // Shards of about 1 GB.
  const uint64_t per_shard = std::max<uint64_t>(1, (1ull << 30) / sample_bytes);
  std::vector<uint64_t> shard_samples, shard_bytes;
  for (uint64_t done = 0; done < samples; done += per_shard) {
    shard_samples.push_back(std::min(per_shard, samples - done));
    shard_bytes.push_back(shard_samples.back() * sample_bytes);
  }

  struct Row {
    std::string name;
    ShuffleOptions shuffle;
  };
  std::vector<Row> rows;
  rows.push_back({"random", {ShuffleMode::kRandom}});
  rows.push_back({"none", {ShuffleMode::kNone}});
  rows.push_back({"quasi (64 samples x 256)", {ShuffleMode::kQuasiRandom}});
  for (uint64_t block_mib : {1, 2, 4, 8}) {
    for (uint64_t window_mib : {64, 256, 1024}) {
      ShuffleOptions s;
      s.mode = ShuffleMode::kBlock;
      s.block_bytes = block_mib << 20;
      s.window_bytes = window_mib << 20;
      rows.push_back({"block " + std::to_string(block_mib) + " MiB, window " +
                          std::to_string(window_mib) + " MiB (" +
                          std::to_string(s.blocks_per_window()) + " blocks)",
                      s});
    }
  }

  std::printf("zw_bench_mixing: %llu samples of %llu bytes in %llu classes (sorted by class), "
              "%zu shards; batch %llu; one epoch\n",
              static_cast<unsigned long long>(samples),
              static_cast<unsigned long long>(sample_bytes),
              static_cast<unsigned long long>(classes), shard_samples.size(),
              static_cast<unsigned long long>(batch));
  std::printf("%-44s %14s %10s %14s %11s\n", "order", "classes/batch", "1% batch",
              "top class share", "vs random");
  double random_mean = 0;
  for (const Row& row : rows) {
    const EpochOrder order(shard_samples, row.shuffle, 1, shard_bytes);
    const Mixing m = measure(order, classes, batch);
    if (row.shuffle.mode == ShuffleMode::kRandom) random_mean = m.distinct_mean;
    std::printf("%-44s %14.1f %10.0f %14.3f %11.2f\n", row.name.c_str(), m.distinct_mean,
                m.distinct_p01, m.top_share_mean, m.distinct_mean / random_mean);
  }

  // What a node's cache gains from the node-stable deal: the share of the samples node 0 reads
  // in epoch 1 that it also read in epoch 0 (what its cache could still hold), with the data set
  // spread over `nodes` nodes: by rank partition of one global block order (each node's ranks
  // take every nodes-th step), and dealt by the node-stable variant (re-dealt every 10 epochs).
  std::printf("\nnode 0's epoch-1 samples it also read in epoch 0 (default block and window):\n");
  std::printf("%-8s %24s %24s %26s\n", "nodes", "global block order", "node-stable deal",
              "node-stable classes/batch");
  for (uint32_t nodes : {8u, 64u, 1000u}) {
    ShuffleOptions global;
    global.mode = ShuffleMode::kBlock;
    auto node0_of_global = [&](uint64_t epoch) {
      const EpochOrder order(shard_samples, global, epoch, shard_bytes);
      std::vector<bool> seen(order.size(), false);
      for (uint64_t first = 0; first < order.size(); first += batch * nodes) {
        for (uint64_t p = first; p < std::min(order.size(), first + batch); ++p) seen[order[p]] = true;
      }
      return seen;
    };
    ShuffleOptions stable = global;
    stable.nodes = nodes;
    stable.redeal_every = 10;
    auto node0_stable = [&](uint64_t epoch) {
      const EpochOrder order(shard_samples, stable, epoch, shard_bytes);
      std::vector<bool> seen(samples, false);
      for (uint64_t p = 0; p < order.size(); ++p) seen[order[p]] = true;
      return seen;
    };
    auto kept = [&](const std::vector<bool>& before, const std::vector<bool>& after) {
      uint64_t both = 0, now = 0;
      for (uint64_t i = 0; i < samples; ++i) {
        now += after[i];
        both += after[i] && before[i];
      }
      return static_cast<double>(both) / static_cast<double>(std::max<uint64_t>(now, 1));
    };
    const EpochOrder node0(shard_samples, stable, 1, shard_bytes);
    const Mixing m = measure_share(node0, classes, batch, samples);
    std::printf("%-8u %24.3f %24.3f %26.1f\n", nodes, kept(node0_of_global(0), node0_of_global(1)),
                kept(node0_stable(0), node0_stable(1)), m.distinct_mean);
  }
  return 0;
}

}  // namespace
}  // namespace zerowait

int main(int argc, char** argv) { return zerowait::run(argc, argv); }
