// The worker threads of a Loader and the in-order hand-over of their batches. Internal: loader.cpp
// owns one LoaderRun at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.hpp"
#include "loader/arena_pool.hpp"
#include "loader/batch.hpp"
#include "loader/batch_builder.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/loader/sample_plan.hpp"

namespace zerowait {

// Counters that outlive a run (stats() reports the loader's whole life).
struct LoaderCounters {
  mutable std::mutex mutex;
  LoaderStats totals;
  std::deque<StepStats> recent;
  std::chrono::steady_clock::time_point started{};
};

// The worker threads of one continuous pass: the rest of the current epoch, then the following
// epochs, each a segment of consecutive batch sequence numbers. Workers claim sequence numbers
// in order, at most `prefetch` ahead of the consumer, each needing a free arena, so the first
// batches of the next epoch are prepared while the current one ends. Finished batches wait in
// `ready_` until the consumer takes them in order.
//
// Thread-safety: next(), position(), finish_epoch() and set_limits() are called by one consumer
// thread at a time; the workers are internal. Everything shared is guarded by the pool's mutex.
// Lifetime: `dataset`, `options`, `fields` and `blocks` must outlive the run; destruction stops
// and joins the workers, and batches already handed out stay valid (they hold the pool).
class LoaderRun {
 public:
  using SteadyClock = std::chrono::steady_clock;
  static constexpr size_t kRecentSteps = 1024;

  // Makes the partition of a whole epoch; called by a worker when it reaches the end of the
  // last segment (without the lock: computing a large permutation takes a while).
  using NextEpoch = std::function<RankPartition(uint64_t epoch)>;

  LoaderRun(const Dataset& dataset, const LoaderOptions& options,
            const std::vector<FieldSpec>& fields, std::shared_ptr<ArenaPool> pool,
            std::shared_ptr<LoaderCounters> counters, RankPartition first, uint64_t epoch,
            NextEpoch next_epoch, unsigned threads, unsigned prefetch,
            const BlockReads* blocks = nullptr, unsigned cache_look_ahead = 0,
            std::vector<unsigned> worker_cpus = {});
  ~LoaderRun();  // stops the workers, waiting for each (see stop() for when not to)

  // Starts the worker threads, named "zw-loader-<n>", each on `worker_cpus` (empty: the
  // caller's CPUs) before it does any work. Once, before anything else. Errors: start_thread's
  // (thread_pool.hpp); the workers started before the failure are stopped with the run.
  Status start();
  LoaderRun(const LoaderRun&) = delete;
  LoaderRun& operator=(const LoaderRun&) = delete;

  // Where the consumer stands: its epoch, that epoch's partition, and how many of its batches
  // were taken. Workers only append segments, so the front one stays put.
  struct Position {
    uint64_t epoch = 0;
    const RankPartition* partition = nullptr;
    uint64_t taken = 0;
    bool epoch_taken() const { return taken >= partition->batch_count(); }
  };
  Position position() const;

  // Moves the consumer to the next epoch; only once position().epoch_taken().
  void finish_epoch();

  // The next batch in order, or nullptr once the consumer's epoch is taken. Errors as
  // Loader::next() describes them: a corrupt sample's error comes before its batch (one call
  // each), a read error replaces its batch, kResourceExhausted and kDeadlineExceeded lose nothing.
  Result<std::shared_ptr<Batch>> next(Deadline deadline);

  // Stops the workers and waits up to `grace` for them. True when all ended. False when one is
  // still blocked in a read that ignores its deadline (a pread on a hung file system): then all
  // are detached, this object must never be destroyed (the caller leaks it, with everything it
  // refers to: a read that comes back would touch freed memory), and what they are blocked on is
  // in `*stuck`.
  bool stop(std::chrono::nanoseconds grace, std::string* stuck);

  void set_limits(unsigned threads, unsigned prefetch);
  unsigned active_threads() const { return active_threads_; }
  unsigned prefetch() const { return prefetch_; }

 private:
  struct Segment {
    uint64_t epoch = 0;
    RankPartition partition;
    uint64_t first = 0;  // sequence number of its first batch
    uint64_t end() const { return first + partition.batch_count(); }
  };

  struct Finished {
    Status status;
    std::unique_ptr<Batch::Impl> batch;  // becomes a Batch when handed to the consumer
    BuildStats stats;
    size_t corrupt_raised = 0;  // of stats.corrupt, how many next() has returned
    uint64_t samples = 0;
    uint64_t padded = 0;
  };

  Position position_locked() const;
  void extend_locked(std::unique_lock<std::mutex>& lock);
  const Segment& segment_of(uint64_t seq) const;
  void work(unsigned thread);
  Status fill(BatchBuilder& builder, const std::vector<uint64_t>& indices, Batch::Impl* batch,
              BuildStats* stats, unsigned thread);
  // Hints the samples' byte ranges to their shards' sources (ByteSource::prefetch), neighbours
  // joined.
  void announce_reads(const std::vector<uint64_t>& indices) const;
  std::string stuck_report();
  void record_step(const Finished& done, uint64_t epoch, uint64_t number,
                   std::chrono::nanoseconds wait, uint32_t ready_after);

  const Dataset& dataset_;
  const LoaderOptions& options_;
  const std::vector<FieldSpec>& fields_;
  std::shared_ptr<ArenaPool> pool_;
  std::shared_ptr<LoaderCounters> counters_;
  NextEpoch next_epoch_;
  const BlockReads* blocks_;  // whole-block reads (ShuffleMode::kBlock); null otherwise
  // With a node-local cache, the batches past the one being built whose reads are announced to
  // it (ByteSource::prefetch), so its downloads run that far ahead.
  const unsigned cache_look_ahead_;
  const unsigned max_threads_;
  const std::vector<unsigned> worker_cpus_;
  // Guarded by pool_->mutex(); segments_.front() is also read by the consumer thread alone,
  // which is the only one that pops it.
  std::deque<Segment> segments_;
  bool extending_ = false;
  bool no_more_epochs_ = false;
  unsigned active_threads_;
  unsigned prefetch_;
  bool stopping_ = false;
  unsigned running_workers_ = 0;  // their work() has not returned
  uint64_t claimed_ = 0;    // sequence numbers handed to workers
  // Sequence numbers below announced_ were taken by a worker to announce to the cache; those
  // below hinted_ have been (a worker announces the batches ahead only after building its own).
  uint64_t announced_ = 0;
  uint64_t hinted_ = 0;
  uint64_t delivered_ = 0;  // sequence numbers handed to the consumer
  uint64_t building_ = 0;
  uint64_t finished_ = 0;
  std::map<uint64_t, Finished> ready_;

  std::mutex in_flight_mutex_;
  std::vector<ReadInFlight> in_flight_;
  std::vector<std::thread> workers_;
};

}  // namespace zerowait
