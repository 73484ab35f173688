// Which sample goes into which batch on which rank: a pure function of the dataset's shard sizes,
// the shuffle options, the epoch and the position reached. Nothing here depends on threads,
// timing or I/O, which is what makes the loader deterministic and exactly resumable.
// Thread-safety: every function here is pure, and a RankPartition never changes after
// construction, so any number of threads may use them at once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait {

enum class ShuffleMode {
  kNone,         // dataset order
  kQuasiRandom,  // blocks of consecutive samples shuffled, then samples shuffled in a window
  kRandom,       // a pseudo-random permutation of all samples (no per-sample memory)
  kBlock,        // blocks of about block_bytes read whole, samples shuffled in a window of them
};

// "none" / "quasi" / "random" / "block".
const char* shuffle_mode_name(ShuffleMode mode);
Result<ShuffleMode> parse_shuffle_mode(const std::string& name);

struct ShuffleOptions {
  ShuffleMode mode = ShuffleMode::kRandom;
  uint64_t seed = 0;
  // kQuasiRandom: each shard is cut into blocks of at most this many consecutive samples (a
  // smaller shard is one block); the blocks of all shards are shuffled, then every run of
  // `window_blocks` blocks is shuffled as one window. A window's reads stay inside its blocks,
  // while a batch still mixes samples from many places (packs are often sorted by class: with
  // 64 x 256 a window draws from 256 places, so batches mix classes almost as a uniform shuffle).
  uint64_t block_samples = 64;
  uint64_t window_blocks = 256;
  // kBlock: each shard is cut into blocks of consecutive samples of about `block_bytes` (by the
  // shard's mean sample size), which the loader reads whole, one request each. The blocks of
  // all shards are shuffled, and every run of them totalling `window_bytes` is one window whose
  // samples are shuffled together; the loader holds about two windows in memory. Reads are
  // large and few; a batch mixes samples of window_bytes / block_bytes places. The defaults
  // (256 places) give a class-sorted ImageNet-sized pack 0.69 of `random`'s distinct classes
  // per batch (docs/loader.md, bench/mixing_bench.cpp).
  uint64_t block_bytes = 1 << 20;
  uint64_t window_bytes = 256 << 20;
  // kBlock across nodes (node-stable): with nodes > 1 the blocks are dealt to `nodes` shares by
  // a keyed permutation that changes only every `redeal_every` epochs (0: never), and this
  // order covers share `node` only: each node reads, and its node-local cache holds, the same
  // 1/nodes of the data set epoch after epoch, shuffled anew within it each epoch. Every share
  // is cut to the smallest one's sample count, so every rank of every node gets the same number
  // of batches (a few samples a share, at most about one block, sit out an epoch). rank and
  // world_size then number the ranks within the node.
  uint32_t nodes = 1;
  uint32_t node = 0;
  uint64_t redeal_every = 0;

  Status validate() const;
  // kBlock: blocks in one window.
  uint64_t blocks_per_window() const { return std::max<uint64_t>(1, window_bytes / block_bytes); }
};

// kBlock: how many consecutive samples make one block of a shard of `samples` samples in
// `bytes` bytes (at least 1, at most the shard). The loader and EpochOrder cut shards alike.
uint64_t samples_per_block(uint64_t samples, uint64_t bytes, const ShuffleOptions& shuffle);

// The global sample order of one epoch: a permutation of [0, total samples), looked up by
// position. `shard_samples[s]` is the sample count of shard s; global indices number shards in
// order. `shuffle` must have passed validate(); no errors otherwise.
//   kNone    the identity.
//   kRandom  a keyed pseudo-random permutation: a Feistel network over the smallest even-bit
//            power of two that holds every index, walked along its cycle until it lands inside
//            [0, total). Nothing is held per sample: building one over 10^9 samples takes
//            microseconds and a few bytes, and each lookup a few dozen nanoseconds.
//   kQuasiRandom  the order as a table (8 bytes a sample, built in O(total) time).
//   kBlock   the shuffled blocks (16 bytes a block, none per sample); within a window, the
//            positions go through a keyed permutation like kRandom's. `shard_bytes[s]` sizes
//            shard s's blocks (samples_per_block); without it, blocks are block_samples long.
// Immutable once built: any number of threads may look up positions at once.
class EpochOrder {
 public:
  EpochOrder(std::span<const uint64_t> shard_samples, const ShuffleOptions& shuffle,
             uint64_t epoch, std::span<const uint64_t> shard_bytes = {});

