// Crash points for crash tests, in one place: a test sets an environment variable and the
// process dies at a chosen point, the way a power cut or kill -9 would stop it (_exit with status
// kCrashExitStatus: no cleanup, no flushing, nothing renamed). Unset, every point is a no-op.
//
//   $ZEROWAIT_FAULT_EXIT_AFTER_WRITE_BYTES=N  the shard writer, once N bytes of shard files are
//                                             written by this process (count_written_bytes)
// (A Checkpointer's $ZEROWAIT_FAULT_EXIT_AT_OPERATION=N is the storage layer's fault injector's:
// zerowait/storage/fault_store.hpp.)
#pragma once

#include <cstdint>

namespace zerowait::internal {

inline constexpr int kCrashExitStatus = 86;

// The crash point's setting: environment variable `name` as a decimal count; 0 when unset.
uint64_t crash_point_setting(const char* name);

// Ends the process now, as a crash would.
[[noreturn]] void crash_now();

// Counts bytes written to shard files by this process and crashes once the total reaches
// $ZEROWAIT_FAULT_EXIT_AFTER_WRITE_BYTES (read once).
void count_written_bytes(uint64_t bytes);

}  // namespace zerowait::internal
