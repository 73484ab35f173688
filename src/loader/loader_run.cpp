#include "loader/loader_run.hpp"

#include <algorithm>
#include <memory>
#include <tuple>
#include <vector>

#include "common/thread_pool.hpp"
#include "host/thread_placement.hpp"
#include "host/thread_priority.hpp"
#include "storage/cache/cache_trace.hpp"

namespace zerowait {

LoaderRun::LoaderRun(const Dataset& dataset, const LoaderOptions& options,
                     const std::vector<FieldSpec>& fields, std::shared_ptr<ArenaPool> pool,
                     std::shared_ptr<LoaderCounters> counters, RankPartition first, uint64_t epoch,
                     NextEpoch next_epoch, unsigned threads, unsigned prefetch,
                     const BlockReads* blocks, unsigned cache_look_ahead,
                     std::vector<unsigned> worker_cpus)
    : dataset_(dataset),
      options_(options),
      fields_(fields),
      pool_(std::move(pool)),
      counters_(std::move(counters)),
      next_epoch_(std::move(next_epoch)),
      blocks_(blocks),
      cache_look_ahead_(cache_look_ahead),
      max_threads_(threads),
      worker_cpus_(std::move(worker_cpus)),
      active_threads_(threads),
      prefetch_(prefetch),
      in_flight_(threads) {
  segments_.push_back({epoch, std::move(first), 0});
}

Status LoaderRun::start() {
  for (unsigned t = 0; t < max_threads_; ++t) {
    {
      std::lock_guard<std::mutex> lock(pool_->mutex());
      ++running_workers_;
    }
    const internal::ThreadPlacement placement{"zw-loader-" + std::to_string(t), worker_cpus_};
    Result<std::thread> worker = internal::start_thread(placement, [this, t] {
      work(t);
      std::lock_guard<std::mutex> lock(pool_->mutex());
      --running_workers_;
      pool_->changed().notify_all();
    });
    if (!worker.is_ok()) {
      std::lock_guard<std::mutex> lock(pool_->mutex());
      --running_workers_;
      return worker.status();
    }
    workers_.push_back(std::move(worker).value());
  }
  return Status::ok();
}

LoaderRun::~LoaderRun() {
  if (!workers_.empty()) stop(std::chrono::nanoseconds::max(), nullptr);
  // Batches built but never taken go back to the pool with their arenas.
  ready_.clear();
}

bool LoaderRun::stop(std::chrono::nanoseconds grace, std::string* stuck) {
  std::unique_lock<std::mutex> lock(pool_->mutex());
  stopping_ = true;
  pool_->changed().notify_all();
  const auto all_ended = [this] { return running_workers_ == 0; };
  bool ended;
  if (grace == std::chrono::nanoseconds::max()) {
    pool_->changed().wait(lock, all_ended);
    ended = true;
  } else {
    ended = pool_->changed().wait_for(lock, grace, all_ended);
  }
  lock.unlock();
  if (!ended && stuck != nullptr) *stuck = stuck_report();
  for (std::thread& worker : workers_) {
    if (ended) {
      worker.join();
    } else {
      worker.detach();
    }
  }
  workers_.clear();
  return ended;
}

LoaderRun::Position LoaderRun::position() const {
  std::lock_guard<std::mutex> lock(pool_->mutex());
  return position_locked();
}

void LoaderRun::finish_epoch() {
  std::unique_lock<std::mutex> lock(pool_->mutex());
  if (segments_.size() == 1) extend_locked(lock);
  segments_.pop_front();
}

Result<std::shared_ptr<Batch>> LoaderRun::next(Deadline deadline) {
  const auto wait_start = SteadyClock::now();
  std::unique_lock<std::mutex> lock(pool_->mutex());
  const Position here = position_locked();
  if (here.epoch_taken()) return std::shared_ptr<Batch>();
  const uint64_t want = delivered_;
  auto last_progress = SteadyClock::now();
  uint64_t finished_seen = finished_;
  auto ready = ready_.find(want);
  while (ready == ready_.end()) {
    // Every arena is with the consumer and nothing is being built: waiting would never end.
    // The batch is not lost: a later call builds it once arenas come back.
    if (pool_->free_count_locked() == 0 && building_ == 0) {
      return Status(ErrorCode::kResourceExhausted,
                    "all " + std::to_string(pool_->size()) +
                        " batch arenas are held by the caller, so no next batch can be built. "
                        "Held: " +
                        held_batches_locked(*pool_) +
                        ". Drop those references, keep a copy of what you need (.clone()), or "
                        "raise memory_budget");
    }
    if (deadline.passed()) {
      return Status(ErrorCode::kDeadlineExceeded,
                    "no batch arrived within the timeout given to next() (nothing is lost: the "
                    "next call waits for the same batch); " +
                        stuck_report());
    }
    pool_->changed().wait_until(
        lock, std::min(deadline.at, SteadyClock::now() + std::chrono::milliseconds(100)));
    if (finished_ != finished_seen) {
      finished_seen = finished_;
      last_progress = SteadyClock::now();
    }
    // Reads carry their own deadline; this is the backstop for a worker stuck elsewhere
    // (a pread on a hung file system cannot be interrupted).
    if (SteadyClock::now() - last_progress > options_.read_timeout + std::chrono::seconds(5)) {
      return Status(ErrorCode::kDeadlineExceeded, stuck_report());
    }
    ready = ready_.find(want);
  }
  // A corrupt sample's error comes first, one per call; the batch, without those samples,
  // follows. The batch stays in ready_ meanwhile, so nothing else of it is lost.
  Finished& head = ready->second;
  if (head.corrupt_raised < head.stats.corrupt.size()) {
    return head.stats.corrupt[head.corrupt_raised++];
  }
  auto node = ready_.extract(ready);
  ++delivered_;
  const auto ready_after = static_cast<uint32_t>(ready_.size());
  Finished& done = node.mapped();
  std::shared_ptr<Batch> batch;
  if (done.status.is_ok()) {
    done.batch->arena->holder = done.batch.get();
    batch = std::make_shared<Batch>(std::move(done.batch));
  }
  lock.unlock();
  pool_->changed().notify_all();
  const auto wait = SteadyClock::now() - wait_start;
  record_step(done, here.epoch, here.taken, wait, ready_after);
  if (!done.status.is_ok()) return done.status;
  return batch;
}

void LoaderRun::set_limits(unsigned threads, unsigned prefetch) {
  {
    std::lock_guard<std::mutex> lock(pool_->mutex());
    active_threads_ = std::clamp(threads, 1u, max_threads_);
    prefetch_ = std::max(1u, prefetch);
  }
  pool_->changed().notify_all();
}

LoaderRun::Position LoaderRun::position_locked() const {
  const Segment& front = segments_.front();
  return {front.epoch, &front.partition, delivered_ - front.first};
}

// With the lock held: appends the following epoch's segment. Unlocks while computing it;
// only one thread extends at a time.
void LoaderRun::extend_locked(std::unique_lock<std::mutex>& lock) {
  if (extending_) {
    pool_->changed().wait(lock, [&] { return !extending_; });
    return;
  }
  extending_ = true;
  const uint64_t epoch = segments_.back().epoch + 1;
  const uint64_t first = segments_.back().end();
  lock.unlock();
  RankPartition partition = next_epoch_(epoch);
  lock.lock();
  // An epoch without batches (drop_last with fewer samples than one step): stop extending,
  // or workers would append empty epochs forever.
  no_more_epochs_ = partition.batch_count() == 0;
  segments_.push_back({epoch, std::move(partition), first});
  extending_ = false;
  pool_->changed().notify_all();
}

// With the lock held: the segment holding sequence number `seq` (claimed, so it exists).
const LoaderRun::Segment& LoaderRun::segment_of(uint64_t seq) const {
  for (const Segment& segment : segments_) {
    if (seq < segment.end()) return segment;
  }
  return segments_.back();
}

void LoaderRun::work(unsigned thread) {
  internal::yield_cpu_to_others(options_.worker_nice);  // loader.hpp's worker_nice
  BatchBuilder builder(dataset_, options_, fields_, blocks_);
  std::vector<uint64_t> indices;
  std::vector<std::vector<uint64_t>> announced;  // batches' indices, in order
  std::unique_lock<std::mutex> lock(pool_->mutex());
  for (;;) {
    Arena* arena = nullptr;
    pool_->changed().wait(lock, [&] {
      if (stopping_) return true;
      if (thread >= active_threads_ || claimed_ >= delivered_ + prefetch_) return false;
      if (claimed_ >= segments_.back().end()) return !extending_ && !no_more_epochs_;
      arena = pool_->take_locked();
      return arena != nullptr;
    });
    if (stopping_) return;   // the predicate takes no arena once stopping_ is set
    if (arena == nullptr) {  // every claimed batch is in the last segment: add an epoch
      extend_locked(lock);
      continue;
    }
    const uint64_t seq = claimed_++;
    const Segment& segment = segment_of(seq);
    const uint64_t number = seq - segment.first;
    auto batch = std::make_unique<Batch::Impl>(pool_, arena);
    batch->epoch = segment.epoch;
    batch->number = number;
    ++building_;
    Finished done;
    done.padded = segment.partition.batch(number, &indices);
    // With a node-local cache, tell it which blocks the batches from this one to
    // cache_look_ahead_ past it need, each batch once, in order: its background downloads then
    // run ahead of the workers (in parallel, where a worker reads one block after another), and
    // its eviction spares those blocks. Batches of an epoch not planned yet wait for a later call.
    announced.clear();
    bool announces_own = false;  // announced[0] is the batch being built
    uint64_t announces_until = 0;
    if (dataset_.cache() != nullptr) {
      const uint64_t end = std::min(seq + cache_look_ahead_ + 1, segments_.back().end());
      // Its own batch first, unless its hint is out already. Another worker may have taken it
      // to announce (a run's first claims, at once) and will only once its own batch is built.
      announces_own = seq >= hinted_;
      if (announces_own) announced.push_back(indices);
      for (uint64_t next = std::max(announced_, seq + 1); next < end; ++next) {
        const Segment& holder = segment_of(next);
        holder.partition.batch(next - holder.first, &announced.emplace_back());
      }
      if (end > announced_) announces_until = end;
      announced_ = std::max(announced_, end);
    }
    lock.unlock();

    // The batch being built is announced before it is built, the batches ahead of it only after:
    // announced earlier, their downloads share the link and the CPUs with this batch's own
    // blocks, and a cold run's first batch, whose claim announces them all, waited seconds at
    // 50 ms for blocks it does not need (docs/remote.md, "The first batch").
    internal::CacheTrace* trace = internal::CacheTrace::get();
    if (trace) trace->event("claim", "loader", seq);
    const size_t before_build = announces_own ? 1 : 0;
    for (size_t a = 0; a < before_build; ++a) announce_reads(announced[a]);
    done.status = fill(builder, indices, batch.get(), &done.stats, thread);
    if (trace) trace->event("built", "loader", seq);
    if (done.status.is_ok()) {
      done.samples = batch->samples;
      done.batch = std::move(batch);
    }
    batch.reset();  // on failure: the arena goes back now

    lock.lock();
    --building_;
    ++finished_;
    ready_.emplace(seq, std::move(done));
    pool_->changed().notify_all();
    // The batch is handed over first: announcing tens of batches costs CPU the consumer waits on.
    if (before_build < announced.size()) {
      lock.unlock();
      for (size_t a = before_build; a < announced.size(); ++a) announce_reads(announced[a]);
      lock.lock();
    }
    hinted_ = std::max(hinted_, announces_until);
  }
}

void LoaderRun::announce_reads(const std::vector<uint64_t>& indices) const {
  // One hint per run of neighbouring samples of a shard, not one per sample: a batch of the
  // block order is a few such runs, and every hint takes the cache's lock.
  struct Range {
    std::shared_ptr<ShardReader> shard;
    uint64_t begin = 0, end = 0;
  };
  std::vector<Range> ranges;
  ranges.reserve(indices.size());
  std::vector<SampleLocation> places;
  places.reserve(indices.size());
  std::vector<size_t> closed;  // shards to open first
  for (uint64_t global : indices) {
    Result<SampleLocation> where = dataset_.locate(global);
    if (!where.is_ok()) continue;
    places.push_back(*where);
    if (dataset_.shard_if_open(where->shard) == nullptr) closed.push_back(where->shard);
  }
  // Shards not open yet open here, together: a hint that skipped their samples would leave
  // those blocks to be downloaded last, one after another, by the worker that needs them.
  // A failure is the batch's to report.
  if (!closed.empty()) {
    std::sort(closed.begin(), closed.end());
    closed.erase(std::unique(closed.begin(), closed.end()), closed.end());
    internal::CacheTrace* trace = internal::CacheTrace::get();
    if (trace) trace->event("open-shards", "loader", closed.size());
    (void)dataset_.open_shards(closed);
    if (trace) trace->event("opened-shards", "loader", closed.size());
  }
  // The block order reads whole blocks of samples (BlockWindow): those are announced, each
  // once, so that the hints name what the reads ask for (a cold cache downloads a hint alone
  // and serves only the reads inside it; docs/cache.md, "Ranges before blocks").
  std::vector<std::pair<size_t, uint64_t>> window_blocks;  // (shard, block) announced
  for (const SampleLocation& where : places) {
    std::shared_ptr<ShardReader> shard = dataset_.shard_if_open(where.shard);
    if (shard == nullptr) continue;
    if (blocks_ == nullptr) {
      const format::SampleEntry& entry = shard->index().samples[where.local];
      ranges.push_back({std::move(shard), entry.offset, entry.offset + entry.size});
      continue;
    }
    const std::pair<size_t, uint64_t> block{
        where.shard, where.local / blocks_->samples_per_block[where.shard]};
    if (std::find(window_blocks.begin(), window_blocks.end(), block) != window_blocks.end()) {
      continue;
    }
    window_blocks.push_back(block);
    const BlockReads::Span span = blocks_->span(*shard, where.shard, where.local);
    ranges.push_back({std::move(shard), span.offset, span.offset + span.length});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return std::tie(a.shard, a.begin) < std::tie(b.shard, b.begin);
  });
  // Samples this close are one run: the cache fetches whole blocks of MiBs anyway.
  constexpr uint64_t kJoinGap = 64 << 10;
  for (size_t i = 0; i < ranges.size();) {
    const Range& first = ranges[i];
    uint64_t end = first.end;
    size_t j = i + 1;
    while (j < ranges.size() && ranges[j].shard == first.shard &&
           ranges[j].begin <= end + kJoinGap) {
      end = std::max(end, ranges[j].end);
      ++j;
    }
    first.shard->source().prefetch(first.begin, end - first.begin);
    i = j;
  }
}

