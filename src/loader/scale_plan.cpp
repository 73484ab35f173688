#include "zerowait/loader/scale_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <list>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/random.hpp"
#include "common/text.hpp"
#include "shard/pack/dataset_output.hpp"
#include "shard/pack/shard_set_writer.hpp"
#include "zerowait/shard/format.hpp"

namespace zerowait {
namespace {

using internal::format_number;

constexpr uint64_t kPackPrefixes = 65536;  // pack's 4 hex digits (shard/pack/dataset_output.cpp)
constexpr uint64_t kNodeSelectStream = 0x7363616c65;  // "scale"

// The synthetic data set's layout: shard sizes as EpochOrder takes them, and where a sample's
// bytes sit.
struct Layout {
  uint64_t per_shard = 0;
  uint64_t sample_bytes = 0;
  std::vector<uint64_t> shard_samples;
  std::vector<uint64_t> shard_bytes;
};

Layout make_layout(const ScalePlanOptions& o) {
  Layout layout;
  layout.per_shard = (o.samples + o.shards - 1) / o.shards;
  layout.sample_bytes = o.sample_bytes;
  for (uint64_t first = 0; first < o.samples; first += layout.per_shard) {
    const uint64_t count = std::min(layout.per_shard, o.samples - first);
    layout.shard_samples.push_back(count);
    layout.shard_bytes.push_back(count * o.sample_bytes);
  }
  return layout;
}

// A cache block's id: its shard in the high half, its number in the shard in the low half.
uint64_t block_id(uint64_t shard, uint64_t block) { return shard << 32 | block; }

// A least-recently-used cache of a fixed number of blocks; counts the misses (GETs).
class LruCache {
 public:
  explicit LruCache(uint64_t capacity) : capacity_(std::max<uint64_t>(1, capacity)) {}
  // Returns true on a miss.
  bool touch(uint64_t id) {
    if (auto it = where_.find(id); it != where_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return false;
    }
    order_.push_front(id);
    where_[id] = order_.begin();
    if (order_.size() > capacity_) {
      where_.erase(order_.back());
      order_.pop_back();
    }
    return true;
  }

