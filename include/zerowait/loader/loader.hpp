// The training input pipeline: shuffled, rank-partitioned, exactly resumable batches.
//
//   plan (sample_plan.hpp) -> coalesced reads per shard (ByteSource) -> checksum check ->
//   decode on worker threads (field_decoder.hpp: raw bytes, integer labels, images -> uint8 HWC,
//   token windows, NumPy arrays, audio clips, ...) -> a batch arena from a bounded pool -> the
//   consumer, who returns the arena by dropping the batch.
//
// Memory: every byte the pipeline holds lives in the arena pool, whose size is derived from
// `memory_budget`; a consumer that keeps every batch it got gets an error, not unbounded growth.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"
#include "zerowait/loader/array_field.hpp"
#include "zerowait/loader/audio_clip.hpp"
#include "zerowait/loader/dtype.hpp"
#include "zerowait/loader/field_decoder.hpp"
#include "zerowait/loader/image_transform.hpp"
#include "zerowait/loader/numa.hpp"
#include "zerowait/loader/sample_plan.hpp"
#include "zerowait/loader/token_window.hpp"
#include "zerowait/shard/dataset.hpp"

namespace zerowait {

// The seed of sample `index`'s random augmentations in `epoch` (crops, flips, token and audio
// offsets) for a loader whose shuffle seed is `seed`: a function of these three alone, so the
// same after an exact resume and whatever the threads.
uint64_t augment_seed(uint64_t seed, uint64_t epoch, uint64_t index);

enum class CorruptPolicy {
  kRaise,  // next() returns the error first (see Loader::next), then the batch without the sample
  kSkip,   // the sample is left out of its batch (that batch is shorter) and counted
};
Result<CorruptPolicy> parse_corrupt_policy(const std::string& name);  // "raise" / "skip"

struct LoaderOptions {
  uint64_t batch_size = 256;
  ShuffleOptions shuffle;  // mode, seed, block and window sizes
  uint64_t epoch = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  bool drop_last = false;
  unsigned threads = 0;   // worker threads; 0: one per CPU but one (left to the training loop)
  unsigned prefetch = 4;  // batches prepared ahead of the consumer (at most)
  // Worker threads run as SCHED_BATCH and this much nicer than the caller, so that when the
  // training loop's thread wakes (to launch the next GPU step) it gets a core at once instead of
  // waiting behind a worker's time slice. 0: workers are scheduled like the caller.
  int worker_nice = 5;
  // Bytes for all batch arenas together. 0 (default): room for threads + prefetch + 2 batches,
  // at least 512 MiB, at most a quarter of the memory available (MemAvailable, and the room
  // under this process's cgroup memory.max) shared by LOCAL_WORLD_SIZE ranks; stats() says
  // what was chosen.
  uint64_t memory_budget = 0;
  // The backend the dataset's shards are opened with: Loader::create refuses a dataset opened
  // with another (open_loader_dataset opens one with this).
  IoBackend io = IoBackend::kPread;
  CorruptPolicy on_corrupt = CorruptPolicy::kRaise;
  std::vector<std::string> fields;            // empty: every field in the dataset's schema
  std::map<std::string, FieldDecode> decode;  // fields not listed here come raw (field_decoder.hpp)
  bool keys = false;                          // also deliver each sample's key
  bool verify = true;                         // check every sample's checksum (xxHash3, ~20 GB/s)
  std::chrono::milliseconds read_timeout{30000};  // deadline of each batch's reads
  bool autotune = false;  // adjust active threads and prefetch to keep next() from waiting
  // Page-lock the output arenas (when the CUDA runtime can be loaded) for asynchronous copies
  // to a GPU. Only for a caller that keeps each Batch alive until its copy has completed (as
  // the Python device copy does): CUDA does not track memory pinned this way.
  bool pin_memory = false;
  // Fills every arena with 0xA5 the moment it returns to the pool, so that a batch read after
  // its release (a device copy still in flight, a view kept past the Batch) reads a pattern a
  // comparison catches. For tests and debugging: a memset of the arena per batch.
  bool poison_released_arenas = false;
  // Runs every thread the loader starts on one NUMA node's CPUs and binds its batch arenas (and
  // block window) to that node's memory (numa.hpp chooses the node). Create fails with
  // choose_numa_placement's errors; kNone (default) changes nothing.
  NumaRequest numa;

