// Durations as seconds in a double: what stats, reports and the CLI print.
#pragma once

#include <chrono>

namespace zerowait::internal {

template <typename Rep, typename Period>
double seconds(std::chrono::duration<Rep, Period> d) {
  return std::chrono::duration<double>(d).count();
}

// Seconds elapsed on the steady clock since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return seconds(std::chrono::steady_clock::now() - start);
}

}  // namespace zerowait::internal
