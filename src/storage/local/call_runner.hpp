// Keeps the deadlines of one local file's write calls (pwrite, sync_file_range, fsync, close).
// call_within starts a thread per call, which a checkpoint or a pack writing a file in thousands
// of chunks cannot afford on its hot path; a CallRunner starts one thread for its file and hands
// it every call, and starts another only while all of its threads are busy (writes from several
// threads at once, or a call stuck in the kernel that its caller stopped waiting for).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait::internal {

class CallRunner {
 public:
  // `name`: the file, for kDeadlineExceeded messages.
  explicit CallRunner(std::string name);
  // Ends the idle threads; one stuck in a call whose deadline passed is left to finish on its
  // own (it cannot be interrupted) and drops its result.
  ~CallRunner();
  CallRunner(const CallRunner&) = delete;
  CallRunner& operator=(const CallRunner&) = delete;

  // `call()`, or kDeadlineExceeded naming `what` and the file once `deadline` passes first (the
  // call then goes on, on its thread, with whatever it captured). Without a deadline the call
  // runs on the caller's thread. Thread-safe.
  Status run(Deadline deadline, const std::string& what, std::function<Status()> call);
  // Whether a call's caller stopped waiting for it while it ran (it may be running still).
  bool abandoned() const;

  struct Pool;  // shared with the threads

 private:
  std::string name_;
  std::shared_ptr<Pool> pool_;
};

}  // namespace zerowait::internal
