// The commit protocol of one step in the checkpoint directory (docs/checkpoint.md): rank 0
// writes the commit record once every rank's manifest is durable, publishes the directory and
// points `latest` at it; the other ranks wait for that. Ranks meeting through files also check
// that each part is the current job's (the `coordinator` token).
#include "checkpoint/commit_protocol.hpp"

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_io.hpp"
#include "checkpoint/checkpoint_manifest.hpp"
#include "common/clock.hpp"
#include "common/file.hpp"
#include "common/xxhash.hpp"
#include "zerowait/checkpoint/manifest.hpp"

namespace zerowait::internal {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kFailureNoteName = "FAILED";

// Polls at 2 ms, doubling up to 50 ms, until `timeout_s` has passed.
class Poll {
 public:
  explicit Poll(double timeout_s) : deadline_(Clock::now() + from_seconds(timeout_s)) {}
  bool expired() const { return Clock::now() >= deadline_; }
  void sleep() {
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::milliseconds(50));
  }

 private:
  Clock::time_point deadline_;
  std::chrono::milliseconds sleep_{2};
};

std::string part_path(uint64_t step, uint32_t rank) {
  return step_directory(step) + kTempSuffix + "/" + rank_manifest_name(rank);
}

std::string token_name(const std::string& token) {
  return token.empty() ? "none" : "'" + token + "'";
}

// Rank R: the step is committed; it is this rank's only if the commit record lists the very
// manifest this rank published last.
Status require_own_part_committed(Store& target, uint64_t step, uint32_t rank,
                                  const std::string& text) {
  const std::string path = step_directory(step) + "/" + kCommitRecordName;
  ZW_ASSIGN_OR_RETURN(std::string record_text, target.read(path, metadata_deadline()));
  ZW_ASSIGN_OR_RETURN(CommitRecord record, decode_commit_record(record_text, path));
  const uint64_t own = XXH3_64bits(text.data(), text.size());
  for (const RankEntry& entry : record.ranks) {
    if (entry.rank == rank && entry.bytes == text.size() && entry.xxh3 == own) return Status::ok();
  }
  return Status(ErrorCode::kAlreadyExists,
                "step " + std::to_string(step) + " was committed in " + target.describe() +
                    " without this rank's part: its " + rank_manifest_name(rank) +
                    " is another process's (two jobs are saving into one directory); save "
                    "under a new step number, from one job per directory");
}

// Renames step-N back to step-N.tmp after a failure past the rename, so a step whose save
// reported an error is never accepted, and points `latest` back at the newest committed step.
// Best effort: the error being reported is the first one.
void unpublish(Store& target, uint64_t step) {
  const std::string dir = step_directory(step);
  if (!target.publish(dir, dir + kTempSuffix, metadata_deadline(), internal::kCommitRecordName)
           .is_ok())
    return;
  (void)target.sync_directory("", metadata_deadline());
  auto steps = list_steps(target);
  if (steps.is_ok() && !steps.value().empty()) {
    (void)publish_small_file(target, "", internal::kLatestPointerName,
                             step_directory(steps.value().back()) + "\n");
  } else {
    (void)target.remove(internal::kLatestPointerName, metadata_deadline());
  }
}

}  // namespace

