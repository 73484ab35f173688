#include "zerowait/loader/sample_plan.hpp"

#include <algorithm>
#include <bit>
#include <numeric>
#include <utility>

#include "common/random.hpp"

namespace zerowait {

namespace {

// Streams of randomness used by the plan; distinct so that, e.g., the block order and the
// window shuffles are independent.
constexpr uint64_t kBlockOrderStream = 0x626c6f636b;  // "block"
constexpr uint64_t kWindowStream = 0x77696e646f77;    // "window"
constexpr uint64_t kPermutationStream = 0x7065726d;   // "perm"
constexpr uint64_t kDealStream = 0x6465616c;          // "deal"

struct SampleRun {
  uint64_t first = 0;  // global index of its first sample
  uint64_t count = 0;
};

// Every shard cut into runs of samples_per_block() samples, in dataset order (without
// shard_bytes, runs of block_samples: kQuasiRandom's blocks).
std::vector<SampleRun> cut_blocks(std::span<const uint64_t> shard_samples,
                                  const ShuffleOptions& shuffle,
                                  std::span<const uint64_t> shard_bytes) {
  std::vector<SampleRun> blocks;
  uint64_t first = 0;
  for (size_t s = 0; s < shard_samples.size(); ++s) {
    const uint64_t count = shard_samples[s];
    const uint64_t per_block =
        samples_per_block(count, s < shard_bytes.size() ? shard_bytes[s] : 0, shuffle);
    for (uint64_t done = 0; done < count; done += per_block) {
      blocks.push_back({first + done, std::min(per_block, count - done)});
    }
    first += count;
  }
  return blocks;
}

std::vector<uint64_t> quasi_random_order(std::span<const uint64_t> shard_samples,
                                         const ShuffleOptions& shuffle, uint64_t epoch,
                                         uint64_t total) {
  std::vector<SampleRun> blocks = cut_blocks(shard_samples, shuffle, {});
  internal::Rng block_rng(internal::combine_seed(shuffle.seed, epoch, kBlockOrderStream));
  internal::shuffle_range(blocks.begin(), blocks.end(), block_rng);

  std::vector<uint64_t> order;
  order.reserve(total);
  for (size_t w = 0; w < blocks.size(); w += shuffle.window_blocks) {
    const size_t window_begin = order.size();
    const size_t end = std::min(blocks.size(), w + shuffle.window_blocks);
    for (size_t b = w; b < end; ++b) {
      for (uint64_t i = 0; i < blocks[b].count; ++i) order.push_back(blocks[b].first + i);
    }
    internal::Rng window_rng(
        internal::combine_seed(internal::combine_seed(shuffle.seed, epoch, kWindowStream), w));
    internal::shuffle_range(order.begin() + static_cast<ptrdiff_t>(window_begin), order.end(),
                            window_rng);
  }
  return order;
}

// Which node's share block b is in: a keyed permutation of the block numbers, taken modulo the
// node count, so the shares differ by at most one block. The key changes every redeal_every
// epochs only (0: never), which keeps a node's share, and its cache, the same in between.
class NodeDeal {
 public:
  NodeDeal(uint64_t blocks, const ShuffleOptions& shuffle, uint64_t epoch)
      : nodes_(shuffle.nodes),
        permutation_(blocks, internal::combine_seed(
                                 shuffle.seed,
                                 shuffle.redeal_every == 0 ? 0 : epoch / shuffle.redeal_every,
                                 kDealStream)) {}
  uint32_t node_of(uint64_t block) const {
    return nodes_ <= 1 ? 0 : static_cast<uint32_t>(permutation_(block) % nodes_);
  }
  uint32_t nodes() const { return nodes_; }

