#include "diagnose/doctor/per_file_cost.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/clock.hpp"

namespace zerowait::doctor {
namespace {

constexpr size_t kMaxFiles = 200;
constexpr uint64_t kMaxBytes = uint64_t(64) << 20;
constexpr size_t kBufferBytes = size_t(1) << 20;

// What the child reports through its pipe: a file begun, then its costs once done. Each record
// is one write under PIPE_BUF bytes, so records never interleave or split.
struct Record {
  uint32_t done = 0;  // 0: `index` begun; 1: `index` measured
  uint32_t index = 0;
  double overhead_seconds = 0;
  double total_seconds = 0;
};

// The child's loop. It runs after fork() in a process that may have had other threads: no
// allocation, only system calls, on memory prepared before the fork.
[[noreturn]] void measure_in_child(int out, const std::vector<std::string>& files,
                                   const std::vector<uint64_t>& sizes, double max_seconds,
                                   char* buffer) {
  uint64_t bytes_left = kMaxBytes;
  size_t measured = 0;
  const size_t stride = std::max<size_t>(1, files.size() / kMaxFiles);
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < files.size() && measured < kMaxFiles; i += stride) {
    if (sizes[i] > bytes_left) continue;
    if (internal::seconds_since(start) > max_seconds) break;
    Record record{0, uint32_t(i), 0, 0};
    if (::write(out, &record, sizeof record) != sizeof record) ::_exit(1);
    const auto opened = std::chrono::steady_clock::now();
    const int fd = ::open(files[i].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat info {};
    ::fstat(fd, &info);
    const auto read_start = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    for (ssize_t got; bytes < bytes_left && (got = ::read(fd, buffer, kBufferBytes)) > 0;) {
      bytes += uint64_t(got);
    }
    const auto read_end = std::chrono::steady_clock::now();
    ::close(fd);
    const auto closed = std::chrono::steady_clock::now();
    bytes_left -= std::min(bytes, bytes_left);
    record = {1, uint32_t(i),
              internal::seconds(read_start - opened) + internal::seconds(closed - read_end),
              internal::seconds(closed - opened)};
    if (::write(out, &record, sizeof record) != sizeof record) ::_exit(1);
    ++measured;
  }
  ::_exit(0);
}

}  // namespace

PerFileCost measure_per_file_cost(const std::vector<std::string>& files,
                                  const std::vector<uint64_t>& sizes, double max_seconds,
                                  double grace_seconds) {
  PerFileCost cost;
  if (files.empty()) return cost;
  // Touched before the fork and the clock: first touch is slow here.
  std::vector<char> buffer(kBufferBytes, 1);
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  int pipe_fds[2];
  if (null_fd < 0 || ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    if (null_fd >= 0) ::close(null_fd);
    return cost;
  }
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = ::fork();
  if (child == 0) {
    // A child left blocked must not hold the doctor's output open (a reader would wait for EOF).
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(null_fd, STDERR_FILENO);
    ::close(pipe_fds[0]);
    measure_in_child(pipe_fds[1], files, sizes, max_seconds, buffer.data());
  }
  ::close(null_fd);
  ::close(pipe_fds[1]);
  if (child < 0) {
    ::close(pipe_fds[0]);
    return cost;
  }

  const double deadline = max_seconds + grace_seconds;
  bool pending = false;  // a file begun and not yet measured
  uint32_t pending_index = 0;
  auto pending_since = start;
  Record record;
  size_t have = 0;  // bytes of `record` read so far
  bool ended = false;
  for (;;) {
    const double left = deadline - internal::seconds_since(start);
    if (left <= 0) break;
    pollfd p{pipe_fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, std::max(1, int(left * 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // the loop's own clock decides when to stop
    const ssize_t got =
        ::read(pipe_fds[0], reinterpret_cast<char*>(&record) + have, sizeof record - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      ended = true;  // the child is done
      break;
    }
    have += size_t(got);
    if (have < sizeof record) continue;
    have = 0;
    if (record.done == 0) {
      pending = true;
      pending_index = record.index;
      pending_since = std::chrono::steady_clock::now();
    } else {
      pending = false;
      cost.overhead_seconds += record.overhead_seconds;
      cost.total_seconds += record.total_seconds;
      ++cost.files;
    }
  }
  ::close(pipe_fds[0]);
  if (ended) {
    ::waitpid(child, nullptr, 0);
    return cost;
  }
  // Out of time. A child blocked in a read a hung file system never answers cannot be reaped
  // (not even SIGKILL ends it until the read returns): it is killed and not waited for.
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, WNOHANG);
  if (pending) {
    cost.stalled_file = files[pending_index];
    cost.stalled_seconds = internal::seconds_since(pending_since);
  }
  return cost;
}

}  // namespace zerowait::doctor