Status commit_step(Store& target, uint64_t step, uint32_t world_size, const std::string& run_id,
                   const std::string& coordinator) {
  const std::string dir = step_directory(step);
  const std::string tmp = dir + kTempSuffix;
  internal::CommitRecord record;
  record.info.step = step;
  record.info.run_id = run_id;
  record.info.world_size = world_size;
  record.info.created = internal::utc_now();
  std::set<uint64_t> references;
  for (uint32_t r = 0; r < world_size; ++r) {
    const std::string path = tmp + "/" + internal::rank_manifest_name(r);
    ZW_ASSIGN_OR_RETURN(std::string text, target.read(path, metadata_deadline()));
    ZW_ASSIGN_OR_RETURN(RankManifest m, internal::decode_rank_manifest(text, path));
    if (m.step != step || m.rank != r || m.world_size != world_size) {
      return corrupt("'" + path + "' is rank " + std::to_string(m.rank) + " of " +
                     std::to_string(m.world_size) + " for step " + std::to_string(m.step) +
                     ", not rank " + std::to_string(r) + " of " + std::to_string(world_size) +
                     " for step " + std::to_string(step));
    }
    if (!coordinator.empty() && m.coordinator != coordinator) {
      return corrupt("'" + path + "' was rewritten for rank 0 " + token_name(m.coordinator) +
                     " while rank 0 " + token_name(coordinator) +
                     " committed step " + std::to_string(step) +
                     ": two jobs are saving into one directory");
    }
    for (const StoredTensor& t : m.tensors) record.info.bytes_total += t.nbytes;
    for (const StoredFile& f : m.files) {
      const uint64_t owner = internal::step_of_path(f.path).value_or(step);
      if (owner == step) {
        record.info.bytes_stored += f.bytes;
      } else {
        references.insert(owner);
      }
    }
    record.ranks.push_back(
        {r, internal::rank_manifest_name(r), text.size(), XXH3_64bits(text.data(), text.size())});
  }
  record.info.references.assign(references.begin(), references.end());

  // file fsync (done by each rank) → manifest fsync → rename → directory fsync → latest.
  ZW_RETURN_IF_ERROR(write_small_file(target, tmp + "/" + internal::kCommitRecordName,
                                      internal::encode_commit_record(record)));
  ZW_RETURN_IF_ERROR(target.sync_directory(tmp, metadata_deadline()));
  ZW_RETURN_IF_ERROR(target.publish(tmp, dir, metadata_deadline(), internal::kCommitRecordName));
  Status status = target.sync_directory("", metadata_deadline());
  if (status.is_ok()) {
    status = publish_small_file(target, "", internal::kLatestPointerName, dir + "\n");
  }
  if (!status.is_ok()) {
    unpublish(target, step);
    return status.with_context("step " + std::to_string(step) + " was not committed");
  }
  return Status::ok();
}

Status publish_coordinator(Store& target, const std::string& token) {
  return publish_small_file(target, "", kCoordinatorName, token + "\n");
}

Result<std::string> read_coordinator(Store& target) {
  auto text = target.read(kCoordinatorName, metadata_deadline());
  if (!text.is_ok()) {
    if (text.status().code() == ErrorCode::kNotFound) return std::string();
    return text.status().with_context("the coordinator file");
  }
  std::string token = std::move(text).value();
  while (!token.empty() && (token.back() == '\n' || token.back() == ' ')) token.pop_back();
  return token;
}

Status wait_for_parts(Store& target, uint64_t step, uint32_t world_size,
                      const std::string& coordinator, double timeout_s) {
  std::vector<bool> counted(world_size, false);
  std::vector<std::string> foreign_text(world_size);  // a part last seen carrying another token
  std::string foreign;  // which part was refused, for the error
  uint32_t present = 0;
  Poll poll(timeout_s);
  while (true) {
    for (uint32_t r = 0; r < world_size; ++r) {
      if (counted[r]) continue;
      const std::string path = part_path(step, r);
      bool ours = false;
      if (coordinator.empty()) {
        ZW_ASSIGN_OR_RETURN(ours, target.exists(path, metadata_deadline()));
      } else {
        // Read at once, not after an exists(): one request a rank a poll (a round trip on S3).
        auto text = target.read(path, metadata_deadline());
        if (!text.is_ok() && text.status().code() == ErrorCode::kNotFound) continue;
        ZW_RETURN_IF_ERROR(text.status());
        if (text.value() == foreign_text[r]) continue;  // unchanged: not decoded again
        ZW_ASSIGN_OR_RETURN(RankManifest m, decode_rank_manifest(text.value(), path));
        ours = m.coordinator == coordinator;
        if (!ours) {
          foreign_text[r] = std::move(text).value();
          foreign = target.describe() + "/" + path + " was written for rank 0 " +
                    token_name(m.coordinator) + ", not this job's " + token_name(coordinator);
        }
      }
      if (ours) {
        counted[r] = true;
        ++present;
      }
    }
    if (present == world_size) return Status::ok();
    if (!coordinator.empty()) {
      ZW_ASSIGN_OR_RETURN(std::string now, read_coordinator(target));
      if (now != coordinator) {
        return Status(ErrorCode::kCancelled,
                      "step " + std::to_string(step) + " was not committed: another process " +
                          "opened " + target.describe() + " as rank 0 since this one (" +
                          kCoordinatorName + " holds " + token_name(now) + ", this process is " +
                          token_name(coordinator) +
                          "): two jobs are saving into one directory, or rank 0 was restarted "
                          "without the other ranks; restart every rank of the job together");
      }
    }
    if (poll.expired()) {
      return Status(ErrorCode::kDeadlineExceeded,
                    "step " + std::to_string(step) + " was not committed: only " +
                        std::to_string(present) + " of " + std::to_string(world_size) +
                        " ranks finished their part within " + std::to_string(timeout_s) +
                        " s (a rank died or is stuck)" +
                        (foreign.empty() ? std::string()
                                         : "; " + foreign +
                                               " (a part a dead job left, not counted)") +
                        "; the previous step stays the latest");
    }
    poll.sleep();
  }
}

