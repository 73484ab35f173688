#include "shard/fault_injection.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>

namespace zerowait::internal {
namespace {

uint64_t crash_limit() {
  static const uint64_t limit = [] {
    const char* v = std::getenv("ZEROWAIT_FAULT_EXIT_AFTER_WRITE_BYTES");
    return v ? std::strtoull(v, nullptr, 10) : 0;
  }();
  return limit;
}

std::atomic<uint64_t> written{0};

}  // namespace

void count_written_bytes(uint64_t bytes) {
  const uint64_t limit = crash_limit();
  if (limit == 0) return;
  if (written.fetch_add(bytes) + bytes >= limit) _exit(86);
}

}  // namespace zerowait::internal
