// Checkpoints that do not stall training and do not lie.
//
// save() copies the tensors into a staging pool (pre-faulted, reused between saves) and returns;
// a background job hashes them, writes safetensors-compatible files (or zstd-compressed ones),
// fsyncs them, writes the rank's manifest, and — once every rank's part is durable — commits the
// step: manifest.json, fsync, rename step-N.tmp → step-N, fsync the directory, update `latest`.
// Readers accept only committed steps, and verify checksums while reading. Layout and manifest
// fields: docs/checkpoint.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerowait/checkpoint/storage_target.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/io/byte_source.hpp"

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
  // directory, waiting at most `commit_timeout_s` for each other.
  bool caller_coordinates = false;
  double commit_timeout_s = 600;
  // A second tier: each committed step is copied there in the background with the same commit
  // protocol; restore_newest() reads it when the primary copy of a step cannot be read.
  // A step number the mirror already holds from another run is refused (kAlreadyExists from the
  // save's handle, or from wait_all() when the other run's copy arrives while this one is
  // mirrored), never overwritten or skipped in silence.
  std::shared_ptr<StorageTarget> mirror;
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
  double snapshot_s = 0;  // time the caller was blocked copying
  double write_s = 0;     // background: hash, compress, write and fsync the part
  double commit_s = 0;    // background: waiting for ranks and committing
};

class SaveJob;

// A save in flight; its background work continues if the handle is dropped.
class SaveHandle {
 public:
  explicit SaveHandle(std::shared_ptr<SaveJob> job) : job_(std::move(job)) {}
  bool done() const;
  // Waits until the save is finished (committed, failed, or — under caller coordination — its
  // part is durable and the caller's commit ran) and returns its result or error. When
  // `deadline` passes first: kDeadlineExceeded, and the save goes on (wait again later).
  // Thread-safe; any number of threads may wait on one handle.
  Result<SaveResult> wait(Deadline deadline = Deadline::none()) const;
  // Under caller coordination: waits until this rank's part is durable.
  Status wait_part() const;
  uint64_t step() const;

 private:
  friend class Checkpointer;
  std::shared_ptr<SaveJob> job_;
};

// The staging copy of a save being prepared: the caller may fill tensors whose `data` was
// nullptr, then calls start().
class PendingSave {
 public:
  PendingSave(PendingSave&&) noexcept;
  PendingSave& operator=(PendingSave&&) noexcept;
  ~PendingSave();
  // Where tensor `index` is staged (nbytes of it); nullptr when out of range or started.
  std::byte* staging(size_t index) const;
  // Copies every tensor with non-null data into staging, on several threads.
  Status copy_host_tensors();
  // A save neither started nor dropped holds the staging pool: the next save and
  // Checkpointer::wait_all() do not wait for it (dropping it releases the pool).
  // Hands the snapshot to the background writer. Call once.
  Result<SaveHandle> start();

 private:
  friend class Checkpointer;
  explicit PendingSave(std::shared_ptr<SaveJob> job);
  std::shared_ptr<SaveJob> job_;
};

// Where a tensor's bytes are stored.
struct StoredTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  uint64_t xxh3 = 0;    // of the raw bytes
  std::string file;     // relative to the checkpoint root: "step-90/rank-00000-00001.safetensors"
  uint64_t offset = 0;  // of the (first) stored byte in that file
  uint64_t stored_bytes = 0;     // nbytes, or the compressed size
  std::string codec = "none";    // "none" | "zstd"
  uint32_t group_bytes = 1;      // byte grouping element size (1: none)
  uint64_t chunk_bytes = 0;      // raw bytes per compressed chunk
  std::vector<uint64_t> chunks;  // compressed size of each chunk
};

struct StoredFile {
  std::string path;  // relative to the checkpoint root
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;      // of the whole file
  std::string container;  // "safetensors" | "zerowait-zstd"
};

