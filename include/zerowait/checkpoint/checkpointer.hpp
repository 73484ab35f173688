// Checkpoints that do not stall training and do not lie: the write side.
//
// save() copies the tensors into a staging pool (pre-faulted, reused between saves) and returns;
// a background job hashes them, writes safetensors-compatible files (or zstd-compressed ones),
// fsyncs them, writes the rank's manifest, and — once every rank's part is durable — commits the
// step: manifest.json, fsync, rename step-N.tmp → step-N, fsync the directory, update `latest`.
// Readers accept only committed steps, and verify checksums while reading. Layout and manifest
// fields: docs/checkpoint.md.
//
// The other concepts have headers of their own: what a step records and how to list it
// (manifest.hpp), reading it back with fallback (restore.hpp), verify and garbage collection
// (maintenance.hpp), where the bytes live (storage_target.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait {

enum class Compression { kNone, kZstd };
Result<Compression> parse_compression(const std::string& name);  // "none"/"" | "zstd"

struct CheckpointOptions {
  // Retention: keep the newest `keep_last` committed steps (0: keep all) and every step that is a
  // multiple of `keep_every` (0: none).
  uint32_t keep_last = 0;
  uint64_t keep_every = 0;
  Compression compression = Compression::kNone;
  int zstd_level = 3;
  // Write only the tensors whose bytes changed since the previous committed step.
  bool incremental = false;
  // Tensor files are cut at about this size (a larger tensor gets a file of its own).
  uint64_t max_file_bytes = 1ull << 30;
  // Copy and write threads; 0: one per CPU.
  unsigned threads = 0;
  // This process's part of a distributed job.
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // When the caller coordinates ranks (torch.distributed), a save stops once its part is
  // durable and the caller calls commit(); otherwise ranks meet through files in the step's
  // directory, waiting at most `commit_timeout_s` for each other, and the open of rank 0 starts
  // a job: its commits count only parts written for it (docs/checkpoint.md, "Which job a part
  // belongs to").
  bool caller_coordinates = false;
  double commit_timeout_s = 600;
  // How long each write call on a tensor file may take (a chunk, its fsync, its close: an object
  // store's upload of the whole file), in this store and the mirror alike, before the save fails
  // with kDeadlineExceeded naming the file. Small files (manifests, commit records) get the
  // metadata deadline.
  std::chrono::nanoseconds write_timeout = kDefaultWriteTimeout;
  // A second tier: each committed step is copied there in the background with the same commit
  // protocol; restore_newest() reads it when the primary copy of a step cannot be read.
  // A step number the mirror already holds from another run is refused (kAlreadyExists from the
  // save's handle, or from wait_all() when the other run's copy arrives while this one is
  // mirrored), never overwritten or skipped in silence.
  std::shared_ptr<Store> mirror;
  // Who saves: recorded in every rank manifest and commit record ("run_id"), so a step found in
  // a tier says which run wrote it. Empty: open() draws a random one (64 bits, hex). The ranks
  // of one job should share it (Python does under torch.distributed); the commit record holds
  // rank 0's.
  std::string run_id;
};

// One tensor to save. `data` is read only while save() runs (snapshot); nullptr means the caller
// fills the staging copy itself (a GPU tensor copied through pinned memory) before start().
struct TensorToSave {
  std::string name;   // unique within the rank, e.g. "/model/layer.0.weight"
  std::string dtype;  // safetensors dtype name ("F32", "BF16", "U8", ...)
  std::vector<int64_t> shape;
  uint32_t element_size = 1;  // bytes per element: byte grouping when compressed
  bool floating_point = false;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

struct SaveRequest {
  uint64_t step = 0;
  std::vector<TensorToSave> tensors;
  std::string structure_json = "null";  // opaque to C++: the caller's description of the state
};

// What a finished save did.
struct SaveResult {
  uint64_t step = 0;
  bool committed = false;      // the step is committed (on every rank)
  uint64_t bytes_total = 0;    // raw bytes of every tensor
  uint64_t bytes_written = 0;  // bytes written to new files (after incremental/compression)
  uint64_t tensors_written = 0;
  uint64_t tensors_referenced = 0;
  double snapshot_s = 0;     // time the caller was blocked copying
  double copy_s = 0;         // background: copying host tensors (PendingSave::start_copying)
  double device_wait_s = 0;  // background: waiting for the caller's device copies into staging
  double write_s = 0;        // background: hash, compress, write and fsync the part
  double commit_s = 0;       // background: waiting for ranks and committing
};

// Implementation types, defined in src/checkpoint/checkpointer.cpp: one save, and the staging
// pool, save in flight and mirror queue that a Checkpointer's saves and handles share (so they
// outlive a Checkpointer destroyed with a handle alive).
class SaveJob;
struct CheckpointerState;

// A save in flight; its background work continues if the handle is dropped. Copyable: copies
// share the save. Thread-safe; any number of threads may use one handle.
class SaveHandle {
 public:
  bool done() const;
  // Waits until the save is finished (committed, failed, or — under caller coordination — its
  // part is durable and the caller's commit ran) and returns its result or error. When
  // `deadline` passes first: kDeadlineExceeded, and the save goes on (wait again later).
  // Errors: kIo naming the file and the OS error (a full disk among them), kDeadlineExceeded when
  // the ranks did not meet within commit_timeout_s, kAlreadyExists when the mirror holds the step
  // from another run, kCancelled when ranks meeting through files find their job's rank 0
  // replaced by another process opening the directory as rank 0.
  Result<SaveResult> wait(Deadline deadline = Deadline::none()) const;
  // Under caller coordination: waits until this rank's part is durable.
  Status wait_part() const;
  uint64_t step() const;

