// Rounding to a multiple: O_DIRECT blocks, staging buffers, batch columns, tar blocks.
#pragma once

#include <cstdint>

namespace zerowait::internal {

// The largest multiple of `alignment` (> 0) that is <= `value`.
constexpr uint64_t align_down(uint64_t value, uint64_t alignment) {
  return value - value % alignment;
}

// The smallest multiple of `alignment` (> 0) that is >= `value`; `value + alignment - 1` must not
// overflow.
constexpr uint64_t align_up(uint64_t value, uint64_t alignment) {
  return align_down(value + alignment - 1, alignment);
}

}  // namespace zerowait::internal
