// The Checkpointer's private state, shared by checkpointer.cpp (saves, commit, mirror) and
// part_writer.cpp (writing one rank's part): what a save owns while it runs.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_io.hpp"
#include "common/clock.hpp"
#include "common/thread_pool.hpp"
#include "common/xxhash.hpp"
#include "host/aligned_buffer.hpp"
#include "host/cuda_runtime.hpp"
#include "zerowait/checkpoint/checkpointer.hpp"
#include "zerowait/checkpoint/manifest.hpp"

namespace zerowait {

// --- shared state ---------------------------------------------------------------------------

struct CheckpointerState {
  std::shared_ptr<Store> target;
  CheckpointOptions options;
  internal::ThreadPool pool;
  // A pointer so that a pool a device copy may still be writing into can be abandoned (leaked)
  // instead of freed: see abandon_staging().
  std::unique_ptr<internal::AlignedBuffer> staging = std::make_unique<internal::AlignedBuffer>();

  std::mutex mutex;
  std::condition_variable changed;
  std::shared_ptr<SaveJob> in_flight;  // owns the staging pool until its writing is done
  std::thread writer;
  std::optional<RankManifest> base;  // the previous committed step's part, for incremental saves
  Status unreported;                 // a background error nobody has waited for yet
  // Ranks meeting through files (files_coordinate()): rank 0's own token, published at open;
  // on another rank, the token of the rank 0 it has committed a step with ("" until then).
  std::string coordinator;

  // Mirror tier: steps waiting to be copied, one thread copying them.
  // Held (before `mutex`) by a commit until its step is queued or retention has run, and by the
  // mirror thread's run of the primary's retention, which spares the queued steps: no step
  // commits while retention decides what to retire, so none is retired before it is copied.
  std::mutex retention_mutex;
  std::deque<uint64_t> mirror_queue;
  bool mirror_busy = false;
  bool stopping = false;
  std::thread mirror_thread;

  CheckpointerState(std::shared_ptr<Store> t, CheckpointOptions o)
      : target(std::move(t)),
        options(std::move(o)),
        pool((options.threads != 0 ? options.threads : internal::available_cpus()) - 1) {}

  // Ranks commit through the checkpoint directory alone (no caller coordination, several ranks).
  bool files_coordinate() const { return options.world_size > 1 && !options.caller_coordinates; }

  void remember_error(const Status& status) {
    std::lock_guard<std::mutex> lock(mutex);
    if (unreported.is_ok()) unreported = status;
  }
  void mirror_loop();

  // After a device copy into staging failed or never finished: the DMA may still write into the
  // pool, so it is never freed or reused; the next save gets a new one.
  void abandon_staging() {
    (void)staging.release();  // deliberately leaked
    staging = std::make_unique<internal::AlignedBuffer>();
  }
};

// --- one save ---------------------------------------------------------------------------------

class SaveJob {
 public:
  enum class Phase { kStaged, kWriting, kPartDurable, kFinished };

  std::shared_ptr<CheckpointerState> owner;
  uint64_t step = 0;
  std::vector<TensorToSave> tensors;
  std::string structure_json;
  std::vector<uint64_t> staging_offsets;
  std::byte* staging_base = nullptr;
  bool started_writing = false;  // start() was called (guarded by the owner's mutex)
  Clock::time_point started = Clock::now();
  double snapshot_s = 0;
  double device_wait_s = 0;
  // start_copying(): the writer copies the host tensors with non-null data first.
  bool copy_in_background = false;
  double copy_s = 0;
  // That copy, cut in pieces which the writer and any thread waiting for the copy take in turn
  // (take_copy_pieces()): made before the writer starts, never changed after.
  struct CopyPiece {
    const std::byte* src;
    std::byte* dst;
    uint64_t bytes;
    size_t tensor;  // its index in `tensors`
  };
  std::vector<CopyPiece> copy_pieces;
  std::atomic<size_t> next_copy_piece{0};
  std::atomic<size_t> copy_pieces_done{0};
  std::atomic<bool> copy_waited_for{false};  // the training loop waits for the copy now
  // The checksums (XXH3-64 of the staged bytes) the writer took while copying, by tensor;
  // empty where the part writer still has to hash the tensor. Sized by start_copying(); written
  // and read by the writer thread only.
  std::vector<std::optional<uint64_t>> copy_xxh3;
  // Recorded on the caller's copy streams (wait_for_stream): done once staging holds the bytes.
  std::vector<internal::CudaEvent> device_copies;