  Status validate() const;
};

// A column of fewer bytes than this in a batch is copied out of the batch arena into memory of
// its own (see BatchColumn::copy), so a caller may keep it without holding the arena: a list of
// every batch's labels must not hold every batch. Larger columns (images, raw fields) stay
// zero-copy views of the arena. `__index__`, `"int"` fields and raw fields' `.offsets` (8 bytes
// per sample) are copied whatever their size.
inline constexpr uint64_t kOwnedColumnMaxBytes = uint64_t{64} << 10;

// One column of a batch: a dense array, in the batch's arena or in a copy of its own.
struct BatchColumn {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  std::byte* data = nullptr;  // 64-byte aligned
  uint64_t bytes = 0;
  // Set when the column was copied out of the arena (kOwnedColumnMaxBytes): `data` points into
  // it and stays valid while any copy of this pointer lives, also after the Batch is gone.
  // Null: `data` points into the arena and is valid while the Batch lives.
  std::shared_ptr<std::byte[]> copy;
};

// A batch handed to the consumer. Made by the loader only; its zero-copy columns live in an
// arena that goes back to the loader's pool when the Batch is destroyed, from any thread, also
// after the Loader is gone. Always holds "__index__" (int64 [n], the global sample indices), then
// the columns of each field as its decoder lays them out (FieldDecoder::layout). Thread-safety:
// const methods may be called from any thread; the Batch never changes after the loader hands it
// over.
class Batch {
 public:
  struct Impl;  // the arena and everything the loader fills in (src/loader/batch.hpp)
  explicit Batch(std::unique_ptr<Impl> impl);
  ~Batch();
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  uint64_t epoch() const;
  uint64_t number() const;  // batch number of this rank in the epoch
  uint64_t samples() const;
  const std::vector<BatchColumn>& columns() const;
  const BatchColumn* column(const std::string& name) const;  // nullptr when there is none
  const std::vector<std::string>& keys() const;              // when LoaderOptions::keys
  bool pinned() const;  // the arena is page-locked for CUDA (LoaderOptions::pin_memory)

  // Column `index` of `batch`, kept alive by the returned pointer together with the batch (and
  // so its arena, for a zero-copy column). While such views exist, a loader whose every arena is
  // held names these columns in its kResourceExhausted error, so a caller holding views (the
  // Python bindings make one per array) learns what to drop. `index` < columns().size().
  static std::shared_ptr<const BatchColumn> view(std::shared_ptr<const Batch> batch, size_t index);

 private:
  std::unique_ptr<Impl> impl_;
};

// Where a loader stands: enough to continue the same global order exactly. `position` counts the
// samples of the epoch's order that all ranks together have consumed in whole steps.
struct LoaderState {
  uint64_t epoch = 0;
  uint64_t position = 0;
  uint64_t seed = 0;
  ShuffleMode shuffle = ShuffleMode::kQuasiRandom;
  uint64_t block_samples = 0;
  uint64_t window_blocks = 0;
  uint64_t block_bytes = 0;   // kBlock's block and window sizes
  uint64_t window_bytes = 0;
  uint32_t nodes = 1;  // kBlock's deal to nodes (the node itself may differ on resume)
  uint64_t redeal_every = 0;
  uint64_t dataset_samples = 0;
  uint64_t dataset_fingerprint = 0;  // hash of the shards' sample counts and index checksums
  uint64_t batch_size = 0;           // informative: a restore may change it
  uint32_t world_size = 0;           // informative: a restore may change it
};

// What NUMA placement the loader did (LoaderOptions::numa).
struct NumaStats {
  NumaRequest::Kind requested = NumaRequest::Kind::kNone;
  int requested_node = -1;   // kNode
  std::optional<int> node;   // the node threads and memory were placed on; none: nothing done
  std::string cpus;          // the worker threads' CPUs ("0-15,32-47"); empty when not pinned
  bool memory_bound = false;  // arenas bound to `node` (MPOL_BIND)
  std::string reason;         // what was done and from what, or why nothing (or less) was
};

// One consumer step.
struct StepStats {
  uint64_t epoch = 0;
  uint64_t batch = 0;
  double wait_s = 0;    // time the consumer was blocked in next() for this batch
  double read_s = 0;    // worker time reading this batch
  double decode_s = 0;  // worker time checking, decoding and collating it
  uint64_t bytes_read = 0;
  uint64_t samples = 0;
  uint64_t skipped = 0;
  uint32_t ready_batches = 0;  // batches ready beyond this one when it was taken
};

struct LoaderStats {
  uint64_t batches = 0;
  uint64_t samples = 0;
  uint64_t bytes_read = 0;
  uint64_t skipped = 0;  // corrupt samples left out of their batches (either policy)
  uint64_t padded = 0;   // repeats that filled a final step with fewer samples than ranks
  double wait_s = 0;     // total consumer wait in next(): the input stall
  double read_s = 0;
  double decode_s = 0;
  double elapsed_s = 0;  // since the first batch was taken
  unsigned threads = 0;  // active worker threads now
  unsigned prefetch = 0;
  unsigned arenas = 0;
  unsigned arenas_free = 0;
  uint64_t arena_bytes = 0;  // bytes held by the pool now
  uint64_t memory_budget = 0;
  // The backend the shards are read with: LoaderOptions::io, or what it fell back to (io_uring
  // refused by the kernel: "pread"; O_DIRECT refused by the file system: the buffered one).
  std::string io;
  bool pinned = false;  // arenas page-locked for CUDA
  // Times this loader's opens and reads fell back from LoaderOptions::io (once per shard opened
  // without io_uring or without O_DIRECT, once per read on a thread that could not set up its
  // ring); other loaders in the process count their own.
  uint64_t io_fallbacks = 0;
  // The node-local cache the dataset's remote shards are read through (this process's counts);
  // empty without one.
  std::optional<BlockCacheStats> cache;
  NumaStats numa;
  std::vector<StepStats> recent;  // the last steps, oldest first (at most 1024)
};

// Opens `path` (any form Dataset::open takes) as a Loader with `options` reads it: its shards
// with options.io, remote shards through `cache` when not null. The one way Loader::open (the
// Python Loader) and `zerowait bench files` open a dataset, so that both read alike.
// Dataset::open's errors.
Result<std::shared_ptr<Dataset>> open_loader_dataset(const std::string& path,
                                                     const LoaderOptions& options,
                                                     std::shared_ptr<BlockCache> cache = nullptr);

// Thread-safety: one consumer thread at a time calls the methods (the worker threads are
// internal). Destruction stops and joins the workers, also
// mid-epoch; batches still held by the caller stay valid.
class Loader {
 public:
  static Result<std::unique_ptr<Loader>> create(std::shared_ptr<Dataset> dataset,
                                                LoaderOptions options);
  // open_loader_dataset, then create: the fallbacks met opening the dataset (a directory
  // without a manifest opens every shard) count in this loader's stats too.
  static Result<std::unique_ptr<Loader>> open(const std::string& path, LoaderOptions options,
                                              std::shared_ptr<BlockCache> cache = nullptr);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Batches this rank gets from the current position to the end of the current epoch.
  uint64_t remaining_batches() const;
  // Batches this rank gets in a whole epoch.
  uint64_t batches_per_epoch() const;

