// How the device reader's POSIX path cuts a batch of byte ranges into aligned reads that fill a
// bounce buffer, and the copies out of it into GPU memory: a pure function, tested on its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zerowait/storage/device_reader.hpp"

namespace zerowait::internal {

// Reads `bytes` (a multiple of the alignment) at `file_offset` (aligned) into the bounce buffer at
// `bounce_offset` (aligned). Only the first `needed` bytes must arrive: the rest may lie past the
// end of the file.
struct BounceRead {
  uint64_t file_offset = 0;
  size_t bounce_offset = 0;
  size_t bytes = 0;
  size_t needed = 0;
};

// Copies `bytes` from the bounce buffer at `bounce_offset` to `device`, for request `request`
// (its index in the batch) at `request_offset` bytes into it.
struct BounceCopy {
  size_t bounce_offset = 0;
  size_t bytes = 0;
  std::byte* device = nullptr;
  size_t request = 0;
  uint64_t request_offset = 0;
};

// One filling of a bounce buffer: its reads (each into bytes of its own) and the copies out.
struct BounceSlot {
  std::vector<BounceRead> reads;
  std::vector<BounceCopy> copies;
  size_t bytes = 0;  // of the buffer in use: the end of the last read
};

// Plans `requests` into slots of at most `slot_bytes` each (a multiple of `alignment`, at least
// two alignments). Requests are taken in file order whatever their order in the batch; requests
// whose aligned blocks touch or overlap share one read; a request larger than what is left of a
// slot continues in the next (a request that starts inside such a one may then read a few of
// its blocks again). Empty requests are skipped. Every byte of every request is copied exactly
// once.
std::vector<BounceSlot> plan_bounce_slots(std::span<const DeviceReadRequest> requests,
                                          size_t slot_bytes, size_t alignment);

}  // namespace zerowait::internal
