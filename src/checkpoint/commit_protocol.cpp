// The commit protocol of one step in the checkpoint directory (docs/checkpoint.md): rank 0
// writes the commit record once every rank's manifest is durable, publishes the directory and
// points `latest` at it; the other ranks wait for that.
#include "checkpoint/commit_protocol.hpp"

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "checkpoint/checkpoint_io.hpp"
#include "checkpoint/checkpoint_manifest.hpp"
#include "common/clock.hpp"
#include "common/file.hpp"
#include "common/xxhash.hpp"
#include "zerowait/checkpoint/manifest.hpp"

namespace zerowait::internal {
namespace {

using Clock = std::chrono::steady_clock;

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

Status commit_step(Store& target, uint64_t step, uint32_t world_size, const std::string& run_id) {
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

// Waits, polling the step's directory, until every rank's manifest is there (rank 0) or the
// step is committed (other ranks). File coordination: no process group needed.
Status wait_for_ranks(Store& target, uint64_t step, uint32_t rank, uint32_t world_size,
                      double timeout_s) {
  const std::string dir = step_directory(step);
  const auto deadline = Clock::now() + internal::from_seconds(timeout_s);
  auto sleep = std::chrono::milliseconds(2);
  while (true) {
    if (rank == 0) {
      uint32_t present = 0;
      for (uint32_t r = 0; r < world_size; ++r) {
        ZW_ASSIGN_OR_RETURN(bool there,
                            target.exists(dir + kTempSuffix + "/" + internal::rank_manifest_name(r),
                                          metadata_deadline()));
        present += there ? 1 : 0;
      }
      if (present == world_size) return Status::ok();
      if (Clock::now() >= deadline) {
        return Status(ErrorCode::kDeadlineExceeded,
                      "step " + std::to_string(step) + " was not committed: only " +
                          std::to_string(present) + " of " + std::to_string(world_size) +
                          " ranks finished their part within " + std::to_string(timeout_s) +
                          " s (a rank died or is stuck); the previous step stays the latest");
      }
    } else {
      ZW_ASSIGN_OR_RETURN(bool committed, target.exists(dir + "/" + internal::kCommitRecordName,
                                                        metadata_deadline()));
      if (committed) return Status::ok();
      ZW_ASSIGN_OR_RETURN(bool failed,
                          target.exists(dir + kTempSuffix + "/FAILED", metadata_deadline()));
      if (failed) {
        auto why = target.read(dir + kTempSuffix + "/FAILED", metadata_deadline());
        return Status(ErrorCode::kIo, "step " + std::to_string(step) +
                                          " was not committed: rank 0 failed: " +
                                          (why.is_ok() ? why.value() : std::string("?")));
      }
      if (Clock::now() >= deadline) {
        return Status(ErrorCode::kDeadlineExceeded, "step " + std::to_string(step) +
                                                        " was not committed by rank 0 within " +
                                                        std::to_string(timeout_s) + " s");
      }
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace zerowait::internal
