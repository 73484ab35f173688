#include "diagnose/bench/storage_run.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "common/align.hpp"
#include "common/file.hpp"
#include "common/random.hpp"

namespace zerowait::internal::bench {
namespace {

// The offsets one stream asks for: sequential through [begin, begin + length) (wrapping), or
// uniform over its blocks (xoshiro256**: a few ns per offset).
class OffsetStream {
 public:
  OffsetStream(const StorageJob& job, uint64_t begin, uint64_t length, uint64_t seed)
      : random_(job.pattern == StoragePattern::kRandRead),
        block_(job.block_size),
        begin_(begin),
        blocks_(length / job.block_size),
        rng_(seed) {}

  uint64_t next() {
    if (random_) return begin_ + rng_.below(blocks_) * block_;
    const uint64_t offset = begin_ + position_ * block_;
    if (++position_ == blocks_) {
      position_ = 0;
      wrapped_ = true;
    }
    return offset;
  }
  // A sequential stream has handed out every block once.
  bool wrapped() const { return wrapped_; }

 private:
  bool random_;
  uint64_t block_;
  uint64_t begin_;
  uint64_t blocks_;
  uint64_t position_ = 0;
  bool wrapped_ = false;
  internal::Rng rng_;
};

uint64_t fresh_seed(uint64_t stream) {
  return internal::combine_seed(now_ns(), uint64_t(::getpid()), stream);
}

// One run's request buffers, in transparent huge pages where the kernel gives them (fio gets
// the same through fio_environment() and --mem_align). Why it matters more than anything else
// here: the buffer's physical layout decides how many DMA segments a request takes. In 4 KiB
// pages a 1 MiB request is up to 256 segments (virtio-blk takes 254 per request), fewer only
// where pages happen to be physically adjacent, and fio's own 1 MiB reads measured 0.9 GB/s
// with no two adjacent pages in its buffer and 2.2 GB/s with 891 of 1023 adjacent, run to run.
// In huge pages a request is one segment and both sides read about 3 GB/s. Read buffers are
// faulted in before the clock starts; write buffers hold random bytes, not zeros, which some
// disks compress or skip.
class IoBuffer {
 public:
  IoBuffer() = default;
  IoBuffer(const IoBuffer&) = delete;
  IoBuffer& operator=(const IoBuffer&) = delete;
  ~IoBuffer() {
    if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
  }

