// The commit protocol of one step (commit_protocol.cpp), used by the Checkpointer's writer.
#pragma once

#include <cstdint>
#include <string>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait::internal {

// Rank 0: reads every rank's manifest of step-N.tmp, writes the commit record, fsyncs, publishes
// step-N, fsyncs the root and points `latest` at it. After a failure past the publish the step
// is moved back to step-N.tmp, so a step whose save reported an error is never accepted.
Status commit_step(Store& target, uint64_t step, uint32_t world_size, const std::string& run_id);

// Waits, polling the step's directory, until every rank's manifest is there (rank 0) or the
// step is committed (other ranks), at most `timeout_s`. File coordination: no process group.
Status wait_for_ranks(Store& target, uint64_t step, uint32_t rank, uint32_t world_size,
                      double timeout_s);

}  // namespace zerowait::internal
