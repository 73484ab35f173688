// Restores to the GPU: tensor bytes are read (in parallel, verified) into a pinned staging pool
// in batches (RestoreOptions::staging_batch_bytes), and each batch goes to its CUDA tensors with
// cudaMemcpyAsync while the next batch is read. Two halves of the pool alternate; a half is
// reused only after the copies out of it are done (their events).
#include "checkpoint/device_restore.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_io.hpp"
#include "common/align.hpp"
#include "host/aligned_buffer.hpp"
#include "host/cuda_runtime.hpp"

namespace zerowait::internal {

namespace {

constexpr uint64_t kStagedAlignment = 4096;

// Pinned staging for restores to the GPU, kept for the process's later restores (pinning and
// faulting in memory costs far more than a restore's copies): one restore at a time uses it.
struct RestoreStaging {
  std::mutex mutex;
  // A pointer so that a pool a copy may still be reading is abandoned instead of freed.
  std::unique_ptr<AlignedBuffer> buffer = std::make_unique<AlignedBuffer>();
};

RestoreStaging& restore_staging() {
  // Never destroyed: at exit the CUDA runtime may be gone before a static's destructor unpins it.
  static auto* staging = new RestoreStaging;
  return *staging;
}

struct Batch {
  std::vector<size_t> reads;      // indices into the reads, in file order
  uint64_t bytes = 0;             // staging it takes, aligned tensors
  std::vector<CudaEvent> copies;  // one per stream its copies were queued on
};

// The one step from a tensor's verified bytes in staging to its destination: where a GPUDirect
// Storage reader, which reads file bytes straight into device memory, takes over.
Status copy_to_destination(const TensorRead& read, const StoredTensor& tensor,
                           const std::byte* staged) {
  if (tensor.nbytes == 0) return Status::ok();
  if (read.device == kHostThroughStaging) {
    std::memcpy(read.dst, staged, tensor.nbytes);
    return Status::ok();
  }
  const std::string what = "tensor '" + tensor.name + "' (" + std::to_string(tensor.nbytes) +
                           " bytes) to CUDA device " + std::to_string(read.device);
  const CudaRuntime& rt = cuda_runtime();
  if (!rt.ok) return Status(ErrorCode::kUnsupported, "cannot restore " + what + ": " + rt.reason);
  return cuda_status(
      rt.memcpy_async(read.dst, staged, tensor.nbytes, kCudaMemcpyHostToDevice, read.stream),
      "cudaMemcpyAsync of " + what);
}

// Queues the copies of a batch whose bytes are in `staged` (one pointer per batch read) and
// records an event on each stream they went to, also after a failed copy (the earlier ones run).
// `untracked` is set when a copy may be running that no event tracks.
Status copy_batch(std::span<const TensorRead> reads, const RankManifest& manifest, Batch& batch,
                  const std::vector<std::byte*>& staged, bool& untracked) {
  std::set<std::pair<int, void*>> streams;  // those a copy was queued on
  Status status;
  for (size_t i = 0; i < batch.reads.size() && status.is_ok(); ++i) {
    const TensorRead& read = reads[batch.reads[i]];
    status = copy_to_destination(read, manifest.tensors[read.index], staged[i]);
    if (status.is_ok() && read.device >= 0) streams.emplace(read.device, read.stream);
  }
  for (const auto& [device, stream] : streams) {
    auto event = CudaEvent::record(device, stream);
    if (!event.is_ok()) {
      untracked = true;
      if (status.is_ok()) status = event.status();
      continue;
    }
    batch.copies.push_back(std::move(event).value());
  }
  return status;
}

Status wait_for_copies(Batch& batch) {
  Status first;
  for (const CudaEvent& event : batch.copies) {
    Status status = event.wait(kDeviceCopyTimeout, "restore: copies of tensors to the GPU");
    if (first.is_ok()) first = status;
  }
  batch.copies.clear();
  return first;
}

// Consecutive reads in file order, cut at `batch_bytes` (a tensor is never split).
std::vector<Batch> plan_batches(std::span<const TensorRead> reads, const RankManifest& manifest,
                                uint64_t batch_bytes) {
  std::vector<size_t> order(reads.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto tensor = [&](size_t r) -> const StoredTensor& { return manifest.tensors[reads[r].index]; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(tensor(a).file, tensor(a).offset) <
           std::pair(tensor(b).file, tensor(b).offset);
  });
  std::vector<Batch> batches;
  for (size_t r : order) {
    const uint64_t bytes = align_up(tensor(r).nbytes, kStagedAlignment);
    if (batches.empty() ||
        (batches.back().bytes > 0 && batches.back().bytes + bytes > batch_bytes)) {
      batches.emplace_back();
    }
    batches.back().reads.push_back(r);
    batches.back().bytes += bytes;
  }
  return batches;
}

}  // namespace

Status read_through_staging(Store& target, const RankManifest& manifest,
                            std::span<const TensorRead> reads, const RestoreOptions& options) {
  for (const TensorRead& r : reads) {
    if (r.index >= manifest.tensors.size()) {
      return invalid_argument("tensor index " + std::to_string(r.index) + " is out of range");
    }
  }
  std::vector<Batch> batches = plan_batches(reads, manifest, options.staging_batch_bytes);
  // Each half holds the largest batch: staging_batch_bytes, or one tensor larger than that.
  uint64_t half = kStagedAlignment;
  for (const Batch& b : batches) half = std::max(half, b.bytes);
  const bool to_device =
      std::any_of(reads.begin(), reads.end(), [](const TensorRead& r) { return r.device >= 0; });

  RestoreStaging& staging = restore_staging();
  std::lock_guard<std::mutex> lock(staging.mutex);
  ZW_RETURN_IF_ERROR(
      staging.buffer->reserve(2 * half, 2 * half, to_device && host_memory_pinning_available()));
  // Two batches are read at a time, one into each half of the pool, so the end of one batch
  // (its last tensor's checksum, on one thread) overlaps the next one's reads. Batch k's copies
  // are queued once it is read; its half is read into again (batch k + 2) once they are done.
  std::vector<Status> read_status(batches.size());
  std::vector<std::thread> readers(batches.size());
  std::vector<std::vector<std::byte*>> staged(batches.size());
  auto launch = [&](size_t k) {
    std::byte* base = staging.buffer->data() + (k % 2) * half;
    std::vector<TensorRead> staged_reads;
    uint64_t offset = 0;
    for (size_t r : batches[k].reads) {
      staged[k].push_back(base + offset);
      staged_reads.push_back({reads[r].index, base + offset, false});
      offset += align_up(manifest.tensors[reads[r].index].nbytes, kStagedAlignment);
    }
    readers[k] = std::thread([&, k, staged_reads = std::move(staged_reads)] {
      read_status[k] = read_tensors(target, manifest, staged_reads, options);
    });
  };
  Status status;
  bool unsure = false;  // a copy out of the pool may still run: the pool is not reused
  size_t launched = 0;
  for (size_t k = 0; k < batches.size(); ++k) {
    while (status.is_ok() && launched < batches.size() && launched < k + 2) {
      if (launched >= 2) {
        Status waited = wait_for_copies(batches[launched - 2]);
        if (!waited.is_ok()) {
          unsure = true;
          status = waited;
          break;
        }
      }
      launch(launched++);
    }
    if (k >= launched) break;
    readers[k].join();
    if (status.is_ok()) status = read_status[k];
    if (status.is_ok()) status = copy_batch(reads, manifest, batches[k], staged[k], unsure);
  }
  // Nothing may be copying out of the pool when it is handed to the next restore.
  for (Batch& batch : batches) {
    if (batch.copies.empty()) continue;
    Status waited = wait_for_copies(batch);
    if (!waited.is_ok()) {
      unsure = true;
      if (status.is_ok()) status = waited;
    }
  }
  if (unsure) {
    (void)staging.buffer.release();  // deliberately leaked: a copy may still read it
    staging.buffer = std::make_unique<AlignedBuffer>();
  }
  return status;
}

}  // namespace zerowait::internal
