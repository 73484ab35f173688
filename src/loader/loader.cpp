#include "zerowait/loader/loader.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "host/cuda_runtime.hpp"
#include "common/log.hpp"
#include "common/memory_headroom.hpp"
#include "common/numa.hpp"
#include "common/random.hpp"
#include "loader/arena_pool.hpp"
#include "loader/batch_builder.hpp"
#include "loader/loader_run.hpp"
#include "loader/memory_budget.hpp"

namespace zerowait {

using internal::seconds;
using SteadyClock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Loader

Result<CorruptPolicy> parse_corrupt_policy(const std::string& name) {
  if (name == "raise") return CorruptPolicy::kRaise;
  if (name == "skip") return CorruptPolicy::kSkip;
  return invalid_argument("unknown on_corrupt policy '" + name + "' (expected raise or skip)");
}

Status LoaderOptions::validate() const {
  ZW_RETURN_IF_ERROR(shuffle.validate());
  PartitionOptions partition{batch_size, rank, world_size, drop_last};
  ZW_RETURN_IF_ERROR(partition.validate());
  if (prefetch == 0) return invalid_argument("prefetch must be at least 1");
  if (read_timeout.count() <= 0) return invalid_argument("read_timeout must be positive");
  for (const auto& [name, spec] : decode) {
    Result<std::unique_ptr<FieldDecoder>> decoder = make_field_decoder(spec);
    if (!decoder) return decoder.status().with_context("decode of field '" + name + "'");
  }
  return Status::ok();
}

namespace {

// An FNV-style fold of the values that define a dataset's global index.
uint64_t dataset_fingerprint(const Dataset& dataset, const std::vector<uint64_t>& shard_samples) {
  uint64_t h = internal::mix64(shard_samples.size());
  for (size_t s = 0; s < shard_samples.size(); ++s) {
    h = internal::combine_seed(h, shard_samples[s]);
    const auto& shards = dataset.manifest().shards;
    if (s < shards.size()) {
      for (char c : shards[s].checksum) h = internal::combine_seed(h, uint8_t(c));
    }
  }
  return h;
}

// Average bytes of a sample and of each delivered field, from the first shards' indexes (up to
// 4096 samples): what the arena pool is sized from.
struct SizeEstimate {
  uint64_t sample_bytes = 1;
  std::vector<uint64_t> field_bytes;
};

Result<SizeEstimate> estimate_sizes(const Dataset& dataset, const std::vector<FieldSpec>& fields) {
  constexpr uint64_t kSamplesLooked = 4096;
  uint64_t samples = 0, sample_bytes = 0;
  std::vector<uint64_t> field_bytes(fields.size(), 0);
  // The shards looked at open together: remote, each costs round trips.
  std::vector<size_t> first_shards;
  for (size_t s = 0; s < dataset.shard_count() && samples < kSamplesLooked; ++s) {
    first_shards.push_back(s);
    samples += dataset.manifest().shards[s].samples;
  }
  ZW_RETURN_IF_ERROR(dataset.open_shards(first_shards));
  samples = 0;
  for (size_t s = 0; s < dataset.shard_count() && samples < kSamplesLooked; ++s) {
    ZW_ASSIGN_OR_RETURN(auto shard, dataset.shard(s));
    const format::ShardIndex& index = shard->index();
    for (uint64_t i = 0; i < shard->size() && samples < kSamplesLooked; ++i, ++samples) {
      sample_bytes += index.samples[i].size;
      for (const format::FieldEntry& f : index.fields_of(i)) {
        for (size_t k = 0; k < fields.size(); ++k) {
          if (fields[k].name == index.names[f.name_id]) {
            field_bytes[k] += fields[k].decoder->row_bytes_room(f.size);
          }
        }
      }
    }
  }
  SizeEstimate estimate;
  samples = std::max<uint64_t>(1, samples);
  estimate.sample_bytes = std::max<uint64_t>(1, (sample_bytes + samples - 1) / samples);
  for (uint64_t bytes : field_bytes)
    estimate.field_bytes.push_back((bytes + samples - 1) / samples);
  return estimate;
}

// A decoder whose columns depend on the data (an Array() without a dtype) takes them from the
// first of the first samples that has the field (a few reads at most: fields are usually in
// every sample).
Status take_layout(const Dataset& dataset, const std::string& name, FieldDecoder& decoder) {
  constexpr uint64_t kSamplesLooked = 64;
  for (uint64_t i = 0; i < std::min<uint64_t>(dataset.size(), kSamplesLooked); ++i) {
    ZW_ASSIGN_OR_RETURN(const Sample sample, dataset.read(i));
    const FieldView* found = sample.view.field(name);
    if (found == nullptr) continue;
    Status taken = decoder.take_layout(found->bytes);
    if (!taken.is_ok()) {
      return taken.with_context("decode of field '" + name + "': sample " + std::to_string(i) +
                                "'s field");
    }
    return Status::ok();
  }
  return invalid_argument("decode of field '" + name + "' takes its layout (dtype and shape) "
                          "from the data, but none of the first " +
                          std::to_string(kSamplesLooked) + " samples has the field; give it in "
                          "the decode options (Array(dtype, shape))");
}

}  // namespace

struct Loader::Impl {
  std::shared_ptr<Dataset> dataset;
  LoaderOptions options;
  std::vector<FieldSpec> fields;
  std::vector<uint64_t> shard_samples;
  std::vector<uint64_t> shard_bytes;  // file sizes: kBlock cuts blocks by them
  uint64_t fingerprint = 0;
  std::unique_ptr<BlockReads> blocks;  // ShuffleMode::kBlock only
  std::shared_ptr<ArenaPool> pool;
  std::shared_ptr<LoaderCounters> counters = std::make_shared<LoaderCounters>();
  unsigned threads = 1;   // started per run
  unsigned prefetch = 1;  // current limit (autotune may raise it)
  unsigned max_prefetch = 1;
  unsigned cache_look_ahead = 0;  // batches announced to the node-local cache past the current
  std::string io;
  NumaStats numa;
  std::vector<unsigned> worker_cpus;  // empty: the threads run where the creating thread may
  uint64_t epoch = 0;
  uint64_t position = 0;  // where the next run starts
  bool closed = false;
  // A run was left to workers blocked in a read (stop_run): this Impl, which they use, is
  // never freed.
  bool abandoned = false;
  std::unique_ptr<LoaderRun> run;
  // autotune: the totals at the last adjustment
  uint64_t tuned_batches = 0;
  double tuned_wait_s = 0;
  SteadyClock::time_point tuned_at{};

