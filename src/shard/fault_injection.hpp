// Fault injection for crash tests: a test sets an environment variable and the process dies at
// a chosen point, the way a power cut or kill -9 would stop it.
#pragma once

#include <cstdint>

namespace zerowait::internal {

// Counts bytes written to shard files by this process; once the total passes
// $ZEROWAIT_FAULT_EXIT_AFTER_WRITE_BYTES the process exits at once with status 86 (_exit: no
// cleanup, no flushing, nothing renamed). Unset: a no-op.
void count_written_bytes(uint64_t bytes);

}  // namespace zerowait::internal