  Status allocate(size_t bytes, bool for_writes) {
    // A huge page needs an aligned 2 MiB range: map one more and start at the boundary.
    mapping_size_ = internal::align_up(bytes, kHugePage) + kHugePage;
    void* memory =
        ::mmap(nullptr, mapping_size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
      mapping_ = nullptr;
      return Status(ErrorCode::kResourceExhausted,
                    "cannot map " + std::to_string(mapping_size_) +
                        " bytes of request buffers: " + std::strerror(errno));
    }
    mapping_ = memory;
    data_ = reinterpret_cast<std::byte*>(
        internal::align_up(reinterpret_cast<uintptr_t>(memory), kHugePage));
    ::madvise(data_, internal::align_up(bytes, kHugePage), MADV_HUGEPAGE);  // only a hint
    if (for_writes) {
      internal::Rng rng(fresh_seed(bytes));
      auto* words = reinterpret_cast<uint64_t*>(data_);
      for (size_t i = 0; i < bytes / 8; ++i) words[i] = rng.next();
    } else {
      std::memset(data_, 0, bytes);
    }
    return Status::ok();
  }
  std::byte* data() const { return data_; }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::byte* data_ = nullptr;
};

Status io_failure(const std::string& path, const StorageJob& job, uint64_t offset, long result) {
  const char* what = job.pattern == StoragePattern::kSeqWrite ? "cannot write" : "cannot read";
  if (result < 0) return errno_status(int(-result), what, path, (long long)offset);
  return io_error(std::string(what) + " '" + path + "' at offset " + std::to_string(offset) + ": " +
                  std::to_string(result) + " of " + std::to_string(job.block_size) +
                  " bytes transferred");
}

class Ring {
 public:
  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  int init(unsigned entries) {
    // Only this thread submits, and completions are posted when it waits for them (as fio sets
    // up its rings): no inter-processor interrupts.
    int rc = io_uring_queue_init(entries, &ring_,
                                 IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
    if (rc == -EINVAL) rc = io_uring_queue_init(entries, &ring_, 0);  // before Linux 6.1
    ready_ = rc == 0;
    return rc;
  }
  io_uring* get() { return &ring_; }

 private:
  io_uring ring_{};
  bool ready_ = false;
};

// One thread, job.depth requests in flight: each completion starts the next request at once,
// the way fio's io_uring engine keeps its iodepth. Neither the file nor the buffers are
// registered with the ring, as fio's are not by default: in 4 KiB pages registration faults a
// buffer in a different physical order, and that moved MB/s more than registration saved.
Result<RawRun> run_io_uring(int fd, const std::string& path, uint64_t size, const StorageJob& job,
                            const RunWindow& window, const std::atomic<bool>* stop) {
  const unsigned depth = job.depth;
  const size_t block = job.block_size;
  const bool writes = job.pattern == StoragePattern::kSeqWrite;
  IoBuffer buffers;  // declared before the ring: outlives every request in flight
  ZW_RETURN_IF_ERROR(buffers.allocate(depth * block, writes));
  Ring ring;
  if (const int rc = ring.init(depth); rc < 0) {
    return errno_status(
        -rc, "cannot set up an io_uring of depth " + std::to_string(depth) + " to measure", path);
  }

  OffsetStream offsets(job, 0, size, fresh_seed(0));
  struct Slot {
    uint64_t offset = 0;
    uint64_t started = 0;
  };
  std::vector<Slot> slots(depth);
  const auto prepare = [&](unsigned slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring.get());  // never null: depth entries, depth slots
    const uint64_t offset = offsets.next();
    std::byte* buffer = buffers.data() + slot * block;
    const auto length = unsigned(block);
    if (writes) {
      io_uring_prep_write(sqe, fd, buffer, length, offset);
    } else {
      io_uring_prep_read(sqe, fd, buffer, length, offset);
    }
    io_uring_sqe_set_data64(sqe, slot);
    slots[slot].offset = offset;
  };