  PartitionOptions partition_options() const {
    return {options.batch_size, options.rank, options.world_size, options.drop_last};
  }

  // This rank's partition of epoch `e` from position `from`. Reads only values fixed at
  // construction, so workers call it too (to plan the following epochs).
  RankPartition plan(uint64_t e, uint64_t from) const {
    auto order =
        std::make_shared<const EpochOrder>(shard_samples, options.shuffle, e, shard_bytes);
    return RankPartition(std::move(order), from, partition_options());
  }

  // Samples in epoch `e` (fewer than the dataset's when blocks are dealt to nodes).
  uint64_t epoch_size(uint64_t e) const {
    return EpochOrder::size_of(shard_samples, options.shuffle, e, shard_bytes);
  }

  // Where the consumer stands: the run knows once it exists.
  void sync_position() {
    if (run == nullptr) return;
    const LoaderRun::Position here = run->position();
    epoch = here.epoch;
    position = here.partition->position_after(here.taken);
    if (here.epoch_taken()) {
      ++epoch;  // every batch taken: the next is the next epoch's first
      position = 0;
    }
  }

  Status start_run() {
    // Later epochs are planned on a worker thread.
    LoaderRun::NextEpoch next_epoch = [this](uint64_t e) { return plan(e, 0); };
    run = std::make_unique<LoaderRun>(*dataset, options, fields, pool, counters,
                                      plan(epoch, position), epoch, std::move(next_epoch), threads,
                                      prefetch, blocks.get(), cache_look_ahead, worker_cpus);
    Status started = run->start();
    if (!started.is_ok()) run.reset();
    return started;
  }