// One rank's part of a committed step.
struct RankManifest {
  uint64_t step = 0;
  std::string run_id;  // the run that saved it ("" in checkpoints older than run ids)
  uint32_t rank = 0;
  uint32_t world_size = 1;
  std::string structure_json;
  std::vector<StoredTensor> tensors;
  std::vector<StoredFile> files;  // every file the tensors live in, this step's and older ones
};

struct StepInfo {
  uint64_t step = 0;
  std::string run_id;  // the run that committed it (rank 0's); "" in older checkpoints
  uint32_t world_size = 1;
  uint64_t bytes_total = 0;          // raw tensor bytes, all ranks
  uint64_t bytes_stored = 0;         // bytes in this step's own files, all ranks
  std::vector<uint64_t> references;  // older steps whose files it uses
  std::string created;               // ISO 8601 UTC
};

// Reads into `dst` (its nbytes). Reads of one file are merged and run in parallel.
struct TensorRead {
  size_t index = 0;  // into RankManifest::tensors
  std::byte* dst = nullptr;
  // `dst` is new memory nothing has touched yet (a tensor allocated for this load): the read
  // asks for transparent huge pages there, so filling it takes 1/512 as many page faults.
  bool fresh = false;
};

// How long one read of a restore, a verification or a mirror copy (at most 16 MiB, one ranged
// read of the storage target) may take before it is reported as kDeadlineExceeded, naming the
// file and offset, instead of waited for.
inline constexpr std::chrono::seconds kDefaultReadTimeout{60};

struct RestoreOptions {
  unsigned threads = 0;  // 0: two per CPU, at least 4 (each alternates reading and copying)
  bool direct = true;    // O_DIRECT where the target is a filesystem that allows it
  bool verify = true;    // check every tensor's xxh3 while reading
  std::chrono::nanoseconds read_timeout = kDefaultReadTimeout;  // per read, see above
};

