// What a training job's main thread is doing at one instant, in the causes of run.json: the
// classes that `zerowait watch` samples (src/observe/thread_activity.cpp says how).
#pragma once

#include <array>
#include <optional>
#include <string_view>

namespace zerowait::observe {

enum class Activity { kInput, kCheckpoint, kCommunication, kCompute, kOther };

// In the order run.json's `causes` lists them.
inline constexpr std::array<Activity, 5> kActivities = {
    Activity::kInput, Activity::kCheckpoint, Activity::kCommunication, Activity::kCompute,
    Activity::kOther};

// "input", "checkpoint", "communication", "compute", "other".
const char* activity_name(Activity activity);
// The inverse of activity_name; nullopt for any other text.
std::optional<Activity> parse_activity(std::string_view name);

}  // namespace zerowait::observe
