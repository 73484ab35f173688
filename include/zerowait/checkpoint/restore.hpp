// Restoring checkpoint steps: verified parallel reads of a rank's tensors (read_tensors) and the
// read-side policy that picks which copy to read — newest step first, the mirror when the primary
// copy is damaged or unreachable, older steps when asked (restore_newest). The CLI's
// `zerowait ckpt restore` and Python's Checkpointer.load() both go through restore_newest.
//
// Thread-safety: the functions may run from several threads at once on one target (its calls are
// thread-safe); each call uses its own threads and returns when they are done. The caller owns
// the destination memory and must keep it alive and untouched until the call returns.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait {

// TensorRead::device for host memory that the reads fill directly.
inline constexpr int kHostMemory = -1;
// TensorRead::device for host memory filled the way device memory is (through the staging pool,
// the last step a memcpy): the device path's twin, which tests run on machines without CUDA.
inline constexpr int kHostThroughStaging = -2;

// Reads into `dst` (its nbytes). Reads of one file are merged and run in parallel.
struct TensorRead {
  size_t index = 0;  // into RankManifest::tensors
  std::byte* dst = nullptr;
  // `dst` is new memory nothing has touched yet (a tensor allocated for this load): the read
  // asks for transparent huge pages there, so filling it takes 1/512 as many page faults.
  bool fresh = false;
  // >= 0: `dst` is memory of that CUDA device (a CUDA tensor's data_ptr()). Its bytes are read
  // into a pinned staging pool, verified there and copied with cudaMemcpyAsync on `stream` (a
  // cudaStream_t of the device, which the caller has ordered after any work on `dst`), while the
  // next tensors are read; read_tensors returns once every copy is done.
  int device = kHostMemory;
  void* stream = nullptr;
  // `dst` already holds the tensor's stored bytes: a private mapping of its file that the
  // caller made (Store::local_file), host memory. Nothing is read; the bytes are verified where
  // they are. Only for an uncompressed tensor.
  bool mapped = false;
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
  // Reads into device memory go through staging in batches of about this many bytes (a larger
  // tensor is a batch of its own), read while the previous batch is copied to the device. The
  // default keeps every read thread of a 16-core machine busy.
  uint64_t staging_batch_bytes = 512ull << 20;
};

// Reads tensors of `manifest` into memory through the target's ranged reads (open_for_read),
// in parallel, verifying checksums. Errors name the file and offset: kCorrupt for a checksum
// mismatch (and the tensor) or a short read, kIo for a failed read or CUDA copy,
// kDeadlineExceeded for a read that took longer than options.read_timeout. After an error the
// destinations hold a mix of old and new bytes. Reads into device memory share one pinned
// staging pool per process (twice the larger of staging_batch_bytes and the largest such tensor,
// kept for later restores): concurrent restores to the GPU take turns.
Status read_tensors(Store& target, const RankManifest& manifest, std::span<const TensorRead> reads,
                    const RestoreOptions& options = {});

// The two places a step can be read from.
enum class Tier { kPrimary, kMirror };
const char* tier_name(Tier tier);  // "primary" | "mirror"

// One copy of a step: what restore_newest hands its `restore` callback.
struct StepCopy {
  uint64_t step = 0;
  Tier tier = Tier::kPrimary;
  Store* target = nullptr;                 // where it lives
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
  // How long listing a tier and reading a step's manifests there may take. A tier that does not
  // answer within it (a hung mirror mount) is given up like an unreadable copy.
  std::chrono::nanoseconds metadata_timeout = kDefaultReadTimeout;
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
Result<RestoredStep> restore_newest(Store& primary, Store* mirror,
                                    const RestoreNewestOptions& options,
                                    const std::function<Status(const StepCopy& copy)>& restore);

}  // namespace zerowait