  void stop_run() {
    sync_position();
    if (run == nullptr) return;
    // Reads end by their deadline, so the workers end within read_timeout; the watchdog's
    // margin on top. A worker still blocked then is in a read nothing can interrupt (a hung
    // file system): the run is abandoned to it rather than hanging the caller on it.
    std::string stuck;
    if (!run->stop(options.read_timeout + std::chrono::seconds(5), &stuck)) {
      internal::note_fallback(
          "loader_abandoned",
          "closing the loader left worker threads blocked in reads that ignore their deadline (" +
              stuck + "); they are left behind with the memory they use, and nothing waits for "
              "them");
      (void)run.release();
      abandoned = true;
    }
    run.reset();
  }

  // Every 32 batches: if the consumer waited more than 1 % of the time, use one more thread
  // (up to the started count is fixed; first raise the active threads, then prefetch).
  void autotune() {
    LoaderStats totals;
    {
      std::lock_guard<std::mutex> lock(counters->mutex);
      totals = counters->totals;
    }
    if (totals.batches < tuned_batches + 32) return;
    const auto now = SteadyClock::now();
    const double window = seconds(now - tuned_at);
    const double waited = totals.wait_s - tuned_wait_s;
    tuned_batches = totals.batches;
    tuned_wait_s = totals.wait_s;
    tuned_at = now;
    if (window <= 0 || waited / window < 0.01) return;
    unsigned active = run->active_threads();
    unsigned ahead = run->prefetch();
    if (active < threads) {
      ++active;
    } else if (ahead < max_prefetch) {
      ++ahead;
    } else {
      return;
    }
    run->set_limits(active, std::max(ahead, active));
  }
};

Loader::Loader() : impl_(std::make_unique<Impl>()) {}

Loader::~Loader() {
  close();
  if (impl_ != nullptr && impl_->abandoned) (void)impl_.release();
}

Result<std::unique_ptr<Loader>> Loader::create(std::shared_ptr<Dataset> dataset,
                                               LoaderOptions options) {
  if (dataset == nullptr) return invalid_argument("Loader needs a dataset");
  ZW_RETURN_IF_ERROR(options.validate());
  std::unique_ptr<Loader> loader(new Loader());
  Impl& impl = *loader->impl_;

  // Fields: the asked ones, or the dataset's schema; decode entries must name delivered fields.
  std::vector<std::unique_ptr<FieldDecoder>> decoders;  // of `names`, laid out below
  std::vector<std::string> names = options.fields.empty() ? dataset->fields() : options.fields;
  for (const auto& [name, decode] : options.decode) {
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      return invalid_argument("decode names field '" + name +
                              "', which is not among the delivered fields");
    }
  }
  for (const std::string& name : names) {
    if (name.empty() || name.starts_with("__")) {
      return invalid_argument("field name '" + name + "' is reserved");
    }
    auto it = options.decode.find(name);
    const FieldDecode spec = it == options.decode.end() ? FieldDecode{} : it->second;
    ZW_ASSIGN_OR_RETURN(std::unique_ptr<FieldDecoder> decoder, make_field_decoder(spec));
    decoders.push_back(std::move(decoder));
  }

