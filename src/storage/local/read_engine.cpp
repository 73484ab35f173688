#include "storage/local/read_engine.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "storage/local/file_sources.hpp"

namespace zerowait {
namespace internal {
namespace {

// user_data of cancel requests; a read carries the index of its range.
constexpr uint64_t kCancelTag = ~uint64_t{0};
// One read asks for at most this much (an SQE's length is 32 bits); the rest follows the way
// the rest of a short read does.
constexpr size_t kMaxReadBytes = size_t{1} << 30;

std::string call_failed(const char* call, int err) {
  return std::string(call) + ": " + std::strerror(err);
}

// Whether the file ended inside `r`: `done` bytes are in and the last read returned `last`.
bool file_ended(const RangeRead& r, size_t done, size_t last, bool direct) {
  // An O_DIRECT read stops short of a block boundary only at the end of the file.
  return last == 0 || (direct && (r.offset + done) % kDirectIoAlignment != 0);
}

// kDeadlineExceeded naming the first range for which `unfinished(i)` holds.
template <typename Unfinished>
Status deadline_exceeded(const File& file, std::span<const RangeRead> ranges,
                         Unfinished unfinished) {
  size_t count = 0;
  size_t first = ranges.size();
  const ReadRequest* previous = nullptr;
  for (size_t i = 0; i < ranges.size(); ++i) {
    if (!unfinished(i)) continue;
    first = std::min(first, i);
    if (ranges[i].request == nullptr || ranges[i].request != previous) ++count;
    previous = ranges[i].request;
  }
  const RangeRead& r = ranges[first];
  return deadline_status(file.path(), r.request ? r.request->offset : r.offset, count);
}

struct Probe {
  bool available = false;
  std::string reason;
};

// Sets up a ring and reads one byte from a pipe through it: some sandboxes let the setup
// through and then block or break the operations.
Probe run_probe() {
  if (const char* v = std::getenv("ZEROWAIT_DISABLE_IO_URING"); v && *v && std::string(v) != "0") {
    return {false, "disabled by ZEROWAIT_DISABLE_IO_URING"};
  }
  io_uring ring;
  if (int rc = io_uring_queue_init(4, &ring, 0); rc < 0) {
    return {false, call_failed("io_uring_queue_init", -rc)};
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    const int err = errno;
    io_uring_queue_exit(&ring);
    return {false, call_failed("pipe2", err)};
  }
  static char byte;  // static: outlives a read that never completes
  Probe probe;
  if (::write(fds[1], "x", 1) != 1) {
    probe = {false, call_failed("write to a pipe", errno)};
  } else {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    io_uring_prep_read(sqe, fds[0], &byte, 1, 0);
    io_uring_cqe* cqe = nullptr;
    __kernel_timespec two_seconds{2, 0};
    const char* call = "io_uring_submit";
    int rc = io_uring_submit(&ring);
    if (rc >= 0) {
      call = "io_uring_wait_cqe_timeout";
      rc = io_uring_wait_cqe_timeout(&ring, &cqe, &two_seconds);
    }
    if (rc == -ETIME) {
      probe = {false, "a test read on a ring did not complete"};
    } else if (rc < 0) {
      probe = {false, call_failed(call, -rc)};
    } else if (cqe->res != 1) {
      probe = {false, cqe->res < 0 ? call_failed("a test read on a ring", -cqe->res)
                                   : "a test read on a ring returned no data"};
    } else {
      probe = {true, ""};
    }
  }
  io_uring_queue_exit(&ring);
  ::close(fds[0]);
  ::close(fds[1]);
  return probe;
}

const Probe& probe() {
  static const Probe result = run_probe();
  return result;
}

// The calling thread's ring: set up on first use, torn down at thread exit.
class ThreadRing {
 public:
  ThreadRing() = default;
  ThreadRing(const ThreadRing&) = delete;
  ThreadRing& operator=(const ThreadRing&) = delete;
  ~ThreadRing() { reset(); }

  // Returns the ring, or nullptr when it cannot be set up (error() says why); a later call tries
  // again.
  io_uring* get() {
    // A forked child shares its parent's ring memory: it must not submit there, or reap the
    // parent's completions. Dropping its copy leaves the parent's ring alone.
    if (ready_ && owner_ != ::getpid()) reset();
    if (!ready_) {
      // Only this thread submits, and it collects completions when it waits for them.
      int rc = io_uring_queue_init(kRingEntries, &ring_,
                                   IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_COOP_TASKRUN);
      if (rc == -EINVAL) rc = io_uring_queue_init(kRingEntries, &ring_, 0);  // before Linux 6.0
      if (rc < 0) {
        error_ = call_failed("io_uring_queue_init", -rc);
        return nullptr;
      }
      ready_ = true;
      owner_ = ::getpid();
    }
    return &ring_;
  }
  const std::string& error() const { return error_; }

