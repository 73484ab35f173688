#include "zerowait/loader/loader.hpp"

#include <algorithm>
#include <mutex>

#include "loader/loader_impl.hpp"

namespace zerowait {

using internal::seconds;
using SteadyClock = std::chrono::steady_clock;

// The Loader's public methods; Loader::create (fields, decoders, NUMA placement, the arena pool)
// is in loader_create.cpp, the state both share in loader_impl.hpp.

namespace {

// The backend the shards are read with: `asked`, unless it fell back. io_uring falls back to
// pread where the kernel refuses it (each shard opened counts); O_DIRECT to reading through the
// page cache where the file system refuses it (each shard counts "direct"). A thread that cannot
// set up its own ring reads that batch with pread: counted, the backend stays io_uring.
std::string io_in_use(IoBackend asked, const internal::FallbackTally& fallbacks) {
  const char* buffered = io_uring_available() ? "io_uring" : "pread";
  if (asked == IoBackend::kIoUring) return buffered;
  if (asked == IoBackend::kDirect && fallbacks.count("direct") > 0) return buffered;
  return io_backend_name(asked);
}

}  // namespace

Result<CorruptPolicy> parse_corrupt_policy(const std::string& name) {
  if (name == "raise") return CorruptPolicy::kRaise;
  if (name == "skip") return CorruptPolicy::kSkip;
  return invalid_argument("unknown on_corrupt policy '" + name + "' (expected raise or skip)");
}

Status LoaderOptions::validate() const {
  ZW_RETURN_IF_ERROR(shuffle.validate());
  ZW_RETURN_IF_ERROR(partition_options_of(*this).validate());
  if (prefetch == 0) return invalid_argument("prefetch must be at least 1");
  if (read_timeout.count() <= 0) return invalid_argument("read_timeout must be positive");
  for (const auto& [name, spec] : decode) {
    Result<std::unique_ptr<FieldDecoder>> decoder = make_field_decoder(spec);
    if (!decoder) return decoder.status().with_context("decode of field '" + name + "'");
  }
  return Status::ok();
}

Loader::Loader() : impl_(std::make_unique<Impl>()) {}

Loader::~Loader() {
  close();
  if (impl_ != nullptr && impl_->abandoned) (void)impl_.release();
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
  stats.io = io_in_use(impl.options.io, *impl.fallbacks);
  stats.pinned = impl.pool->pin();
  // The I/O fallbacks the backends noted for this loader (byte_source.cpp, read_engine.cpp,
  // direct_source.cpp), not for every loader in the process.
  stats.io_fallbacks = impl.fallbacks->count("io_uring") +
                       impl.fallbacks->count("io_uring_thread") + impl.fallbacks->count("direct");
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