  // NUMA placement first: an explicit node that does not exist is an error before any work.
  ZW_ASSIGN_OR_RETURN(const NumaPlacement placement,
                      choose_numa_placement(options.numa, internal::allowed_cpus()));
  impl.numa.requested = options.numa.kind;
  impl.numa.requested_node = options.numa.node;
  impl.numa.node = placement.node;
  impl.numa.cpus = internal::format_cpu_list(placement.cpus);
  impl.numa.reason = placement.reason;
  impl.worker_cpus = placement.cpus;
  if (placement.node) {
    // Binding memory is refused where the kernel has no NUMA support or a seccomp filter
    // forbids mbind (containers without CAP_SYS_NICE): the threads are still placed, which
    // places what they allocate (the kernel's default policy allocates locally), and the
    // fallback is said once and reported in stats.
    const Status bindable = internal::check_memory_binding(*placement.node);
    impl.numa.memory_bound = bindable.is_ok();
    if (!bindable.is_ok()) {
      impl.numa.reason += "; memory not bound: " + bindable.message();
      internal::note_fallback("numa_memory", "NUMA node " + std::to_string(*placement.node) +
                                                 ": loader threads placed, memory not bound (" +
                                                 bindable.message() + ")");
    }
  }
  const int memory_node = impl.numa.memory_bound ? *placement.node : -1;

  for (size_t f = 0; f < names.size(); ++f) {
    if (decoders[f]->needs_first_sample()) {
      ZW_RETURN_IF_ERROR(take_layout(*dataset, names[f], *decoders[f]));
    }
    FieldLayout layout = decoders[f]->layout();
    impl.fields.push_back({names[f], std::move(decoders[f]), std::move(layout)});
  }

  for (size_t s = 0; s < dataset->shard_count(); ++s) {
    const auto& shards = dataset->manifest().shards;
    if (s < shards.size()) {
      impl.shard_samples.push_back(shards[s].samples);
      impl.shard_bytes.push_back(shards[s].bytes);
    } else {
      ZW_ASSIGN_OR_RETURN(auto reader, dataset->shard(s));
      impl.shard_samples.push_back(reader->size());
      impl.shard_bytes.push_back(reader->source().size());
    }
  }
  impl.fingerprint = dataset_fingerprint(*dataset, impl.shard_samples);