  // Samples in the epoch: all of them, or with nodes > 1 one node's share. Computes what
  // size() of that order would be, without building it (O(blocks) time, O(nodes) memory).
  static uint64_t size_of(std::span<const uint64_t> shard_samples, const ShuffleOptions& shuffle,
                          uint64_t epoch, std::span<const uint64_t> shard_bytes = {});

  uint64_t size() const { return total_; }
  // The global index at `position` (< size()).
  uint64_t operator[](uint64_t position) const;
  // Memory held beyond the object itself (the kQuasiRandom table, the kBlock blocks).
  uint64_t table_bytes() const {
    return table_.size() * sizeof(uint64_t) + blocks_.size() * sizeof(Block);
  }

  // A keyed pseudo-random permutation of [0, size): a Feistel network over the smallest
  // even-bit power of two holding every index, walked along its cycle until it lands inside.
  class Permutation {
   public:
    Permutation() = default;
    Permutation(uint64_t size, uint64_t key);
    uint64_t operator()(uint64_t position) const;

   private:
    static constexpr int kRounds = 6;
    uint64_t permute(uint64_t position) const;
    uint64_t size_ = 0;
    int half_bits_ = 0;
    uint64_t keys_[kRounds] = {};
  };

 private:
  struct Block {
    uint64_t first = 0;  // global index of its first sample
    uint64_t start = 0;  // kBlock: its first sample's position in the epoch order
  };
  uint64_t block_lookup(uint64_t position) const;

  ShuffleMode mode_;
  uint64_t total_ = 0;
  Permutation permutation_;      // kRandom
  std::vector<uint64_t> table_;  // kQuasiRandom
  // kBlock: the blocks in epoch order, and the key of each window's permutation.
  std::vector<Block> blocks_;
  uint64_t blocks_end_ = 0;  // samples in blocks_ (above total_ when a node's share is cut)
  uint64_t blocks_per_window_ = 1;
  uint64_t window_key_ = 0;
};

// Every position of one epoch's order, materialised (tests, tools): O(total) memory.
std::vector<uint64_t> epoch_order(std::span<const uint64_t> shard_samples,
                                  const ShuffleOptions& shuffle, uint64_t epoch);

struct PartitionOptions {
  uint64_t batch_size = 1;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // The rule that gives every rank the same number of batches (docs/loader.md):
  // samples are taken in epoch order in steps of batch_size * world_size; within a step rank r
  // takes the r-th run of batch_size samples. The last, partial step has t samples:
  // - drop_last: it is dropped (t samples of this epoch's order are not seen this epoch);
  // - otherwise: it is split across ranks in contiguous runs whose sizes differ by at most one;
  //   when t < world_size, a rank with no sample left gets one sample repeated from the start
  //   of the epoch order (counted as padding), so no rank gets an empty batch.
  bool drop_last = false;

  Status validate() const;
};

// The batches of one rank in one epoch, starting at global position `start` (samples of the
// epoch order consumed by all ranks together before this point; 0 at the start of an epoch).
// Shares `order` (never copies it); `options` must have passed validate() and `start` must not
// pass the end of `order`. Copyable; const methods are thread-safe.
class RankPartition {
 public:
  RankPartition(std::shared_ptr<const EpochOrder> order, uint64_t start, PartitionOptions options);

  // Batches this rank gets between `start` and the end of the epoch; the same on every rank.
  uint64_t batch_count() const { return batch_count_; }
  // The same count without an order: for `total` samples from `start`.
  static uint64_t count_batches(uint64_t total, uint64_t start, const PartitionOptions& options);
  // Global indices of batch j (0 <= j < batch_count()) into `out` (replaced). Returns how many
  // of them (at the end) are padding repeats.
  uint64_t batch(uint64_t j, std::vector<uint64_t>* out) const;
  // Global position once every rank has consumed its first j batches.
  uint64_t position_after(uint64_t j) const;
  uint64_t start() const { return start_; }
  const PartitionOptions& options() const { return options_; }

 private:
  std::shared_ptr<const EpochOrder> order_;
  uint64_t start_ = 0;
  PartitionOptions options_;
  uint64_t full_steps_ = 0;
  uint64_t tail_ = 0;  // samples in the last, partial step (0 when there is none or it is dropped)
  uint64_t batch_count_ = 0;
};

}  // namespace zerowait
