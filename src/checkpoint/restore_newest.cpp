// restore_newest(): which copy of which step a restore reads, and what it does when a copy
// cannot be read. The policy lives here once, so Python's load(), the `zerowait ckpt restore`
// command and C++ callers skip damaged copies the same way.
#include <algorithm>
#include <set>
#include <utility>

#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/checkpoint/restore.hpp"

namespace zerowait {
namespace {

// Errors that say this copy cannot be read (damaged, missing, unreachable): another copy may do.
bool copy_is_unreadable(const Status& status) {
  switch (status.code()) {
    case ErrorCode::kCorrupt:
    case ErrorCode::kNotFound:
    case ErrorCode::kIo:
    case ErrorCode::kDeadlineExceeded:
      return true;
    default:
      return false;
  }
}

// The committed steps of `target`; a tier that does not exist holds none. A mirror that cannot
// be listed (hung, unreachable, damaged) holds none either, and `why` says so: the primary's
// steps are restored without it.
Result<std::vector<uint64_t>> steps_of(Store* target, Tier tier, Deadline deadline, Status* why) {
  if (target == nullptr) return std::vector<uint64_t>{};
  auto steps = list_steps(*target, deadline);
  if (!steps.is_ok() && steps.status().code() == ErrorCode::kNotFound) {
    return std::vector<uint64_t>{};
  }
  if (!steps.is_ok() && tier == Tier::kMirror && copy_is_unreadable(steps.status())) {
    *why = steps.status();
    return std::vector<uint64_t>{};
  }
  return steps;
}

struct Attempt {
  uint64_t step;
  Tier tier;
  bool listed = true;  // false: a primary copy that is not there, given up without a read
};

}  // namespace

const char* tier_name(Tier tier) { return tier == Tier::kPrimary ? "primary" : "mirror"; }

Result<RestoredStep> restore_newest(Store& primary, Store* mirror,
                                    const RestoreNewestOptions& options,
                                    const std::function<Status(const StepCopy& copy)>& restore) {
  const auto metadata_deadline = [&] { return Deadline::after(options.metadata_timeout); };
  RestoredStep result;
  std::vector<Attempt> attempts;
  if (options.step) {
    // Asked for by number: both copies are tried, listed or not (the error then says why).
    attempts.push_back({*options.step, Tier::kPrimary});
    if (mirror != nullptr) attempts.push_back({*options.step, Tier::kMirror});
  } else {
    Status mirror_unreadable;
    ZW_ASSIGN_OR_RETURN(std::vector<uint64_t> primary_steps,
                        steps_of(&primary, Tier::kPrimary, metadata_deadline(), nullptr));
    ZW_ASSIGN_OR_RETURN(std::vector<uint64_t> mirror_steps,
                        steps_of(mirror, Tier::kMirror, metadata_deadline(), &mirror_unreadable));
    std::set<uint64_t, std::greater<>> candidates(primary_steps.begin(), primary_steps.end());
    candidates.insert(mirror_steps.begin(), mirror_steps.end());
    if (candidates.empty()) {
      return not_found("no committed checkpoint in " + primary.describe() +
                       (mirror != nullptr ? " or its mirror " + mirror->describe() : "") +
                       (mirror_unreadable.is_ok() ? "" : " (" + mirror_unreadable.message() + ")"));
    }
    const auto holds = [](const std::vector<uint64_t>& steps, uint64_t step) {
      return std::binary_search(steps.begin(), steps.end(), step);
    };
    for (uint64_t step : candidates) {
      // A step only the mirror has is said so, as a primary copy given up, when reached.
      attempts.push_back({step, Tier::kPrimary, holds(primary_steps, step)});
      if (holds(mirror_steps, step)) attempts.push_back({step, Tier::kMirror});
      if (!options.fallback) break;
    }
  }

  for (size_t i = 0; i < attempts.size(); ++i) {
    const Attempt& attempt = attempts[i];
    Store* target = attempt.tier == Tier::kPrimary ? &primary : mirror;
    Result<RankManifest> manifest =
        attempt.listed
            ? read_rank_manifest(*target, attempt.step, options.rank, metadata_deadline())
            : Result<RankManifest>(not_found("step " + std::to_string(attempt.step) +
                                             " is not in " + primary.describe()));
    Status status = manifest.status();
    if (status.is_ok()) {
      status = restore(StepCopy{attempt.step, attempt.tier, target, &manifest.value()});
      if (status.is_ok()) {
        result.step = attempt.step;
        result.tier = attempt.tier;
        return result;
      }
    }
    if (!copy_is_unreadable(status) || i + 1 == attempts.size()) return status;
    result.skipped.push_back({attempt.step, attempt.tier, attempt.listed, status});
    const Attempt& next = attempts[i + 1];
    if (options.on_skip) options.on_skip(result.skipped.back(), next.step, next.tier);
  }
  return Status(ErrorCode::kInternal, "restore_newest: no copy to try");  // never: see above
}

}  // namespace zerowait