  // Size the arena pool from the budget: one arena per worker, `prefetch` ready ones and two
  // with the consumer (the batch in use and the one being replaced) is the ideal.
  // Threads placed on a node count that node's CPUs.
  const unsigned hardware =
      placement.node ? static_cast<unsigned>(placement.cpus.size())
                     : std::max(1u, std::thread::hardware_concurrency());
  // By default one core is left to the training loop's own thread: measured on 2 cores, a
  // consumer that computes 1.5x the loader's per-batch time kept its core 98 % busy with one
  // worker, 94-96 % with two (bench/run loader, row f).
  unsigned threads = options.threads == 0 ? std::max(1u, hardware - 1) : options.threads;
  ZW_ASSIGN_OR_RETURN(const SizeEstimate sizes, estimate_sizes(*dataset, impl.fields));
  // Batch bytes vary around batch_size x the average sample; a quarter more covers that for
  // all but unusual batches, which grow their arena (within the per-arena limit) when they come.
  const uint64_t slack_rows = options.batch_size + options.batch_size / 4;
  std::vector<uint64_t> raw_estimate;
  for (uint64_t field_bytes : sizes.field_bytes) raw_estimate.push_back(slack_rows * field_bytes);
  // kBlock: every builder reads whole blocks through one shared window. It keeps the window
  // being consumed and the blocks of every batch the workers may build ahead (prefetch reaches
  // into the next window), so no block is read twice in an epoch.
  const bool block_reads = options.shuffle.mode == ShuffleMode::kBlock;
  if (block_reads) {
    const uint64_t ahead_bytes = uint64_t{threads + options.prefetch + 2} * slack_rows *
                                 sizes.sample_bytes;
    const uint64_t budget = std::max(2 * options.shuffle.window_bytes,
                                     options.shuffle.window_bytes + ahead_bytes);
    impl.blocks = std::make_unique<BlockReads>();
    impl.blocks->window = std::make_shared<BlockWindow>(budget, memory_node, impl.worker_cpus);
    for (size_t s = 0; s < impl.shard_samples.size(); ++s) {
      impl.blocks->samples_per_block.push_back(
          samples_per_block(impl.shard_samples[s], impl.shard_bytes[s], options.shuffle));
    }
  }
  // With a node-local cache, its downloads run this far ahead of the batch being built: two
  // windows of the block order, at least 256 MiB (at tens of milliseconds a request, that keeps
  // its downloaders busy), but at most a quarter of the cache (announced blocks must not evict
  // each other), between 1 and 64 batches.
  if (dataset->cache() != nullptr) {
    const uint64_t ahead_bytes = std::min<uint64_t>(
        std::max<uint64_t>(256ull << 20, block_reads ? 2 * options.shuffle.window_bytes : 0),
        dataset->cache()->options().capacity_bytes / 4);
    const uint64_t batch_bytes = std::max<uint64_t>(1, options.batch_size * sizes.sample_bytes);
    impl.cache_look_ahead =
        static_cast<unsigned>(std::clamp<uint64_t>(ahead_bytes / batch_bytes, 1, 64));
  }
  // Whole-block reads land in the window, not in the arenas.
  const uint64_t read_estimate =
      block_reads ? 0
                  : slack_rows * sizes.sample_bytes + (options.io == IoBackend::kDirect ? 8 << 20 : 0);
  const uint64_t out_estimate = batch_out_bytes(impl.fields, slack_rows, raw_estimate);
  const uint64_t per_arena = read_estimate + out_estimate;
  const bool automatic_budget = options.memory_budget == 0;
  if (automatic_budget) {
    // Twice the estimate per arena: a batch of unusually large samples grows its arena instead
    // of failing. Only the estimate is touched below; the rest is reserved, not resident.
    options.memory_budget = internal::automatic_memory_budget(
        2 * per_arena, uint64_t{threads} + options.prefetch + 2, memory_headroom_bytes(),
        internal::local_process_count());
  }
  const uint64_t fit = options.memory_budget / per_arena;
  if (fit < 2) {
    return Status(ErrorCode::kResourceExhausted,
                  "memory_budget of " + std::to_string(options.memory_budget >> 20) +
                      " MiB" + (automatic_budget ? " (chosen from the memory available)" : "") +
                      " holds fewer than 2 batches of about " + std::to_string(per_arena >> 20) +
                      " MiB each: " + (automatic_budget ? "free memory, set" : "raise") +
                      " memory_budget or lower batch_size");
  }
  // A sized budget holds half as many arenas as estimates: each has room to grow to twice its own.
  const uint64_t arenas_fit = automatic_budget ? std::max<uint64_t>(2, fit / 2) : fit;
  const unsigned wanted_prefetch = options.autotune ? 64u : options.prefetch;
  const auto arenas =
      static_cast<unsigned>(std::min<uint64_t>(arenas_fit, threads + wanted_prefetch + 2));
  impl.max_prefetch = std::max(1u, arenas - 2);
  impl.prefetch = std::min(options.prefetch, impl.max_prefetch);
  threads = std::min(threads, impl.max_prefetch);
  impl.threads = threads;
  if (options.autotune) {
    // Start small; autotune adds threads, then prefetch, while the consumer waits.
    impl.prefetch = std::min(impl.prefetch, std::max(1u, threads));
  }
  const bool pin = options.pin_memory && internal::host_memory_pinning_available();
  impl.pool = std::make_shared<ArenaPool>(arenas, options.memory_budget / arenas, pin,
                                          options.poison_released_arenas);
  if (memory_node >= 0) ZW_RETURN_IF_ERROR(impl.pool->bind_to_node(memory_node));
  // Touch the arenas now: first-touch page faults (~0.3 GB/s here) belong to start-up, not to
  // the first batches of training (and, bound to a node, they are allocated there).
  ZW_RETURN_IF_ERROR(impl.pool->prefault(read_estimate, out_estimate));
  impl.io = io_backend_name(options.io);
  impl.epoch = options.epoch;
  impl.dataset = std::move(dataset);
  impl.options = std::move(options);
  return loader;
}