 private:
  uint64_t capacity_;
  std::list<uint64_t> order_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

struct NodeResult {
  NodeEpochCounts counts;
  std::unordered_map<uint64_t, uint64_t> cold_gets_by_shard;
  std::unordered_set<uint64_t> cold_blocks;
  std::unordered_set<uint64_t> shards_opened;
};

// Runs node `node`'s real epoch orders through an LRU cache of the node's size.
NodeResult simulate_node(const ScalePlanOptions& o, const Layout& layout, uint32_t node) {
  NodeResult result;
  ShuffleOptions shuffle = o.shuffle;
  shuffle.nodes = o.nodes;
  shuffle.node = node;
  LruCache cache(o.cache_bytes_per_node / o.cache_block_bytes);
  std::unordered_set<uint64_t> ever;
  uint64_t warm_gets = 0;
  for (uint64_t epoch = 0; epoch < o.epochs; ++epoch) {
    const EpochOrder order(layout.shard_samples, shuffle, epoch, layout.shard_bytes);
    if (epoch == 0) result.counts.samples = static_cast<double>(order.size());
    for (uint64_t p = 0; p < order.size(); ++p) {
      const uint64_t sample = order[p];
      const uint64_t shard = sample / layout.per_shard;
      const uint64_t begin =
          format::kHeaderSize + (sample % layout.per_shard) * layout.sample_bytes;
      const uint64_t end = begin + std::max<uint64_t>(1, layout.sample_bytes);
      for (uint64_t b = begin / o.cache_block_bytes; b <= (end - 1) / o.cache_block_bytes; ++b) {
        const uint64_t id = block_id(shard, b);
        ever.insert(id);
        if (!cache.touch(id)) continue;
        if (epoch > 0) {
          ++warm_gets;
          continue;
        }
        ++result.counts.cold_gets;
        // The shard's last block is shorter.
        const uint64_t shard_end = format::kHeaderSize + layout.shard_bytes[shard];
        result.counts.cold_bytes += static_cast<double>(
            std::min(o.cache_block_bytes, shard_end - b * o.cache_block_bytes));
        ++result.cold_gets_by_shard[shard];
        result.cold_blocks.insert(id);
      }
      if (epoch == 0) result.shards_opened.insert(shard);
      if (epoch == 0) result.counts.useful_bytes += static_cast<double>(layout.sample_bytes);
    }
  }
  if (o.epochs > 1) result.counts.warm_gets = static_cast<double>(warm_gets) / (o.epochs - 1);
  result.counts.shards_opened = static_cast<double>(result.shards_opened.size());
  result.counts.cache_bytes_needed =
      static_cast<double>(ever.size()) * static_cast<double>(o.cache_block_bytes);
  return result;
}

// Which nodes to run: all, or max_simulated_nodes distinct ones at random, in order.
std::vector<uint32_t> choose_nodes(const ScalePlanOptions& o) {
  std::vector<uint32_t> all(o.nodes);
  for (uint32_t n = 0; n < o.nodes; ++n) all[n] = n;
  if (o.nodes <= o.max_simulated_nodes) return all;
  internal::Rng rng(internal::combine_seed(o.shuffle.seed, kNodeSelectStream));
  internal::shuffle_range(all.begin(), all.end(), rng);
  all.resize(o.max_simulated_nodes);
  std::sort(all.begin(), all.end());
  return all;
}

// The key prefix (0..prefixes-1) pack puts shard `shard` under, folded onto `prefixes`.
uint64_t prefix_of(uint64_t shard, uint64_t prefixes) {
  const std::string path =
      internal::hashed_shard_path(internal::ShardSetWriter::shard_name(shard));
  const uint64_t pack_prefix = std::stoull(path.substr(0, path.find('/')), nullptr, 16);
  return pack_prefix * prefixes / kPackPrefixes;
}

void add_max(NodeEpochCounts* max, const NodeEpochCounts& c) {
  max->samples = std::max(max->samples, c.samples);
  max->cold_gets = std::max(max->cold_gets, c.cold_gets);
  max->cold_bytes = std::max(max->cold_bytes, c.cold_bytes);
  max->useful_bytes = std::max(max->useful_bytes, c.useful_bytes);
  max->warm_gets = std::max(max->warm_gets, c.warm_gets);
  max->shards_opened = std::max(max->shards_opened, c.shards_opened);
  max->cache_bytes_needed = std::max(max->cache_bytes_needed, c.cache_bytes_needed);
}

void add_sum(NodeEpochCounts* sum, const NodeEpochCounts& c) {
  sum->samples += c.samples;
  sum->cold_gets += c.cold_gets;
  sum->cold_bytes += c.cold_bytes;
  sum->useful_bytes += c.useful_bytes;
  sum->warm_gets += c.warm_gets;
  sum->shards_opened += c.shards_opened;
  sum->cache_bytes_needed += c.cache_bytes_needed;
}

NodeEpochCounts divided(NodeEpochCounts c, double by) {
  for (double* v : {&c.samples, &c.cold_gets, &c.cold_bytes, &c.useful_bytes, &c.warm_gets,
                    &c.shards_opened, &c.cache_bytes_needed}) {
    *v /= by;
  }
  return c;
}

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / (1ull << 30));
  return text;
}

// The limit nearest to (or furthest past) being reached, as a sentence.
std::string name_first_limit(const ScalePlan& plan) {
  const ScalePlanOptions& o = plan.options;
  const double prefix_load = plan.prefix_gets_per_second_max / o.prefix_get_limit;
  const double cache_load =
      plan.max.cache_bytes_needed / static_cast<double>(o.cache_bytes_per_node);
  const std::string at = " at " + format_number(o.nodes) + " nodes";
  std::string prefix_text =
      "GETs per prefix " + format_number(plan.prefix_gets_per_second_max) + "/s " +
      (prefix_load > 1 ? "> " : "<= ") + format_number(o.prefix_get_limit) + "/s" + at;
  if (prefix_load > 1) {
    const std::string needed = format_number(static_cast<double>(plan.prefixes_needed));
    const double open_share =
        plan.open_gets_per_second / (plan.open_gets_per_second + plan.cold_gets_per_second);
    char detail[160];
    std::snprintf(detail, sizeof detail,
                  " (%.0f%% of them shard opens): the cold epoch takes >= %.2f s instead of "
                  "%.2f s",
                  100 * open_share, plan.cold_epoch_store_seconds, plan.epoch_seconds);
    prefix_text += detail;
    prefix_text += plan.prefixes_needed <= plan.options.shards
                       ? "; spread the shards over >= " + needed + " prefixes"
                       : "; spread evenly they would need >= " + needed +
                             " prefixes, more than the " +
                             format_number(static_cast<double>(plan.options.shards)) +
                             " shards: fewer GETs are needed (fewer ranks opening shards, "
                             "larger blocks)";
  }
  std::string cache_text = "cache per node " + gib(plan.max.cache_bytes_needed) + " needed " +
                           (cache_load > 1 ? "> " : "<= ") +
                           gib(static_cast<double>(o.cache_bytes_per_node)) + " held" + at;
  if (cache_load > 1) {
    cache_text += ": warm epochs refetch " + format_number(plan.mean.warm_gets) + " GETs per node";
  }
  if (prefix_load <= 1 && cache_load <= 1) {
    return "nothing reaches its limit; nearest: " +
           (prefix_load >= cache_load ? prefix_text : cache_text);
  }
  return "breaks first: " + (prefix_load >= cache_load ? prefix_text : cache_text);
}

}  // namespace