  // A save started with PendingSave::start_copying(): whether the background copy has read
  // every host tensor (their memory is the caller's again from then on). True for other saves.
  bool copied() const;
  // Waits until copied() (or the deadline passes: kDeadlineExceeded). The copy is a memcpy and
  // always finishes.
  Status wait_copied(Deadline deadline = Deadline::none()) const;
  // The caller's verdict on the background copy, once copied(): ok lets the part be published;
  // an error (a tensor changed while it was copied) fails the save with it, so a torn snapshot
  // is never committed. The first verdict counts. The writer publishes nothing before it.
  void confirm_copy(const Status& verdict) const;

 private:
  friend class Checkpointer;
  friend class PendingSave;
  explicit SaveHandle(std::shared_ptr<SaveJob> job) : job_(std::move(job)) {}
  std::shared_ptr<SaveJob> job_;
};

// The staging copy of a save being prepared: the caller may fill tensors whose `data` was
// nullptr, then calls start(). Move-only; one thread at a time. The staging memory belongs to
// the Checkpointer's pool and is valid until start() returns or the PendingSave is dropped.
class PendingSave {
 public:
  PendingSave(PendingSave&&) noexcept;
  PendingSave& operator=(PendingSave&&) noexcept;
  ~PendingSave();
  // Where tensor `index` is staged (nbytes of it); nullptr when out of range or started.
  std::byte* staging(size_t index) const;
  // Copies every tensor with non-null data into staging, on several threads.
  Status copy_host_tensors();
  // Copies only the tensors `indices` (those with non-null data) now; start_copying() copies the
  // rest. Errors: kInvalidArgument for an index out of range.
  Status copy_host_tensors(const std::vector<size_t>& indices);
  // The caller has queued copies into staging on `cuda_stream` (a cudaStream_t of CUDA device
  // `device`): the background writer waits for the work queued on that stream so far before it
  // reads any staging byte, so the caller need not wait for its copies. A PendingSave dropped
  // unstarted waits for them too before it frees the staging pool. Call once per stream used.
  // Errors: kUnsupported without CUDA, kIo naming the CUDA call that failed.
  Status wait_for_stream(void* cuda_stream, int device);
  // A save neither started nor dropped holds the staging pool: the next save and
  // Checkpointer::wait_all() do not wait for it (dropping it releases the pool).
  // Hands the snapshot to the background writer. Call once.
  Result<SaveHandle> start();
  // Like start(), but the writer first copies the host tensors not yet copied (on its own
  // thread, which yields the CPU to the caller's), so this returns at once. Until the handle's copied(), their memory must stay
  // allocated and unchanged; the part is published only after the caller's confirm_copy().
  Result<SaveHandle> start_copying();

 private:
  friend class Checkpointer;
  explicit PendingSave(std::shared_ptr<SaveJob> job);
  std::shared_ptr<SaveJob> job_;
};

// Writes checkpoints into one directory of `target`. Owns the staging pool and the background
// writer and mirror threads; destroying it waits for every save and mirror copy in flight
// (handles still alive keep the shared state, not the threads).
// Thread-safety: not thread-safe — one thread (the training loop's) calls its methods; the
// SaveHandles it returns may be waited on from any thread. One Checkpointer per directory and
// rank; ranks of one job share the directory.
class Checkpointer {
 public:
  // Opens (creating) a checkpoint directory on `target`; removes orphaned `.tmp` steps (rank 0;
  // under file coordination only those at or below the newest committed step).
  static Result<std::unique_ptr<Checkpointer>> open(std::shared_ptr<Store> target,
                                                    CheckpointOptions options);
  ~Checkpointer();

  // Snapshots `request` into the staging pool. Waits for the previous save to finish writing,
  // or, with `skip_if_busy`, returns nullopt at once when it has not.
  Result<std::optional<PendingSave>> begin_save(SaveRequest request, bool skip_if_busy = false);
  // begin_save + copy_host_tensors + start.
  Result<std::optional<SaveHandle>> save(SaveRequest request, bool skip_if_busy = false);

  // Under caller coordination, rank 0 commits step `step` once every rank's wait_part()
  // succeeded everywhere; then every rank calls finish(handle, committed).
  Status commit(uint64_t step);
  void finish(const SaveHandle& handle, bool committed, const Status& why = Status::ok());

  // Waits for every save and mirror copy in flight; returns the first error not yet reported.
  Status wait_all();

  Store& target() { return *target_; }
  const CheckpointOptions& options() const { return options_; }

 private:
  Checkpointer(std::shared_ptr<Store> target, CheckpointOptions options);
  std::shared_ptr<Store> target_;
  CheckpointOptions options_;
  std::shared_ptr<CheckpointerState> state_;
};

}  // namespace zerowait
