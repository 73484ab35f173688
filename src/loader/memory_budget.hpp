// The loader's memory budget when the caller sets none (LoaderOptions::memory_budget = 0): room
// for the arenas the pipeline wants, bounded by what this machine (or this process's cgroup) has
// to spare, so that large samples get their prefetch and no loader is what gets a job killed.
#pragma once

#include <cstdint>

namespace zerowait::internal {

// The smallest budget chosen automatically: what every loader got before the budget was sized.
inline constexpr uint64_t kMinAutomaticMemoryBudget = uint64_t{512} << 20;

// `arenas` arenas of `per_arena` bytes, at least kMinAutomaticMemoryBudget, at most a quarter
// of `headroom` shared among `local_processes` loaders on this machine (one per rank).
uint64_t automatic_memory_budget(uint64_t per_arena, uint64_t arenas, uint64_t headroom,
                                 uint64_t local_processes);

// The loaders of this machine's ranks: LOCAL_WORLD_SIZE as torchrun sets it, else 1.
uint64_t local_process_count();

}  // namespace zerowait::internal