Status ScalePlanOptions::validate() const {
  if (nodes == 0) return invalid_argument("nodes must be at least 1");
  if (gpus_per_node == 0) return invalid_argument("gpus per node must be at least 1");
  if (samples == 0) return invalid_argument("samples must be at least 1");
  if (sample_bytes == 0) return invalid_argument("sample bytes must be at least 1");
  if (shards == 0 || shards > samples) {
    return invalid_argument("shards must be between 1 and the sample count");
  }
  if (shuffle.mode != ShuffleMode::kBlock) {
    return invalid_argument("the scale plan needs shuffle \"block\" (node-stable shares)");
  }
  if (cache_block_bytes == 0) return invalid_argument("cache block bytes must be at least 1");
  if (epochs == 0) return invalid_argument("epochs must be at least 1");
  if (!(epoch_seconds > 0) && !(samples_per_second_per_gpu > 0)) {
    return invalid_argument("give an epoch's seconds or samples per second per GPU (above 0)");
  }
  if (prefixes == 0 || prefixes > kPackPrefixes) {
    return invalid_argument("prefixes must be between 1 and 65,536 (pack's hash prefixes)");
  }
  if (!(prefix_get_limit > 0)) return invalid_argument("GETs per prefix limit must be above 0");
  if (max_simulated_nodes == 0) return invalid_argument("simulated nodes must be at least 1");
  if (ckpt_params < 0 || ckpt_bytes_per_param < 0 || !(ckpt_every_minutes > 0)) {
    return invalid_argument("checkpoint sizes must be >= 0 and its interval above 0");
  }
  ShuffleOptions per_node = shuffle;
  per_node.nodes = nodes;
  per_node.node = 0;
  return per_node.validate();
}