Status LoaderRun::fill(BatchBuilder& builder, const std::vector<uint64_t>& indices,
                       Batch::Impl* batch, BuildStats* stats, unsigned thread) {
  ZW_ASSIGN_OR_RETURN(BatchBuilder::Needs needs, builder.plan(indices));
  ZW_RETURN_IF_ERROR(pool_->reserve(batch->arena, needs.read_bytes, needs.out_bytes));
  return builder.build(indices, batch->epoch, batch, stats, &in_flight_[thread], &in_flight_mutex_);
}

std::string LoaderRun::stuck_report() {
  std::lock_guard<std::mutex> lock(in_flight_mutex_);
  std::string report = "no batch finished within read_timeout (" +
                       std::to_string(options_.read_timeout.count()) + " ms)";
  for (const ReadInFlight& read : in_flight_) {
    if (read.path.empty()) continue;
    report += "; a worker is blocked reading '" + read.path + "' at offset " +
              std::to_string(read.offset) + " (" + std::to_string(read.requests) + " requests)";
  }
  return report;
}

void LoaderRun::record_step(const Finished& done, uint64_t epoch, uint64_t number,
                            std::chrono::nanoseconds wait, uint32_t ready_after) {
  StepStats step;
  step.epoch = epoch;
  step.batch = number;
  step.wait_s = internal::seconds(wait);
  step.read_s = internal::seconds(done.stats.read);
  step.decode_s = internal::seconds(done.stats.decode);
  step.bytes_read = done.stats.bytes_read;
  step.samples = done.samples;
  step.skipped = done.stats.skipped;
  step.ready_batches = ready_after;
  std::lock_guard<std::mutex> lock(counters_->mutex);
  LoaderStats& t = counters_->totals;
  if (counters_->started == SteadyClock::time_point{}) {
    counters_->started = SteadyClock::now() - wait;
  }
  ++t.batches;
  t.samples += step.samples;
  t.bytes_read += step.bytes_read;
  t.skipped += step.skipped;
  t.padded += done.padded;
  t.wait_s += step.wait_s;
  t.read_s += step.read_s;
  t.decode_s += step.decode_s;
  counters_->recent.push_back(step);
  if (counters_->recent.size() > kRecentSteps) counters_->recent.pop_front();
}

}  // namespace zerowait
