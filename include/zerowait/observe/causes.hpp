// The causes a step's or a run's time is split into: the one list of every producer of run.json
// (profile, watch, emulate), of `zerowait report`, and of Python (zerowait._core.CAUSES).
#pragma once

#include <array>
#include <string_view>

namespace zerowait::observe {

// In the order run.json's `causes` lists them. A run lists those it measures (watch cannot see
// host-to-device copies, so it has no "h2d"), always in this order.
inline constexpr std::array<const char*, 6> kCauses = {"input",         "checkpoint", "h2d",
                                                       "communication", "compute",    "other"};

// Every cause but compute is time the GPU waits.
constexpr bool is_wait(std::string_view cause) { return cause != "compute"; }

// The waits a verdict names ("input-bound"): "other" is no cause to name.
constexpr bool names_verdict(std::string_view cause) { return is_wait(cause) && cause != "other"; }

// Whether `name` is one of kCauses.
constexpr bool is_cause(std::string_view name) {
  for (const char* cause : kCauses) {
    if (name == cause) return true;
  }
  return false;
}

}  // namespace zerowait::observe
