// The commit protocol of one step (commit_protocol.cpp), used by the Checkpointer's writer.
#pragma once

#include <cstdint>
#include <string>

#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait::internal {

// Rank 0: reads every rank's manifest of step-N.tmp, writes the commit record, fsyncs, publishes
// step-N, fsyncs the root and points `latest` at it. After a failure past the publish the step
// is moved back to step-N.tmp, so a step whose save reported an error is never accepted.
// `coordinator` non-empty: a part carrying another is refused (kCorrupt) — wait_for_parts()
// counted only this job's, so that means another process rewrote one meanwhile.
Status commit_step(Store& target, uint64_t step, uint32_t world_size, const std::string& run_id,
                   const std::string& coordinator = "");

// Ranks meeting through files (no process group) tell the current job's parts from a dead
// job's by rank 0's token (docs/checkpoint.md, "Which job a part belongs to"): rank 0 publishes a
// fresh one in the directory's `coordinator` file when it opens, every part carries the token its
// rank last found there, and rank 0 commits only parts carrying its own.
Status publish_coordinator(Store& target, const std::string& token);
// The token in `coordinator`; "" when there is none yet.
Result<std::string> read_coordinator(Store& target);

// Rank 0: waits, polling step-N.tmp, until every rank's manifest carrying `coordinator` is there,
// at most `timeout_s` (kDeadlineExceeded, naming a part left by another job it did not count).
// kCancelled at once when the `coordinator` file no longer holds `coordinator`: another process
// opened the directory as rank 0 since.
Status wait_for_parts(Store& target, uint64_t step, uint32_t world_size,
                      const std::string& coordinator, double timeout_s);

// Rank R > 0, once `part` is published: waits until step N is committed holding exactly this
// part, at most `timeout_s`. While the step is not committed and `bound` is false (this rank has
// not yet committed a step with any rank 0), a new token in `coordinator` re-stamps and
// republishes the part: this rank may have written it before its job's rank 0 opened. A bound
// rank fails (kCancelled) when the token changes instead: its rank 0 is gone. Fails at once
// (kIo) when rank 0 left a FAILED note carrying the part's token.
Status wait_for_commit(Store& target, RankManifest& part, bool bound, double timeout_s);

// The note rank 0 leaves in step-N.tmp when it cannot commit, so the other ranks fail at once.
Status write_failure_note(Store& target, uint64_t step, const std::string& coordinator,
                          const std::string& why);

}  // namespace zerowait::internal
