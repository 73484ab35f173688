// yield_cpu_to_others: how a background thread (loader workers, a checkpoint's writer) lets the
// training loop's threads have the CPU first.
#pragma once

namespace zerowait::internal {

// Makes the calling thread SCHED_BATCH (a thread woken up does not preempt a running one, which
// otherwise costs it a whole scheduler slice, ~3 ms, on a busy machine) and `nice` steps nicer
// (at most 19), so it gets a smaller share of a core both want. Needs no privileges; a failure
// only costs latency and is ignored. `nice` <= 0: nothing changes.
void yield_cpu_to_others(int nice);

}  // namespace zerowait::internal