  void reset() {
    if (ready_) io_uring_queue_exit(&ring_);
    ready_ = false;
  }

 private:
  io_uring ring_{};
  bool ready_ = false;
  pid_t owner_ = 0;
  std::string error_;
};

thread_local ThreadRing this_thread_ring;

// One io_uring_read call: keeps up to kRingEntries reads in flight on the ring, starting the next
// range as each one finishes.
class RingBatch {
 public:
  RingBatch(io_uring* ring, const File& file, std::span<const RangeRead> ranges, bool direct)
      : ring_(ring),
        file_(file),
        ranges_(ranges),
        direct_(direct),
        done_(ranges.size(), 0),
        state_(ranges.size(), State::kWaiting) {}

  Status run(Deadline deadline);
  // False when the ring failed in a way that leaves it unfit for another batch.
  bool ring_usable() const { return ring_usable_; }

 private:
  enum class State : uint8_t { kWaiting, kInFlight, kDone };

  void start_read(size_t i);
  void on_completion(const io_uring_cqe& cqe);
  void reap_ready();
  Status submit();
  int wait(Deadline deadline, io_uring_cqe** cqe);
  void cancel_and_drain();
  Status unfinished_status() const;

  io_uring* ring_;
  const File& file_;
  std::span<const RangeRead> ranges_;
  bool direct_;
  std::vector<size_t> done_;  // bytes in, per range
  std::vector<State> state_;
  size_t next_ = 0;  // the first range not started yet
  size_t reads_in_flight_ = 0;
  size_t cancels_in_flight_ = 0;
  bool stopping_ = false;  // no more reads start: an error, or the deadline
  Status error_;
  bool ring_usable_ = true;
};

Status RingBatch::run(Deadline deadline) {
  bool expired = false;
  while (error_.is_ok()) {
    // The deadline stops new reads; those in flight are collected while they are ready.
    if (!deadline.passed()) {
      while (next_ < ranges_.size() && reads_in_flight_ < kRingEntries) start_read(next_++);
    }
    if (reads_in_flight_ == 0) {
      if (next_ == ranges_.size()) return Status::ok();
      expired = true;
      break;
    }
    error_ = submit();
    if (!error_.is_ok()) break;
    io_uring_cqe* cqe = nullptr;
    const int rc = wait(deadline, &cqe);
    if (rc == -ETIME) {
      expired = true;
      break;
    }
    if (rc == -EINTR) continue;
    if (rc < 0) {
      error_ = errno_status(-rc, "cannot wait for io_uring reads of", file_.path());
      break;
    }
    reap_ready();
  }
  // Every buffer stays the kernel's until its read completes or is cancelled, and the caller
  // may free them as soon as this returns.
  cancel_and_drain();
  return expired ? unfinished_status() : error_;
}

void RingBatch::start_read(size_t i) {
  const RangeRead& r = ranges_[i];
  // Never null: at most kRingEntries reads are in flight, and the queue is submitted before
  // every wait.
  io_uring_sqe* sqe = io_uring_get_sqe(ring_);
  const size_t length = std::min(r.dst.size() - done_[i], kMaxReadBytes);
  io_uring_prep_read(sqe, file_.fd(), r.dst.data() + done_[i], static_cast<unsigned>(length),
                     r.offset + done_[i]);
  io_uring_sqe_set_data64(sqe, i);
  state_[i] = State::kInFlight;
  ++reads_in_flight_;
}

void RingBatch::on_completion(const io_uring_cqe& cqe) {
  const uint64_t tag = io_uring_cqe_get_data64(&cqe);
  if (tag == kCancelTag) {
    --cancels_in_flight_;  // its result (0, -ENOENT, -EALREADY) shows in the read's own result
    return;
  }
  const size_t i = tag;
  const RangeRead& r = ranges_[i];
  --reads_in_flight_;
  state_[i] = State::kWaiting;
  Status status;
  if (cqe.res < 0) {
    const int err = -cqe.res;
    if (stopping_) return;  // cancelled, or failing after the batch already has
    if (err == EINTR || err == EAGAIN) return start_read(i);
    status =
        errno_status(err, "cannot read", file_.path(), static_cast<long long>(r.offset + done_[i]));
  } else {
    const size_t got = static_cast<size_t>(cqe.res);
    done_[i] += got;
    if (done_[i] >= r.min_size) {
      state_[i] = State::kDone;
      return;
    }
    if (file_ended(r, done_[i], got, direct_)) {
      status = short_read_status(file_.path(), r.offset + done_[i], r.min_size - done_[i]);
    } else if (!stopping_) {
      return start_read(i);  // a short read: ask for the rest
    }
  }
  if (error_.is_ok() && !status.is_ok()) {
    error_ = std::move(status);
    stopping_ = true;
  }
}

void RingBatch::reap_ready() {
  unsigned head;
  unsigned count = 0;
  io_uring_cqe* cqe;
  io_uring_for_each_cqe(ring_, head, cqe) {
    ++count;
    on_completion(*cqe);
  }
  io_uring_cq_advance(ring_, count);
}

Status RingBatch::submit() {
  while (io_uring_sq_ready(ring_) > 0) {
    const int rc = io_uring_submit(ring_);
    if (rc == -EINTR) continue;
    if (rc <= 0) {
      return errno_status(rc < 0 ? -rc : EAGAIN, "cannot submit io_uring reads of", file_.path());
    }
  }
  return Status::ok();
}

int RingBatch::wait(Deadline deadline, io_uring_cqe** cqe) {
  if (io_uring_peek_cqe(ring_, cqe) == 0) return 0;
  if (deadline.at == Clock::time_point::max()) return io_uring_wait_cqe(ring_, cqe);
  const auto left =
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.at - Clock::now());
  if (left.count() <= 0) return -ETIME;
  __kernel_timespec timeout{left.count() / 1'000'000'000, left.count() % 1'000'000'000};
  return io_uring_wait_cqe_timeout(ring_, cqe, &timeout);
}

void RingBatch::cancel_and_drain() {
  stopping_ = true;
  // Reads queued but not submitted never reach the kernel if submitting fails for good: the ring
  // is torn down before anything else submits.
  if (!submit().is_ok()) {
    ring_usable_ = false;
    reads_in_flight_ -= io_uring_sq_ready(ring_);
  } else {
    for (size_t i = 0; i < next_; ++i) {
      if (state_[i] != State::kInFlight) continue;
      // Room for all: the queue is empty and at most kRingEntries reads are in flight.
      io_uring_sqe* sqe = io_uring_get_sqe(ring_);
      io_uring_prep_cancel64(sqe, i, 0);
      io_uring_sqe_set_data64(sqe, kCancelTag);
      ++cancels_in_flight_;
    }
    if (!submit().is_ok()) {
      ring_usable_ = false;
      cancels_in_flight_ -= io_uring_sq_ready(ring_);
    }
  }
  while (reads_in_flight_ > 0 || cancels_in_flight_ > 0) {
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(ring_, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) {
      // The ring itself is broken; nothing more can be learnt from it.
      ring_usable_ = false;
      return;
    }
    on_completion(*cqe);
    io_uring_cqe_seen(ring_, cqe);
  }
}

Status RingBatch::unfinished_status() const {
  return deadline_exceeded(file_, ranges_, [&](size_t i) { return state_[i] != State::kDone; });
}

}  // namespace

std::optional<Status> io_uring_read(const File& file, std::span<const RangeRead> ranges,
                                    Deadline deadline, bool direct) {
  if (ranges.empty()) return Status::ok();
  if (deadline.passed()) return deadline_exceeded(file, ranges, [](size_t) { return true; });
  io_uring* ring = this_thread_ring.get();
  if (ring == nullptr) return std::nullopt;
  RingBatch batch(ring, file, ranges, direct);
  Status status = batch.run(deadline);
  if (!batch.ring_usable()) this_thread_ring.reset();
  return status;
}

Status pread_read(const File& file, std::span<const RangeRead> ranges, Deadline deadline,
                  bool direct) {
  for (size_t i = 0; i < ranges.size(); ++i) {
    const RangeRead& r = ranges[i];
    if (deadline.passed()) return deadline_exceeded(file, ranges, [&](size_t j) { return j >= i; });
    size_t done = 0;
    while (done < r.min_size) {
      const ssize_t n = ::pread(file.fd(), r.dst.data() + done, r.dst.size() - done,
                                static_cast<off_t>(r.offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno_status(errno, "cannot read", file.path(),
                            static_cast<long long>(r.offset + done));
      }
      done += static_cast<size_t>(n);
      if (done < r.min_size && file_ended(r, done, static_cast<size_t>(n), direct)) {
        return short_read_status(file.path(), r.offset + done, r.min_size - done);
      }
    }
  }
  return Status::ok();
}

Status read_ranges(const File& file, std::span<const RangeRead> ranges, Deadline deadline,
                   bool direct) {
  if (std::optional<Status> status = io_uring_read(file, ranges, deadline, direct)) {
    return *std::move(status);
  }
  note_fallback("io_uring_thread", "cannot set up an io_uring in this thread (" +
                                       this_thread_ring.error() + "); reading with pread");
  return pread_read(file, ranges, deadline, direct);
}

}  // namespace internal

bool io_uring_available() { return internal::probe().available; }

std::string io_uring_unavailable_reason() { return internal::probe().reason; }

}  // namespace zerowait
