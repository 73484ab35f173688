// Durations as seconds in a double: what stats, reports and the CLI print.
#pragma once

#include <chrono>

namespace zerowait::internal {

template <typename Rep, typename Period>
double seconds(std::chrono::duration<Rep, Period> d) {
  return std::chrono::duration<double>(d).count();
}

// The duration of `s` seconds given as a double (a CLI flag, a Python argument), clamped to
// [0, 10^9 s]: NaN and negative values become 0 (callers that need a positive timeout refuse
// it), and a huge value cannot overflow the clock when added to now().
inline std::chrono::nanoseconds from_seconds(double s) {
  constexpr double kMax = 1e9;
  if (!(s > 0)) return std::chrono::nanoseconds(0);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(s < kMax ? s : kMax));
}

// Seconds elapsed on the steady clock since `start`.
inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return seconds(std::chrono::steady_clock::now() - start);
}

}  // namespace zerowait::internal