uint64_t Loader::epoch() const {
  impl_->sync_position();
  return impl_->epoch;
}
const LoaderOptions& Loader::options() const { return impl_->options; }
const Dataset& Loader::dataset() const { return *impl_->dataset; }

uint64_t Loader::remaining_batches() const {
  if (impl_->run != nullptr) {
    const LoaderRun::Position here = impl_->run->position();
    return here.partition->batch_count() - std::min(here.taken, here.partition->batch_count());
  }
  return RankPartition::count_batches(impl_->epoch_size(impl_->epoch), impl_->position,
                                      impl_->partition_options());
}

// Counted, not planned: a training loop asks len(loader) every epoch, and planning an epoch of
// millions of samples on its thread would stall it.
uint64_t Loader::batches_per_epoch() const {
  impl_->sync_position();
  return RankPartition::count_batches(impl_->epoch_size(impl_->epoch), 0,
                                      impl_->partition_options());
}

Result<std::shared_ptr<Batch>> Loader::next(Deadline deadline) {
  Impl& impl = *impl_;
  if (impl.closed) return Status(ErrorCode::kCancelled, "the loader is closed");
  if (impl.run == nullptr) ZW_RETURN_IF_ERROR(impl.start_run());
  Result<std::shared_ptr<Batch>> batch = impl.run->next(deadline);
  if (batch.is_ok() && batch.value() == nullptr) {
    // End of the epoch. The run goes on: the next epoch's first batches are being prepared.
    impl.run->finish_epoch();
    return batch;
  }
  if (impl.options.autotune) impl.autotune();
  return batch;
}

void Loader::set_epoch(uint64_t epoch) {
  Impl& impl = *impl_;
  impl.sync_position();
  if (epoch == impl.epoch) {
    // Already there: keep the position (a resumed loader stays resumed when a training loop
    // calls set_epoch at the top of every epoch). Only drop a pending end-of-epoch.
    if (impl.run != nullptr && impl.run->position().epoch_taken()) impl.run->finish_epoch();
    return;
  }
  impl.run.reset();
  impl.epoch = epoch;
  impl.position = 0;
}

LoaderState Loader::state() const {
  Impl& impl = *impl_;
  impl.sync_position();
  LoaderState state;
  state.epoch = impl.epoch;
  state.position = impl.position;
  state.seed = impl.options.shuffle.seed;
  state.shuffle = impl.options.shuffle.mode;
  state.block_samples = impl.options.shuffle.block_samples;
  state.window_blocks = impl.options.shuffle.window_blocks;
  state.block_bytes = impl.options.shuffle.block_bytes;
  state.window_bytes = impl.options.shuffle.window_bytes;
  state.nodes = impl.options.shuffle.nodes;
  state.redeal_every = impl.options.shuffle.redeal_every;
  state.dataset_samples = impl.dataset->size();
  state.dataset_fingerprint = impl.fingerprint;
  state.batch_size = impl.options.batch_size;
  state.world_size = impl.options.world_size;
  return state;
}