class Checkpointer {
 public:
  // Opens (creating) a checkpoint directory on `target`; removes orphaned `.tmp` steps (rank 0;
  // under file coordination only those at or below the newest committed step).
  static Result<std::unique_ptr<Checkpointer>> open(std::shared_ptr<StorageTarget> target,
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

  StorageTarget& target() { return *target_; }
  const CheckpointOptions& options() const { return options_; }

  // The staging pool, the save in flight and the mirror queue (defined in checkpoint.cpp); saves
  // and their handles share it, so it outlives a Checkpointer destroyed with a handle alive.
  struct State;

 private:
  Checkpointer(std::shared_ptr<StorageTarget> target, CheckpointOptions options);
  std::shared_ptr<StorageTarget> target_;
  CheckpointOptions options_;
  std::shared_ptr<State> state_;
};

// --- reading -----------------------------------------------------------------------------------

// Committed steps (directories "step-N" holding manifest.json), ascending. Does not verify data.
Result<std::vector<uint64_t>> list_steps(StorageTarget& target);
// Reads and validates step N's commit record.
Result<StepInfo> read_step_info(StorageTarget& target, uint64_t step);
// Reads rank `rank`'s manifest of committed step N (validated against the commit record).
Result<RankManifest> read_rank_manifest(StorageTarget& target, uint64_t step, uint32_t rank);
// Every rank's manifest of committed step N, rank 0 first (the first error, if any).
Result<std::vector<RankManifest>> read_rank_manifests(StorageTarget& target, uint64_t step);
// Reads tensors of `manifest` into memory through the target's ranged reads (open_for_read),
// in parallel, verifying checksums. Errors name the file and offset: kCorrupt for a checksum
// mismatch (and the tensor) or a short read, kIo for a failed read, kDeadlineExceeded for a read
// that took longer than options.read_timeout. After an error the destinations hold a mix of old
// and new bytes.
Status read_tensors(StorageTarget& target, const RankManifest& manifest,
                    std::span<const TensorRead> reads, const RestoreOptions& options = {});

// --- restoring with fallback --------------------------------------------------------------------

// The two places a step can be read from.
enum class Tier { kPrimary, kMirror };
const char* tier_name(Tier tier);  // "primary" | "mirror"

// One copy of a step: what restore_newest hands its `restore` callback.
struct StepCopy {
  uint64_t step = 0;
  Tier tier = Tier::kPrimary;
  StorageTarget* target = nullptr;         // where it lives
  const RankManifest* manifest = nullptr;  // the rank's manifest, validated
};

// A copy that restore_newest could not use, and why.
struct SkippedCopy {
  uint64_t step = 0;
  Tier tier = Tier::kPrimary;
  // false: the primary tier does not hold the step as a committed checkpoint and nothing was
  // read there; its mirror copy is tried next (only when the step was not asked for by number).
  bool listed = true;
  Status why;
};

struct RestoreNewestOptions {
  std::optional<uint64_t> step;  // nullopt: the newest committed step of either tier
  uint32_t rank = 0;
  // With `step` unset: when the newest step cannot be read from either tier, try older ones.
  bool fallback = true;
  // Called as each copy is given up, with the copy tried next (in order; on the calling thread).
  std::function<void(const SkippedCopy& skipped, uint64_t next_step, Tier next_tier)> on_skip;
};

struct RestoredStep {
  uint64_t step = 0;
  Tier tier = Tier::kPrimary;
  std::vector<SkippedCopy> skipped;  // the copies given up before it, in order
};

// The read-side policy of checkpoints: restores rank `options.rank`'s part of a step, trying
// its copies in order — each step's primary copy, then its mirror copy (`mirror` may be null),
// newest step first — until `restore` succeeds on one. Steps: `options.step`, or with it unset
// the committed steps of both tiers, newest first (only the newest without `fallback`). A copy is
// given up, reported to `on_skip` and recorded in `skipped` when reading its manifest or
// `restore` fails with kCorrupt, kNotFound, kIo or kDeadlineExceeded (the copy is damaged,
// missing or unreachable); any other error (kInvalidArgument from the caller's callback, ...)
// is returned at once. `restore` reads the tensors it wants, typically with read_tensors(
// *copy.target, *copy.manifest, ...); after a failed copy it is called again for the next, and
// must not assume its earlier destinations were filled. Errors: kNotFound "no committed
// checkpoint in ..." when neither tier holds a step, else the last copy's error.
Result<RestoredStep> restore_newest(StorageTarget& primary, StorageTarget* mirror,
                                    const RestoreNewestOptions& options,
                                    const std::function<Status(const StepCopy& copy)>& restore);

struct VerifyReport {
  uint64_t step = 0;
  uint64_t files = 0;
  uint64_t bytes = 0;
  uint64_t tensors = 0;
  std::vector<std::string> problems;  // empty: the step is intact
};
// Reads every file of every rank of step N through the target's ranged reads (each within
// `read_timeout`) and checks sizes, headers and checksums. `progress` gets the bytes read, from
// several threads (one at a time).
Result<VerifyReport> verify_step(StorageTarget& target, uint64_t step, unsigned threads = 0,
                                 const std::function<void(uint64_t bytes)>& progress = {},
                                 std::chrono::nanoseconds read_timeout = kDefaultReadTimeout);

struct GcReport {
  std::vector<std::string> removed;  // paths relative to the root
  uint64_t bytes_freed = 0;
};
// Removes what no committed step needs: orphaned `step-N.tmp` directories (all, or only those at
// or below the newest committed step when `only_settled_tmp`), and files of retired steps that no
// kept step references. Applies retention first when keep_last/keep_every are non-zero.
Result<GcReport> collect_garbage(StorageTarget& target, uint32_t keep_last, uint64_t keep_every,
                                 bool only_settled_tmp = false);

// The directory names: "step-N", "step-N.tmp".
std::string step_directory(uint64_t step);

}  // namespace zerowait
