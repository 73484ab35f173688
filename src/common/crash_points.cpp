#include "common/crash_points.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdlib>

namespace zerowait::internal {

uint64_t crash_point_setting(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::strtoull(value, nullptr, 10) : 0;
}

void crash_now() { _exit(kCrashExitStatus); }

void count_written_bytes(uint64_t bytes) {
  static const uint64_t limit = crash_point_setting("ZEROWAIT_FAULT_EXIT_AFTER_WRITE_BYTES");
  static std::atomic<uint64_t> written{0};
  if (limit == 0) return;
  if (written.fetch_add(bytes) + bytes >= limit) crash_now();
}

}  // namespace zerowait::internal
