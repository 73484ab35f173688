#include "storage/local/device_posix_path.hpp"

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "host/cuda_runtime.hpp"
#include "storage/local/device_read_plan.hpp"
#include "storage/local/file_sources.hpp"
#include "storage/local/read_engine.hpp"

namespace zerowait::internal {
namespace {

class CudaCopier final : public DeviceCopier {
 public:
  CudaCopier() = default;
  CudaCopier(const CudaCopier&) = delete;
  CudaCopier& operator=(const CudaCopier&) = delete;
  ~CudaCopier() override {
    const CudaRuntime& rt = cuda_runtime();
    if (stream_ != nullptr) {
      static_cast<void>(rt.stream_synchronize(stream_));
      rt.stream_destroy(stream_);
    }
    for (CudaEventHandle event : events_) {
      if (event != nullptr) rt.event_destroy(event);
    }
  }

  Status create(int device) {
    const CudaRuntime& rt = cuda_runtime();
    const std::string where = " on GPU " + std::to_string(device);
    ZW_RETURN_IF_ERROR(cuda_status(rt.stream_create_with_flags(&stream_, kCudaStreamNonBlocking),
                                   "cudaStreamCreateWithFlags" + where));
    for (CudaEventHandle& event : events_) {
      ZW_RETURN_IF_ERROR(cuda_status(rt.event_create_with_flags(&event, kCudaEventDisableTiming),
                                     "cudaEventCreateWithFlags" + where));
    }
    return Status::ok();
  }