Result<ScalePlan> plan_scale(const ScalePlanOptions& options) {
  ZW_RETURN_IF_ERROR(options.validate());
  const ScalePlanOptions& o = options;
  ScalePlan plan;
  plan.options = o;
  const Layout layout = make_layout(o);
  plan.shard_samples = layout.per_shard;
  for (uint64_t s = 0; s < layout.shard_samples.size(); ++s) {
    const uint64_t bytes = format::kHeaderSize + layout.shard_bytes[s];
    plan.dataset_bytes += bytes;
    plan.dataset_blocks += (bytes + o.cache_block_bytes - 1) / o.cache_block_bytes;
  }
  plan.samples_per_block = samples_per_block(layout.per_shard, layout.shard_bytes[0], o.shuffle);

  plan.simulated = choose_nodes(o);
  plan.simulated_nodes = static_cast<uint32_t>(plan.simulated.size());
  const double scale = static_cast<double>(o.nodes) / plan.simulated_nodes;
  NodeEpochCounts sum;
  std::unordered_map<uint64_t, double> gets_by_shard;
  std::unordered_map<uint64_t, uint32_t> nodes_by_block;  // exact overlap, all nodes simulated
  for (uint32_t node : plan.simulated) {
    NodeResult r = simulate_node(o, layout, node);
    add_sum(&sum, r.counts);
    add_max(&plan.max, r.counts);
    for (const auto& [shard, gets] : r.cold_gets_by_shard) {
      gets_by_shard[shard] += static_cast<double>(gets) * scale;
    }
    // Every rank (one process each) opens the shards its node touches: one metadata GET each.
    for (uint64_t shard : r.shards_opened) gets_by_shard[shard] += o.gpus_per_node * scale;
    if (plan.simulated_nodes == o.nodes) {
      for (uint64_t id : r.cold_blocks) ++nodes_by_block[id];
    }
  }
  plan.mean = divided(sum, plan.simulated_nodes);
  plan.fetches_all_nodes = plan.mean.cold_gets * o.nodes;
  if (plan.simulated_nodes == o.nodes) {
    for (const auto& [id, count] : nodes_by_block) {
      if (count > 1) plan.fetches_beyond_one += count - 1;
    }
  } else {
    plan.fetches_beyond_one =
        std::max(0.0, plan.fetches_all_nodes - static_cast<double>(plan.dataset_blocks));
  }

  plan.epoch_seconds = o.epoch_seconds > 0 ? o.epoch_seconds
                                           : plan.mean.samples / (o.gpus_per_node *
                                                                  o.samples_per_second_per_gpu);
  const double seconds = plan.epoch_seconds;
  plan.cold_gets_per_second = plan.fetches_all_nodes / seconds;
  plan.cold_bytes_per_second = plan.mean.cold_bytes * o.nodes / seconds;
  plan.cold_bytes_per_second_per_node = plan.mean.cold_bytes / seconds;
  plan.open_gets_per_second = plan.mean.shards_opened * o.gpus_per_node * o.nodes / seconds;
  plan.warm_gets_per_second = plan.mean.warm_gets * o.nodes / seconds;

  // Epoch 0's GETs per prefix (data blocks and opens), over the prefixes that hold shards.
  std::unordered_map<uint64_t, double> gets_by_prefix;
  for (uint64_t s = 0; s < layout.shard_samples.size(); ++s) {
    const auto found = gets_by_shard.find(s);
    gets_by_prefix[prefix_of(s, o.prefixes)] += found == gets_by_shard.end() ? 0.0 : found->second;
  }
  plan.prefixes_used = gets_by_prefix.size();
  double total_gets = 0;
  for (const auto& [prefix, gets] : gets_by_prefix) {
    plan.prefix_gets_per_second_max = std::max(plan.prefix_gets_per_second_max, gets / seconds);
    total_gets += gets;
  }
  plan.prefix_gets_per_second_mean = total_gets / seconds / plan.prefixes_used;
  plan.cold_epoch_store_seconds = plan.prefix_gets_per_second_max * seconds / o.prefix_get_limit;
  plan.prefixes_needed =
      static_cast<uint64_t>(std::ceil(total_gets / seconds / o.prefix_get_limit));

  plan.ckpt_bytes = o.ckpt_params * o.ckpt_bytes_per_param;
  plan.ckpt_bytes_per_second = plan.ckpt_bytes / (o.ckpt_every_minutes * 60);
  plan.ckpt_bytes_per_node = plan.ckpt_bytes / o.nodes;
  plan.first_limit = name_first_limit(plan);
  return plan;
}

}  // namespace zerowait