  RawRun run;
  Status error;
  const auto may_start = [&](uint64_t now) {
    return error.is_ok() && window.open(run, now) && !stopped(stop) &&
           !(window.one_pass && offsets.wrapped());
  };
  unsigned in_flight = 0;
  // Each request goes to the kernel as soon as it is prepared, as fio submits (iodepth_batch=1):
  // submitting the replacements of a whole batch of completions together measured 15 % fewer
  // 4 KiB IOPS at depth 32 here, the device's queue running short meanwhile.
  const auto issue = [&](unsigned slot) {
    prepare(slot);
    int rc = 0;
    do {
      rc = io_uring_submit(ring.get());
    } while (rc == -EINTR);
    if (rc < 0) {
      error = errno_status(-rc, "cannot submit an io_uring request while measuring", path);
      return;
    }
    slots[slot].started = now_ns();  // once the kernel has taken it, as fio's clat starts
    ++in_flight;
  };
  uint64_t now = now_ns();
  for (unsigned slot = 0; slot < depth && may_start(now); ++slot) issue(slot);
  while (in_flight > 0) {
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(ring.get(), &cqe);
    if (rc == -EINTR) continue;  // a signal: the stop flag is seen below
    if (rc < 0) {
      // The ring itself failed: nothing more can be reaped. The requests still in flight hold
      // their pages until they complete, whatever happens to the buffer here.
      return errno_status(-rc, "cannot wait for io_uring requests while measuring", path);
    }
    unsigned head = 0;
    unsigned seen = 0;
    // Submitting a replacement also posts completions that arrived meanwhile: the loop reads
    // the ring's tail again at every step, so they are reaped here too.
    io_uring_for_each_cqe(ring.get(), head, cqe) {
      ++seen;
      --in_flight;
      now = now_ns();
      const auto slot = unsigned(io_uring_cqe_get_data64(cqe));
      if (cqe->res != int(block)) {
        if (error.is_ok()) error = io_failure(path, job, slots[slot].offset, cqe->res);
        continue;
      }
      window.record(run, block, slots[slot].started, now);
      if (may_start(now)) issue(slot);
    }
    io_uring_cq_advance(ring.get(), seen);
  }
  if (!error.is_ok()) return error;
  run.seconds = window.seconds(run, now);
  return run;
}

}  // namespace

// job.depth threads, each with one synchronous pread/pwrite at a time (fio's psync with
// numjobs=N). Sequential streams each take their own stripe of the file, as fio's
// offset_increment gives them; random ones each range over the whole file.
Result<RawRun> run_psync(int fd, const std::string& path, uint64_t size, const StorageJob& job,
                         const RunWindow& window, const std::atomic<bool>* stop) {
  const unsigned threads = job.depth;
  const uint64_t block = job.block_size;
  const bool writes = job.pattern == StoragePattern::kSeqWrite;
  const bool random = job.pattern == StoragePattern::kRandRead;
  const uint64_t stripe = random ? size : internal::align_down(size / threads, block);
  std::vector<RawRun> runs(threads);
  std::mutex error_mutex;
  Status error;
  std::atomic<bool> failed{false};
  const auto fail = [&](Status status) {
    std::lock_guard lock(error_mutex);
    if (error.is_ok()) error = std::move(status);
    failed = true;
  };
  const auto work = [&](unsigned index) {
    IoBuffer buffer;
    if (Status s = buffer.allocate(block, writes); !s.is_ok()) return fail(std::move(s));
    OffsetStream offsets(job, random ? 0 : index * stripe, stripe, fresh_seed(index + 1));
    for (;;) {
      const uint64_t started = now_ns();
      if (!window.open(runs[index], started) || stopped(stop) ||
          failed.load(std::memory_order_relaxed) || (window.one_pass && offsets.wrapped())) {
        return;
      }
      const uint64_t offset = offsets.next();
      ssize_t done = 0;
      do {
        done = writes ? ::pwrite(fd, buffer.data(), block, off_t(offset))
                      : ::pread(fd, buffer.data(), block, off_t(offset));
      } while (done < 0 && errno == EINTR);
      const uint64_t finished = now_ns();
      if (done != ssize_t(block)) {
        return fail(io_failure(path, job, offset, done < 0 ? -errno : done));
      }
      window.record(runs[index], block, started, finished);
    }
  };
  {
    std::vector<std::jthread> workers;
    workers.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) workers.emplace_back(work, i);
  }  // joined
  if (!error.is_ok()) return error;
  RawRun run;
  for (const RawRun& r : runs) run.merge(r);  // the threads ran at the same time: one window
  run.seconds = window.seconds(run, now_ns());
  return run;
}

Result<RawRun> run_job_raw(int fd, const std::string& path, uint64_t size, const StorageJob& job,
                           const RunWindow& window, const std::atomic<bool>* stop) {
  Result<RawRun> run = job.engine == StorageEngine::kIoUring
                           ? run_io_uring(fd, path, size, job, window, stop)
                           : run_psync(fd, path, size, job, window, stop);
  if (stopped(stop)) return cancelled();
  return run;
}

RunWindow timed_window(double ramp_s, double runtime_s) {
  const uint64_t measure_from = now_ns() + to_ns(ramp_s);
  return {measure_from, measure_from + to_ns(runtime_s), false};
}

}  // namespace zerowait::internal::bench
