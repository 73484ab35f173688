#include "loader/memory_budget.hpp"

#include <algorithm>
#include <cstdlib>

namespace zerowait::internal {

uint64_t automatic_memory_budget(uint64_t per_arena, uint64_t arenas, uint64_t headroom,
                                 uint64_t local_processes) {
  const uint64_t wanted = per_arena * arenas;
  const uint64_t share = headroom / 4 / std::max<uint64_t>(1, local_processes);
  return std::max(kMinAutomaticMemoryBudget, std::min(wanted, share));
}

uint64_t local_process_count() {
  const char* text = std::getenv("LOCAL_WORLD_SIZE");
  if (text == nullptr) return 1;
  const uint64_t n = std::strtoull(text, nullptr, 10);
  return n == 0 ? 1 : n;
}

}  // namespace zerowait::internal