 private:
  uint32_t nodes_;
  EpochOrder::Permutation permutation_;
};

// The sample count of the smallest share: every node's epoch is cut to it.
uint64_t smallest_share(const std::vector<SampleRun>& blocks, const NodeDeal& deal) {
  std::vector<uint64_t> share(deal.nodes(), 0);
  for (uint64_t b = 0; b < blocks.size(); ++b) share[deal.node_of(b)] += blocks[b].count;
  return *std::min_element(share.begin(), share.end());
}

}  // namespace

const char* shuffle_mode_name(ShuffleMode mode) {
  switch (mode) {
    case ShuffleMode::kNone:
      return "none";
    case ShuffleMode::kQuasiRandom:
      return "quasi";
    case ShuffleMode::kRandom:
      return "random";
    case ShuffleMode::kBlock:
      return "block";
  }
  return "?";
}

Result<ShuffleMode> parse_shuffle_mode(const std::string& name) {
  if (name == "none") return ShuffleMode::kNone;
  if (name == "quasi") return ShuffleMode::kQuasiRandom;
  if (name == "random") return ShuffleMode::kRandom;
  if (name == "block") return ShuffleMode::kBlock;
  return invalid_argument("unknown shuffle mode '" + name +
                          "' (expected none, quasi, random or block)");
}

Status ShuffleOptions::validate() const {
  if (block_samples == 0) return invalid_argument("shuffle block_samples must be at least 1");
  if (window_blocks == 0) return invalid_argument("shuffle window_blocks must be at least 1");
  if (block_bytes == 0) return invalid_argument("shuffle block_bytes must be at least 1");
  if (nodes == 0) return invalid_argument("shuffle nodes must be at least 1");
  if (node >= nodes) {
    return invalid_argument("node " + std::to_string(node) + " is not below nodes " +
                            std::to_string(nodes));
  }
  if (nodes > 1 && mode != ShuffleMode::kBlock) {
    return invalid_argument("dealing blocks to nodes (nodes " + std::to_string(nodes) +
                            ") needs shuffle \"block\"");
  }
  if (window_bytes < block_bytes) {
    return invalid_argument("shuffle window_bytes (" + std::to_string(window_bytes) +
                            ") must hold at least one block of block_bytes (" +
                            std::to_string(block_bytes) + ")");
  }
  return Status::ok();
}

uint64_t samples_per_block(uint64_t samples, uint64_t bytes, const ShuffleOptions& shuffle) {
  if (samples == 0) return 1;
  if (bytes == 0) return std::min(samples, shuffle.block_samples);
  // block_bytes / (bytes / samples), without overflow for any realistic shard.
  const long double per_block =
      static_cast<long double>(shuffle.block_bytes) * samples / static_cast<long double>(bytes);
  return std::clamp<uint64_t>(static_cast<uint64_t>(per_block), 1, samples);
}

Status PartitionOptions::validate() const {
  if (batch_size == 0) return invalid_argument("batch_size must be at least 1");
  if (world_size == 0) return invalid_argument("world_size must be at least 1");
  if (rank >= world_size) {
    return invalid_argument("rank " + std::to_string(rank) + " is not below world_size " +
                            std::to_string(world_size));
  }
  return Status::ok();
}

EpochOrder::EpochOrder(std::span<const uint64_t> shard_samples, const ShuffleOptions& shuffle,
                       uint64_t epoch, std::span<const uint64_t> shard_bytes)
    : mode_(shuffle.mode),
      total_(std::accumulate(shard_samples.begin(), shard_samples.end(), uint64_t{0})) {
  switch (mode_) {
    case ShuffleMode::kNone:
      break;
    case ShuffleMode::kQuasiRandom:
      table_ = quasi_random_order(shard_samples, shuffle, epoch, total_);
      break;
    case ShuffleMode::kRandom:
      permutation_ =
          Permutation(total_, internal::combine_seed(shuffle.seed, epoch, kPermutationStream));
      break;
    case ShuffleMode::kBlock: {
      const std::vector<SampleRun> all = cut_blocks(shard_samples, shuffle, shard_bytes);
      const NodeDeal deal(all.size(), shuffle, epoch);
      for (uint64_t b = 0; b < all.size(); ++b) {
        if (deal.node_of(b) == shuffle.node) blocks_.push_back({all[b].first, all[b].count});
      }
      if (shuffle.nodes > 1) total_ = smallest_share(all, deal);
      // Blocks hold their sample count in the start field until the prefix sum below.
      internal::Rng block_rng(internal::combine_seed(shuffle.seed, epoch, kBlockOrderStream));
      internal::shuffle_range(blocks_.begin(), blocks_.end(), block_rng);
      for (Block& b : blocks_) blocks_end_ += std::exchange(b.start, blocks_end_);
      blocks_per_window_ = shuffle.blocks_per_window();
      window_key_ = internal::combine_seed(shuffle.seed, epoch, kWindowStream);
      break;
    }
  }
}

uint64_t EpochOrder::size_of(std::span<const uint64_t> shard_samples,
                             const ShuffleOptions& shuffle, uint64_t epoch,
                             std::span<const uint64_t> shard_bytes) {
  const uint64_t total =
      std::accumulate(shard_samples.begin(), shard_samples.end(), uint64_t{0});
  if (shuffle.mode != ShuffleMode::kBlock || shuffle.nodes <= 1) return total;
  const std::vector<SampleRun> blocks = cut_blocks(shard_samples, shuffle, shard_bytes);
  return smallest_share(blocks, NodeDeal(blocks.size(), shuffle, epoch));
}

EpochOrder::Permutation::Permutation(uint64_t size, uint64_t key) : size_(size) {
  const int bits = size <= 1 ? 0 : std::bit_width(size - 1);
  half_bits_ = std::max(1, (bits + 1) / 2);
  internal::Rng rng(key);
  for (uint64_t& k : keys_) k = rng.next();
}

// One pass of the Feistel network over [0, 4^half_bits): a bijection there, since each round
// only XORs one half with a function of the other. Six rounds of a SplitMix64-keyed round
// function leave no pattern a shuffle could show (tests/test_sample_plan.cpp measures it).
uint64_t EpochOrder::Permutation::permute(uint64_t position) const {
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  uint64_t left = position >> half_bits_;
  uint64_t right = position & mask;
  for (uint64_t key : keys_) {
    const uint64_t next = left ^ (internal::mix64(right ^ key) & mask);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

// Cycle walking: following the permutation of the larger domain from a position inside
// [0, size) until it lands inside again is a permutation of [0, size). The domain is under
// 4x size, so a lookup takes under 4 passes on average.
uint64_t EpochOrder::Permutation::operator()(uint64_t position) const {
  uint64_t index = position;
  do {
    index = permute(index);
  } while (index >= size_);
  return index;
}

// The window holding `position`, a permutation of the window's positions, then the block (by
// binary search over the window's starts) and the sample inside it.
uint64_t EpochOrder::block_lookup(uint64_t position) const {
  auto after = [](uint64_t p, const Block& b) { return p < b.start; };
  const size_t block = static_cast<size_t>(
      std::upper_bound(blocks_.begin(), blocks_.end(), position, after) - blocks_.begin() - 1);
  const size_t window_first = block / blocks_per_window_ * blocks_per_window_;
  const size_t window_end = std::min(blocks_.size(), window_first + blocks_per_window_);
  const uint64_t window_start = blocks_[window_first].start;
  // A share cut short keeps its windows whole: positions past total_ are never looked up, so
  // the samples they would give sit out the epoch.
  const uint64_t window_size =
      (window_end < blocks_.size() ? blocks_[window_end].start : blocks_end_) - window_start;
  const Permutation shuffle(window_size, internal::combine_seed(window_key_, window_first));
  const uint64_t target = window_start + shuffle(position - window_start);
  const auto begin = blocks_.begin() + static_cast<ptrdiff_t>(window_first);
  const auto end = blocks_.begin() + static_cast<ptrdiff_t>(window_end);
  const Block& holder = *(std::upper_bound(begin, end, target, after) - 1);
  return holder.first + (target - holder.start);
}

uint64_t EpochOrder::operator[](uint64_t position) const {
  switch (mode_) {
    case ShuffleMode::kNone:
      return position;
    case ShuffleMode::kQuasiRandom:
      return table_[position];
    case ShuffleMode::kRandom:
      return permutation_(position);
    case ShuffleMode::kBlock:
      return block_lookup(position);
  }
  return position;
}

std::vector<uint64_t> epoch_order(std::span<const uint64_t> shard_samples,
                                  const ShuffleOptions& shuffle, uint64_t epoch) {
  const EpochOrder order(shard_samples, shuffle, epoch);
  std::vector<uint64_t> out(order.size());
  for (uint64_t p = 0; p < out.size(); ++p) out[p] = order[p];
  return out;
}

RankPartition::RankPartition(std::shared_ptr<const EpochOrder> order, uint64_t start,
                             PartitionOptions options)
    : order_(std::move(order)), options_(options) {
  const uint64_t total = order_->size();
  start_ = std::min(start, total);
  const uint64_t step = options_.batch_size * options_.world_size;
  const uint64_t remaining = total - start_;
  full_steps_ = remaining / step;
  tail_ = options_.drop_last ? 0 : remaining % step;
  batch_count_ = count_batches(total, start_, options_);
}

uint64_t RankPartition::count_batches(uint64_t total, uint64_t start,
                                      const PartitionOptions& options) {
  const uint64_t step = options.batch_size * options.world_size;
  const uint64_t remaining = total - std::min(start, total);
  const bool tail = !options.drop_last && remaining % step != 0;
  return remaining / step + (tail ? 1 : 0);
}

uint64_t RankPartition::batch(uint64_t j, std::vector<uint64_t>* out) const {
  out->clear();
  const EpochOrder& order = *order_;
  const uint64_t world = options_.world_size;
  const uint64_t rank = options_.rank;
  auto take = [&](uint64_t begin, uint64_t end) {
    out->reserve(end - begin);
    for (uint64_t p = begin; p < end; ++p) out->push_back(order[p]);
  };
  if (j < full_steps_) {
    const uint64_t first = start_ + j * options_.batch_size * world + rank * options_.batch_size;
    take(first, first + options_.batch_size);
    return 0;
  }
  if (j != full_steps_ || tail_ == 0) return 0;
  // The partial last step: rank r takes [r*t/W, (r+1)*t/W) of its t samples.
  const uint64_t tail_first = start_ + full_steps_ * options_.batch_size * world;
  take(tail_first + rank * tail_ / world, tail_first + (rank + 1) * tail_ / world);
  if (!out->empty()) return 0;
  out->push_back(order[rank % order.size()]);
  return 1;
}

uint64_t RankPartition::position_after(uint64_t j) const {
  if (j >= batch_count_)
    return start_ + full_steps_ * options_.batch_size * options_.world_size +
           (options_.drop_last ? 0 : tail_);
  return start_ + j * options_.batch_size * options_.world_size;
}

}  // namespace zerowait
