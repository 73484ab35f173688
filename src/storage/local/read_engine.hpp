// The two engines that fill byte ranges of an open file: the calling thread's io_uring, which
// keeps a whole batch in flight and cancels it at a deadline, and pread(2), one range after
// another. The io_uring and O_DIRECT sources are built on them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "common/file.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait::internal {

// Fill at least `min_size` bytes of `dst` from `offset`. `dst` may be longer: an O_DIRECT read
// of a file's last block asks for the whole block and gets what the file has.
struct RangeRead {
  uint64_t offset = 0;
  std::span<std::byte> dst;
  size_t min_size = 0;
  // The caller's request this range serves, if any: a deadline error then names the request's
  // offset and counts requests, not ranges. A request's ranges are adjacent.
  const ReadRequest* request = nullptr;
};

// How many reads one thread's ring keeps in flight.
inline constexpr unsigned kRingEntries = 64;

// Reads every range through the calling thread's ring (set up on its first use, torn down at
// thread exit). A file that ends inside a range is kCorrupt "short read"; an OS error is kIo
// naming path and offset. At the deadline the reads still in flight are cancelled, and it
// returns kDeadlineExceeded only after the kernel has let go of every buffer; the same wait
// precedes any other error. Returns nullopt, having read nothing, when this thread cannot set up
// a ring. `direct`: `file` is open with O_DIRECT, every range is aligned, and a read that stops
// off a block boundary has reached the end of the file.
std::optional<Status> io_uring_read(const File& file, std::span<const RangeRead> ranges,
                                    Deadline deadline, bool direct);

// The same results with pread(2), one range after another: the deadline is checked between
// ranges, because a pread cannot be interrupted.
Status pread_read(const File& file, std::span<const RangeRead> ranges, Deadline deadline,
                  bool direct);

// io_uring_read, or pread_read in a thread that cannot set up a ring (noted once, counted).
Status read_ranges(const File& file, std::span<const RangeRead> ranges, Deadline deadline,
                   bool direct);

}  // namespace zerowait::internal