  // The next batch, or nullptr at the end of the epoch; the loader then stands at the start of
  // the next epoch, whose first batches are already being prepared, and the following call
  // begins it. Errors:
  // - kCorrupt (on_corrupt = raise), naming shard, sample, key and cause: one call per corrupt
  //   sample, before its batch; the following call goes on where this one stopped and returns
  //   that batch without the bad sample(s). Nothing but the bad sample is lost.
  // - a read error (path and offset): that batch is lost, the next call returns the following.
  // - kResourceExhausted when the caller holds every arena (the message names the batches held
  //   and the columns Batch::view()s hold), or kDeadlineExceeded when no batch finished within
  //   read_timeout + 5 s (naming what each worker is blocked reading): nothing is lost, a later
  //   call waits for that batch again (it arrives, or fails as a read past its deadline).
  // - kDeadlineExceeded when `deadline` passes before the batch is ready (naming what each
  //   worker is doing): nothing is lost, the next call waits for the same batch. A training loop
  //   that must never block longer than it can afford passes one.
  Result<std::shared_ptr<Batch>> next(Deadline deadline = Deadline::none());

  // Moves to the beginning of `epoch` (prepared batches are dropped), unless the loader already
  // stands in `epoch`: then its position is kept, so calling set_epoch at the top of every epoch
  // (the DataLoader habit) does not undo a resume.
  void set_epoch(uint64_t epoch);
  // The epoch the next batch comes from (once every batch of an epoch is taken, the next one).
  uint64_t epoch() const;
  LoaderState state() const;
  // Continues from `state`: same seed, shuffle and dataset required (kInvalidArgument naming
  // the difference otherwise); batch size and world size may differ.
  Status load_state(const LoaderState& state);

  LoaderStats stats() const;
  // stats().wait_s alone, without copying the rest: cheap enough to read at every step.
  double wait_seconds() const;
  const LoaderOptions& options() const;
  const Dataset& dataset() const;
  // Stops the workers; next() then returns kCancelled. Idempotent. Waits at most read_timeout +
  // 5 s: a worker still blocked then, in a read that ignores its deadline (a hung file system),
  // is left behind with the memory it uses, and a note on stderr names what it is blocked on.
  void close();

 private:
  Loader();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zerowait
