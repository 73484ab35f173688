// The state of a Loader (zerowait/loader/loader.hpp), shared by Loader::create
// (loader_create.cpp) and the Loader's other methods (loader.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.hpp"
#include "common/log.hpp"
#include "loader/arena_pool.hpp"
#include "loader/batch_builder.hpp"
#include "loader/loader_run.hpp"
#include "zerowait/loader/loader.hpp"

namespace zerowait {

// How a loader's options deal batches to ranks.
inline PartitionOptions partition_options_of(const LoaderOptions& options) {
  return {options.batch_size, options.rank, options.world_size, options.drop_last};
}

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
  // The fallbacks met by this loader's threads, Loader::create's and the workers' (stats()).
  std::shared_ptr<internal::FallbackTally> fallbacks = std::make_shared<internal::FallbackTally>();
  NumaStats numa;
  std::vector<unsigned> worker_cpus;  // empty: the threads run where the creating thread may
  // A batch's estimated sizes, to which start_run() has the arenas touched (the first time).
  uint64_t arena_read_estimate = 0;
  uint64_t arena_out_estimate = 0;
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
  std::chrono::steady_clock::time_point tuned_at{};

  PartitionOptions partition_options() const { return partition_options_of(options); }

  // This rank's partition of epoch `e` from position `from`. Reads only values fixed at
  // construction, so workers call it too (to plan the following epochs).
  RankPartition plan(uint64_t e, uint64_t from) const {
    return RankPartition(order_of(e), from, partition_options());
  }

  std::shared_ptr<const EpochOrder> order_of(uint64_t e) const {
    return std::make_shared<const EpochOrder>(shard_samples, options.shuffle, e, shard_bytes);
  }

  // The order of epoch `first_order_epoch`, made by create() to open the first batches' shards
  // early (a remote dataset's); the first run takes it rather than making it again.
  std::shared_ptr<const EpochOrder> first_order;
  uint64_t first_order_epoch = 0;

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
    // First-touch page faults (~0.3 GB/s here) belong to start-up, not to the batches of
    // training (and, bound to a node, they are allocated there). They happen beside the first
    // claims, not before Loader() returns: a remote dataset's first batch waits a round trip for
    // its bytes meanwhile (docs/remote.md, "The first batch: what it waited for"). Only the
    // first run's call starts the pool's thread.
    ZW_RETURN_IF_ERROR(pool->start_prefault(arena_read_estimate, arena_out_estimate, worker_cpus));
    // Later epochs are planned on a worker thread.
    LoaderRun::NextEpoch next_epoch = [this](uint64_t e) { return plan(e, 0); };
    std::shared_ptr<const EpochOrder> order = std::move(first_order);
    if (order == nullptr || first_order_epoch != epoch) order = order_of(epoch);
    run = std::make_unique<LoaderRun>(
        *dataset, options, fields, pool, counters,
        RankPartition(std::move(order), position, partition_options()), epoch,
        std::move(next_epoch), threads, prefetch, blocks.get(), cache_look_ahead, worker_cpus);
    internal::FallbackScope scope(fallbacks);  // the workers inherit it
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
              stuck +
              "); they are left behind with the memory they use, and nothing waits for "
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
    const auto now = std::chrono::steady_clock::now();
    const double window = internal::seconds(now - tuned_at);
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

}  // namespace zerowait