  std::mutex mutex;
  std::condition_variable changed;
  Phase phase = Phase::kStaged;
  bool host_copied = false;            // the caller's host memory is no longer read
  std::optional<Status> copy_verdict;  // the caller's confirm_copy()
  Status part_status;
  std::optional<Result<SaveResult>> result;
  RankManifest manifest;  // this rank's part, once durable
  // Under caller coordination: the outcome the caller reports through finish().
  std::optional<std::pair<bool, Status>> caller_outcome;

  std::byte* staging(size_t index) const { return staging_base + staging_offsets[index]; }
  std::span<const std::byte> staged(size_t index) const {
    return {staging(index), tensors[index].nbytes};
  }

  // Waits until the caller's device copies into staging are done; on failure the staging pool
  // is abandoned (the owner's mutex need not be held: this job owns the pool until it finishes).
  Status wait_for_device_copies() {
    const auto start = Clock::now();
    Status status;
    for (const internal::CudaEvent& event : device_copies) {
      status = event.wait(internal::kDeviceCopyTimeout,
                          "checkpoint step " + std::to_string(step) +
                              ": the copies of its CUDA tensors into staging");
      if (!status.is_ok()) break;
    }
    device_copies.clear();
    device_wait_s = internal::seconds_since(start);
    if (!status.is_ok()) {
      owner->abandon_staging();
      return Status(status.code(), status.message() +
                                       "; the staging pool it copies into is abandoned (the "
                                       "next save allocates a new one)");
    }
    return status;
  }

  void set_host_copied() {
    std::lock_guard<std::mutex> lock(mutex);
    host_copied = true;
    changed.notify_all();
  }
  // Copies pieces of the background copy until none is left to take; whoever finishes the last
  // one marks the host tensors copied. Returns when no piece is left to take: others may still
  // be copying theirs (wait for host_copied). `hash` (the writer thread only): while nobody
  // waits for the copy, each tensor is hashed as it is copied, each chunk while it is still in
  // the cache, so the part writer does not read it from memory again; a tensor of several
  // pieces is hashed across them when this thread takes all of them, in order (it does unless
  // the loop waits). Once the training loop waits (copy_waited_for), pieces are only copied:
  // hashing them now would lengthen its wait; the part writer hashes the tensors left.
  void take_copy_pieces(bool hash) {
    const size_t count = copy_pieces.size();
    internal::Xxh3Stream stream;
    // `stream` holds the start of a tensor up to the piece this thread took last (`previous`):
    // the next piece of that tensor, if this thread takes it too, goes on hashing it.
    bool streaming = false;
    size_t previous = count;
    for (size_t i = next_copy_piece.fetch_add(1); i < count; i = next_copy_piece.fetch_add(1)) {
      const CopyPiece& piece = copy_pieces[i];
      const uint64_t start = static_cast<uint64_t>(piece.dst - staging(piece.tensor));
      const bool last = start + piece.bytes == tensors[piece.tensor].nbytes;
      const bool hashing = hash && !copy_waited_for.load(std::memory_order_relaxed) &&
                           (start == 0 || (streaming && previous + 1 == i));
      previous = i;
      if (hashing) {
        if (start == 0) stream.reset();
        internal::copy_into_xxh3(stream, piece.dst, piece.src, piece.bytes);
        if (last) copy_xxh3[piece.tensor] = stream.digest();
      } else {
        std::memcpy(piece.dst, piece.src, piece.bytes);
      }
      streaming = hashing && !last;
      if (copy_pieces_done.fetch_add(1) + 1 == count) set_host_copied();
    }
  }
  // The part is published only once the caller has judged the background copy exact.
  Status wait_for_copy_verdict() {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return copy_verdict.has_value(); });
    return *copy_verdict;
  }

  void set_phase(Phase p) {
    std::lock_guard<std::mutex> lock(mutex);
    phase = p;
    changed.notify_all();
  }
  void finish(Result<SaveResult> r) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!r.is_ok() && part_status.is_ok() && phase < Phase::kPartDurable) part_status = r.status();
    result = std::move(r);
    phase = Phase::kFinished;
    changed.notify_all();
  }
};

}  // namespace zerowait
