// Loader::create: the fields and their decoders, NUMA placement, and the arena pool sized from the
// memory budget and the dataset's sample sizes.
#include <algorithm>
#include <thread>

#include "host/memory_headroom.hpp"
#include "host/numa.hpp"
#include "common/random.hpp"
#include "host/cuda_runtime.hpp"
#include "loader/loader_impl.hpp"
#include "loader/memory_budget.hpp"

namespace zerowait {

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

// `also_open`: shards opened in the same round as those looked at.
Result<SizeEstimate> estimate_sizes(const Dataset& dataset, const std::vector<FieldSpec>& fields,
                                    std::vector<size_t> also_open) {
  constexpr uint64_t kSamplesLooked = 4096;
  uint64_t samples = 0, sample_bytes = 0;
  std::vector<uint64_t> field_bytes(fields.size(), 0);
  // The shards looked at open together: remote, each costs round trips.
  std::vector<size_t> opened = std::move(also_open);
  for (size_t s = 0; s < dataset.shard_count() && samples < kSamplesLooked; ++s) {
    opened.push_back(s);
    samples += dataset.manifest().shards[s].samples;
  }
  std::sort(opened.begin(), opened.end());
  opened.erase(std::unique(opened.begin(), opened.end()), opened.end());
  ZW_RETURN_IF_ERROR(dataset.open_shards(opened));
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

// The shards the first `batches` batches of `partition` read.
std::vector<size_t> shards_of_first_batches(const Dataset& dataset,
                                            const RankPartition& partition, uint64_t batches) {
  std::vector<size_t> shards;
  std::vector<uint64_t> indices;
  for (uint64_t b = 0; b < std::min(batches, partition.batch_count()); ++b) {
    partition.batch(b, &indices);
    for (uint64_t global : indices) {
      Result<SampleLocation> where = dataset.locate(global);
      if (where.is_ok()) shards.push_back(where->shard);
    }
  }
  return shards;
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
  return invalid_argument("decode of field '" + name +
                          "' takes its layout (dtype and shape) "
                          "from the data, but none of the first " +
                          std::to_string(kSamplesLooked) +
                          " samples has the field; give it in "
                          "the decode options (Array(dtype, shape))");
}

}  // namespace

Result<std::shared_ptr<Dataset>> open_loader_dataset(const std::string& path,
                                                     const LoaderOptions& options,
                                                     std::shared_ptr<BlockCache> cache) {
  DatasetOptions dataset_options;
  dataset_options.backend = options.io;
  dataset_options.cache = std::move(cache);
  return Dataset::open(path, std::move(dataset_options));
}

Result<std::unique_ptr<Loader>> Loader::open(const std::string& path, LoaderOptions options,
                                             std::shared_ptr<BlockCache> cache) {
  const auto opening = std::make_shared<internal::FallbackTally>();
  std::shared_ptr<Dataset> dataset;
  {
    internal::FallbackScope scope(opening);
    ZW_ASSIGN_OR_RETURN(dataset, open_loader_dataset(path, options, std::move(cache)));
  }
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<Loader> loader,
                      create(std::move(dataset), std::move(options)));
  loader->impl_->fallbacks->add_all(*opening);
  return loader;
}

Result<std::unique_ptr<Loader>> Loader::create(std::shared_ptr<Dataset> dataset,
                                               LoaderOptions options) {
  if (dataset == nullptr) return invalid_argument("Loader needs a dataset");
  ZW_RETURN_IF_ERROR(options.validate());
  // A loader that reports one backend while its shards are read with another is what made
  // `bench files` compare the Loader's pread against a training run's io_uring.
  if (dataset->backend() != options.io) {
    return invalid_argument(std::string("the loader reads with io '") +
                            io_backend_name(options.io) + "' but " + dataset->path() +
                            " was opened with '" + io_backend_name(dataset->backend()) +
                            "': open it with open_loader_dataset (or DatasetOptions::backend)");
  }
  std::unique_ptr<Loader> loader(new Loader());
  Impl& impl = *loader->impl_;
  // Shards opened from here on (the first ones now, on helper threads) count their fallbacks here.
  internal::FallbackScope fallback_scope(impl.fallbacks);

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
  const unsigned hardware = placement.node ? static_cast<unsigned>(placement.cpus.size())
                                           : std::max(1u, std::thread::hardware_concurrency());
  // By default one core is left to the training loop's own thread: measured on 2 cores, a
  // consumer that computes 1.5x the loader's per-batch time kept its core 98 % busy with one
  // worker, 94-96 % with two (bench/run loader, row f).
  unsigned threads = options.threads == 0 ? std::max(1u, hardware - 1) : options.threads;
  // A remote shard costs a round trip to open: those the workers' first batches read open now,
  // with the ones the estimate looks at, rather than in the first claims, a round trip later
  // (docs/remote.md, "The first batch"). The first run takes the order made for it here.
  std::vector<size_t> first_batch_shards;
  if (dataset->cache() != nullptr) {
    impl.first_order = std::make_shared<const EpochOrder>(impl.shard_samples, options.shuffle,
                                                          options.epoch, impl.shard_bytes);
    impl.first_order_epoch = options.epoch;
    const RankPartition first(impl.first_order, 0, partition_options_of(options));
    first_batch_shards = shards_of_first_batches(*dataset, first, threads);
  }
  ZW_ASSIGN_OR_RETURN(const SizeEstimate sizes,
                      estimate_sizes(*dataset, impl.fields, std::move(first_batch_shards)));
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
    const uint64_t ahead_bytes =
        uint64_t{threads + options.prefetch + 2} * slack_rows * sizes.sample_bytes;
    const uint64_t budget =
        std::max(2 * options.shuffle.window_bytes, options.shuffle.window_bytes + ahead_bytes);
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
  const uint64_t read_estimate = block_reads ? 0
                                             : slack_rows * sizes.sample_bytes +
                                                   (options.io == IoBackend::kDirect ? 8 << 20 : 0);
  const uint64_t out_estimate = batch_out_bytes(impl.fields, slack_rows, raw_estimate);
  const uint64_t per_arena = read_estimate + out_estimate;
  const bool automatic_budget = options.memory_budget == 0;
  if (automatic_budget) {
    // Twice the estimate per arena: a batch of unusually large samples grows its arena instead
    // of failing. Only the estimate is touched below; the rest is reserved, not resident.
    options.memory_budget =
        internal::automatic_memory_budget(2 * per_arena, uint64_t{threads} + options.prefetch + 2,
                                          memory_headroom_bytes(), internal::local_process_count());
  }
  const uint64_t fit = options.memory_budget / per_arena;
  if (fit < 2) {
    return Status(ErrorCode::kResourceExhausted,
                  "memory_budget of " + std::to_string(options.memory_budget >> 20) + " MiB" +
                      (automatic_budget ? " (chosen from the memory available)" : "") +
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
  // The arenas are touched to these sizes when the first run starts (Impl::start_run).
  impl.arena_read_estimate = read_estimate;
  impl.arena_out_estimate = out_estimate;
  impl.epoch = options.epoch;
  impl.dataset = std::move(dataset);
  impl.options = std::move(options);
  return loader;
}

}  // namespace zerowait
