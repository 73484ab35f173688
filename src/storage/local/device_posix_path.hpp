// The device reader's POSIX path: aligned reads (O_DIRECT where the file allows it) into two
// page-locked bounce buffers, each copied to GPU memory on the reader's own CUDA stream while the
// other one is being filled. The copies go through a DeviceCopier, so that the same pipeline runs
// without a GPU in tests (destinations in host memory, copied with memcpy).
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "host/aligned_buffer.hpp"
#include "common/file.hpp"
#include "zerowait/storage/device_reader.hpp"

namespace zerowait::internal {

// Copies out of the two bounce buffers ("slots" 0 and 1), in order.
class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  // Queues a copy of `bytes` from `source` (in slot `slot`'s buffer) to `destination`.
  virtual Status copy(std::byte* destination, const std::byte* source, size_t bytes) = 0;
  // Marks the end of the copies out of `slot`'s buffer queued so far.
  virtual Status mark(int slot) = 0;
  // Returns once the copies marked for `slot` are done, so that its buffer can be refilled.
  virtual Status wait(int slot) = 0;
  // Returns once every queued copy is done.
  virtual Status wait_all() = 0;
  // Whether bounce buffers should be page-locked (they are, for a CUDA stream).
  virtual bool wants_pinned_buffers() const = 0;
};

// A copier on a new non-blocking CUDA stream of `device` (the current device when called), with
// one event per slot. kUnsupported without CUDA; kIo naming the CUDA call that failed.
Result<std::unique_ptr<DeviceCopier>> make_cuda_copier(int device);
// Tests: destinations are host memory, copied at once with memcpy.
std::unique_ptr<DeviceCopier> make_host_copier();

// Tests: while set, DeviceReader takes its destinations for host memory (no CUDA checks; the
// POSIX path copies with make_host_copier()), so that both of its paths run without a GPU.
void use_host_destinations_for_testing(bool host);
bool host_destinations_for_testing();

// A bounce buffer borrowed from a small process-wide pool, so that reader after reader does not
// pay for allocating, faulting in and page-locking it again. Returned to the pool when destroyed.
class PooledBounceBuffer {
 public:
  static Result<PooledBounceBuffer> borrow(size_t bytes, bool pinned);
  PooledBounceBuffer() = default;
  ~PooledBounceBuffer();
  PooledBounceBuffer(PooledBounceBuffer&&) noexcept = default;
  PooledBounceBuffer& operator=(PooledBounceBuffer&&) noexcept;

  std::byte* data() const { return buffer_->data(); }

 private:
  std::unique_ptr<AlignedBuffer> buffer_;
};

// Reads every request from `file` through `buffers` (two, each `bounce_bytes`) and `copier`.
// `direct`: the file is open with O_DIRECT. Requests are assumed inside the file; one that is not
// is kCorrupt "short read". At `deadline` (checked before each buffer's reads) it waits for the
// copies in flight and returns kDeadlineExceeded; so does every other error.
Status read_through_bounce_buffers(const File& file, bool direct,
                                   std::span<const DeviceReadRequest> requests,
                                   std::span<PooledBounceBuffer, 2> buffers, size_t bounce_bytes,
                                   DeviceCopier& copier, Deadline deadline);

}  // namespace zerowait::internal