Status Loader::load_state(const LoaderState& state) {
  Impl& impl = *impl_;
  auto differs = [](const std::string& what, const std::string& saved, const std::string& now) {
    return invalid_argument("cannot resume: the saved state has " + what + " " + saved +
                            " but this loader has " + now + " (the sample order would differ)");
  };
  const ShuffleOptions& shuffle = impl.options.shuffle;
  if (state.dataset_samples != impl.dataset->size() ||
      state.dataset_fingerprint != impl.fingerprint) {
    return differs("a dataset of", std::to_string(state.dataset_samples) + " samples",
                   "a different dataset of " + std::to_string(impl.dataset->size()) + " samples");
  }
  if (state.seed != shuffle.seed) {
    return differs("seed", std::to_string(state.seed), std::to_string(shuffle.seed));
  }
  // What shapes the order in each mode: quasi's blocks of samples, block's blocks of bytes.
  auto sizes = [](ShuffleMode mode, uint64_t block_samples, uint64_t window_blocks,
                  uint64_t block_bytes, uint64_t window_bytes, uint32_t nodes,
                  uint64_t redeal_every) {
    std::string name = shuffle_mode_name(mode);
    if (mode == ShuffleMode::kQuasiRandom) {
      name += " (block " + std::to_string(block_samples) + " samples, window " +
              std::to_string(window_blocks) + " blocks)";
    } else if (mode == ShuffleMode::kBlock) {
      name += " (block " + std::to_string(block_bytes) + " bytes, window " +
              std::to_string(window_bytes) + " bytes";
      if (nodes > 1) {
        name += ", dealt to " + std::to_string(nodes) + " nodes every " +
                std::to_string(redeal_every) + " epochs";
      }
      name += ")";
    }
    return name;
  };
  const std::string saved =
      sizes(state.shuffle, state.block_samples, state.window_blocks, state.block_bytes,
            state.window_bytes, state.nodes, state.redeal_every);
  const std::string now = sizes(shuffle.mode, shuffle.block_samples, shuffle.window_blocks,
                                shuffle.block_bytes, shuffle.window_bytes, shuffle.nodes,
                                shuffle.redeal_every);
  if (saved != now) return differs("shuffle", saved, now);
  const uint64_t epoch_samples = impl.epoch_size(state.epoch);
  if (state.position > epoch_samples) {
    return invalid_argument("cannot resume: position " + std::to_string(state.position) +
                            " is past the epoch's " + std::to_string(epoch_samples) +
                            " samples");
  }
  impl.run.reset();
  impl.epoch = state.epoch;
  impl.position = state.position;
  return Status::ok();
}

double Loader::wait_seconds() const {
  std::lock_guard<std::mutex> lock(impl_->counters->mutex);
  return impl_->counters->totals.wait_s;
}

LoaderStats Loader::stats() const {
  const Impl& impl = *impl_;
  LoaderStats stats;
  {
    std::lock_guard<std::mutex> lock(impl.counters->mutex);
    stats = impl.counters->totals;
    stats.recent.assign(impl.counters->recent.begin(), impl.counters->recent.end());
    if (impl.counters->started != SteadyClock::time_point{}) {
      stats.elapsed_s = seconds(SteadyClock::now() - impl.counters->started);
    }
  }
  stats.threads = impl.run != nullptr ? impl.run->active_threads() : impl.threads;
  stats.prefetch = impl.run != nullptr ? impl.run->prefetch() : impl.prefetch;
  stats.arenas = impl.pool->size();
  {
    std::lock_guard<std::mutex> lock(impl.pool->mutex());
    stats.arenas_free = impl.pool->free_count_locked();
  }
  stats.arena_bytes = impl.pool->bytes();
  stats.memory_budget = impl.options.memory_budget;
  stats.io = impl.io;
  stats.pinned = impl.pool->pin();
  // Every I/O fallback the backends note (byte_source.cpp, read_engine.cpp, direct_source.cpp).
  stats.io_fallbacks = internal::fallback_count("io_uring") +
                       internal::fallback_count("io_uring_thread") +
                       internal::fallback_count("direct");
  if (impl.dataset->cache() != nullptr) stats.cache = impl.dataset->cache()->stats();
  stats.numa = impl.numa;
  return stats;
}

void Loader::close() {
  if (impl_ == nullptr) return;
  impl_->stop_run();
  impl_->closed = true;
}

}  // namespace zerowait