Status wait_for_commit(Store& target, RankManifest& part, bool bound, double timeout_s) {
  const std::string step = std::to_string(part.step);
  const std::string note_path = step_directory(part.step) + kTempSuffix + "/" + kFailureNoteName;
  std::string text = encode_rank_manifest(part);
  Poll poll(timeout_s);
  while (true) {
    ZW_ASSIGN_OR_RETURN(bool committed,
                        target.exists(step_directory(part.step) + "/" + kCommitRecordName,
                                      metadata_deadline()));
    if (committed) return require_own_part_committed(target, part.step, part.rank, text);
    ZW_ASSIGN_OR_RETURN(bool failed, target.exists(note_path, metadata_deadline()));
    if (failed) {
      // A note a dead job's rank 0 left carries its token, not the one this part answers to.
      auto note = target.read(note_path, metadata_deadline());
      const std::string body = note.is_ok() ? note.value() : std::string();
      const size_t eol = body.find('\n');
      if (eol != std::string::npos && body.substr(0, eol) == part.coordinator) {
        return Status(ErrorCode::kIo, "step " + step +
                                          " was not committed: rank 0 failed: " +
                                          body.substr(eol + 1));
      }
    }
    ZW_ASSIGN_OR_RETURN(std::string now, read_coordinator(target));
    if (now != part.coordinator) {
      if (bound) {
        return Status(ErrorCode::kCancelled,
                      "step " + step + " was not committed: the rank 0 this rank committed with (" +
                          token_name(part.coordinator) + ") was replaced by another process " +
                          "opening " + target.describe() + " as rank 0 (" + token_name(now) +
                          "): this rank's job has ended; restart every rank of the job together");
      }
      // This rank may have opened before its job's rank 0: answer to the rank 0 there now.
      part.coordinator = now;
      text = encode_rank_manifest(part);
      ZW_RETURN_IF_ERROR(publish_small_file(target, step_directory(part.step) + kTempSuffix,
                                            rank_manifest_name(part.rank), text));
    }
    if (poll.expired()) {
      return Status(ErrorCode::kDeadlineExceeded,
                    "step " + step + " was not committed by rank 0 within " +
                        std::to_string(timeout_s) + " s" +
                        (now.empty() ? " (no rank 0 has opened " + target.describe() + " yet)"
                                     : std::string()));
    }
    poll.sleep();
  }
}

Status write_failure_note(Store& target, uint64_t step, const std::string& coordinator,
                          const std::string& why) {
  return write_small_file(
      target, step_directory(step) + kTempSuffix + "/" + kFailureNoteName,
      coordinator + "\n" + why);
}

}  // namespace zerowait::internal
