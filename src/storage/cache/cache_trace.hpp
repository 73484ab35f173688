// A log of what the node-local cache asks the origin for, and for whom, to see what a read waits
// on: set ZEROWAIT_TRACE_CACHE=PATH and every process appends one line per event to PATH
// (docs/cache.md, "Tracing"). Off, it costs one test of a pointer per event.
#pragma once

#include <cstdint>
#include <string_view>

namespace zerowait::internal {

class CacheTrace {
 public:
  // The trace when ZEROWAIT_TRACE_CACHE names a file that can be opened (looked up at every call,
  // so a process may start or move its trace), else nullptr.
  static CacheTrace* get();

  // Appends "<seconds> <pid> <event> <origin> <block> <detail>"; seconds on CLOCK_MONOTONIC
  // (Python's time.monotonic()), so a caller's own time stamps line up with it. Thread-safe.
  void event(std::string_view event, std::string_view origin, uint64_t block,
             std::string_view detail = {});
};

}  // namespace zerowait::internal
