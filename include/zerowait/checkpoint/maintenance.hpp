// Looking after a checkpoint directory: verifying a committed step end to end and removing what
// no committed step needs (retention and orphaned `.tmp` steps). `zerowait ckpt verify` and
// `zerowait ckpt gc` call these; a Checkpointer applies retention with collect_garbage.
//
// Thread-safety: verify_step may run alongside anything (it only reads). collect_garbage removes
// files: run it only where no Checkpointer with retention and no other collect_garbage works on
// the same directory at the same time, and never on a step being restored.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zerowait/checkpoint/restore.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait {

struct VerifyReport {
  uint64_t step = 0;
  uint64_t files = 0;
  uint64_t bytes = 0;
  uint64_t tensors = 0;
  std::vector<std::string> problems;  // empty: the step is intact
};
// Reads every file of every rank of step N through the target's ranged reads (each within
// `read_timeout`) and checks sizes, headers and checksums. `progress` gets the bytes read, from
// several threads (one at a time).
Result<VerifyReport> verify_step(Store& target, uint64_t step, unsigned threads = 0,
                                 const std::function<void(uint64_t bytes)>& progress = {},
                                 std::chrono::nanoseconds read_timeout = kDefaultReadTimeout);

struct GcReport {
  std::vector<std::string> removed;  // paths relative to the root
  uint64_t bytes_freed = 0;
};
// Removes what no committed step needs: orphaned `step-N.tmp` directories (all, or only those at
// or below the newest committed step when `only_settled_tmp`), and files of retired steps that no
// kept step references. Applies retention first when keep_last/keep_every are non-zero; the steps
// in `spare` are kept whatever the retention (a Checkpointer's steps still waiting for its mirror).
Result<GcReport> collect_garbage(Store& target, uint32_t keep_last, uint64_t keep_every,
                                 bool only_settled_tmp = false,
                                 const std::vector<uint64_t>& spare = {});

}  // namespace zerowait