  Status copy(std::byte* destination, const std::byte* source, size_t bytes) override {
    return cuda_status(
        cuda_runtime().memcpy_async(destination, source, bytes, kCudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes to GPU memory");
  }
  Status mark(int slot) override {
    marked_[slot] = true;
    return cuda_status(cuda_runtime().event_record(events_[slot], stream_), "cudaEventRecord");
  }
  Status wait(int slot) override {
    if (!marked_[slot]) return Status::ok();
    return cuda_status(cuda_runtime().event_synchronize(events_[slot]),
                       "cudaEventSynchronize (copies out of a bounce buffer)");
  }
  Status wait_all() override {
    return cuda_status(cuda_runtime().stream_synchronize(stream_),
                       "cudaStreamSynchronize (copies to GPU memory)");
  }
  bool wants_pinned_buffers() const override { return true; }

 private:
  CudaStreamHandle stream_ = nullptr;
  std::array<CudaEventHandle, 2> events_ = {nullptr, nullptr};
  std::array<bool, 2> marked_ = {false, false};
};

class HostCopier final : public DeviceCopier {
 public:
  Status copy(std::byte* destination, const std::byte* source, size_t bytes) override {
    std::memcpy(destination, source, bytes);
    return Status::ok();
  }
  Status mark(int) override { return Status::ok(); }
  Status wait(int) override { return Status::ok(); }
  Status wait_all() override { return Status::ok(); }
  bool wants_pinned_buffers() const override { return false; }
};

std::atomic<bool> host_destinations{false};

// At most this many idle bounce buffers are kept for the next reader (two readers' worth).
constexpr size_t kPooledBuffers = 4;

struct BouncePool {
  std::mutex mutex;
  std::vector<std::unique_ptr<AlignedBuffer>> idle;
};

BouncePool& bounce_pool() {
  static auto* pool = new BouncePool();  // never destroyed: unpinning after CUDA's exit crashes
  return *pool;
}

void return_to_pool(std::unique_ptr<AlignedBuffer> buffer) {
  if (buffer == nullptr) return;
  BouncePool& pool = bounce_pool();
  std::lock_guard<std::mutex> lock(pool.mutex);
  if (pool.idle.size() < kPooledBuffers) pool.idle.push_back(std::move(buffer));
}

// For each request, the index of the last slot that copies into it.
std::vector<size_t> last_slot_of_requests(const std::vector<BounceSlot>& slots, size_t requests) {
  std::vector<size_t> last(requests, 0);
  for (size_t i = 0; i < slots.size(); ++i) {
    for (const BounceCopy& copy : slots[i].copies) last[copy.request] = i;
  }
  return last;
}

}  // namespace

Result<std::unique_ptr<DeviceCopier>> make_cuda_copier(int device) {
  if (!cuda_runtime().ok) {
    return Status(ErrorCode::kUnsupported, "no CUDA device: " + cuda_runtime().reason);
  }
  auto copier = std::make_unique<CudaCopier>();
  ZW_RETURN_IF_ERROR(copier->create(device));
  return std::unique_ptr<DeviceCopier>(std::move(copier));
}

std::unique_ptr<DeviceCopier> make_host_copier() { return std::make_unique<HostCopier>(); }

void use_host_destinations_for_testing(bool host) { host_destinations.store(host); }
bool host_destinations_for_testing() { return host_destinations.load(); }

Result<PooledBounceBuffer> PooledBounceBuffer::borrow(size_t bytes, bool pinned) {
  PooledBounceBuffer borrowed;
  {
    BouncePool& pool = bounce_pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    for (auto it = pool.idle.begin(); it != pool.idle.end(); ++it) {
      if ((*it)->capacity() >= bytes && (*it)->pinned() == pinned) {
        borrowed.buffer_ = std::move(*it);
        pool.idle.erase(it);
        return borrowed;
      }
    }
  }
  borrowed.buffer_ = std::make_unique<AlignedBuffer>();
  // Faulted in now: the first reads then cost no page faults (0.3 GB/s on first touch here).
  ZW_RETURN_IF_ERROR(borrowed.buffer_->reserve(bytes, bytes, pinned));
  return borrowed;
}

PooledBounceBuffer::~PooledBounceBuffer() { return_to_pool(std::move(buffer_)); }

PooledBounceBuffer& PooledBounceBuffer::operator=(PooledBounceBuffer&& other) noexcept {
  if (this != &other) {
    return_to_pool(std::move(buffer_));
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

Status read_through_bounce_buffers(const File& file, bool direct,
                                   std::span<const DeviceReadRequest> requests,
                                   std::span<PooledBounceBuffer, 2> buffers, size_t bounce_bytes,
                                   DeviceCopier& copier, Deadline deadline) {
  const std::vector<BounceSlot> slots =
      plan_bounce_slots(requests, bounce_bytes, kDirectIoAlignment);
  const std::vector<size_t> last_slot = last_slot_of_requests(slots, requests.size());
  const bool io_uring = io_uring_available();
  std::vector<RangeRead> ranges;
  Status status;
  for (size_t i = 0; i < slots.size() && status.is_ok(); ++i) {
    const BounceSlot& slot = slots[i];
    const int which = static_cast<int>(i % 2);
    if (deadline.passed()) {
      size_t unfinished = 0;
      for (size_t r = 0; r < requests.size(); ++r) {
        unfinished += requests[r].size > 0 && last_slot[r] >= i ? 1 : 0;
      }
      status = deadline_status(file.path(), slot.reads.front().file_offset, unfinished);
      break;
    }
    // The copies out of this buffer two slots ago must be done before it is refilled.
    status = copier.wait(which);
    if (!status.is_ok()) break;
    std::byte* base = buffers[which].data();
    ranges.clear();
    for (const BounceRead& read : slot.reads) {
      ranges.push_back({read.file_offset,
                        std::span<std::byte>(base + read.bounce_offset, read.bytes), read.needed,
                        nullptr});
    }
    status = io_uring ? read_ranges(file, ranges, deadline, direct)
                      : pread_read(file, ranges, deadline, direct);
    for (size_t c = 0; c < slot.copies.size() && status.is_ok(); ++c) {
      const BounceCopy& copy = slot.copies[c];
      status = copier.copy(copy.device, base + copy.bounce_offset, copy.bytes);
    }
    if (status.is_ok()) status = copier.mark(which);
  }
  // Whatever happened, nothing may still be copying out of the buffers (or into the caller's
  // memory) once this returns.
  const Status drained = copier.wait_all();
  return status.is_ok() ? drained : status;
}

}  // namespace zerowait::internal
