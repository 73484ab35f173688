// A local filesystem call cannot be interrupted: on a hung NFS mount stat(2) or open(2) blocks
// in the kernel for as long as the server is gone. To keep a Store call's deadline there, the
// call runs on a thread of its own and the caller stops waiting at the deadline; the thread
// finishes (or stays stuck) on its own, and its result is dropped.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait::internal {

// kDeadlineExceeded "<what> '<name>' did not finish within its deadline (...)".
Status call_deadline_status(const std::string& what, const std::string& name);

// `call()`, or kDeadlineExceeded naming `what` and `name` when `deadline` passes first. Without
// a deadline the call runs on the caller's thread.
template <typename T>
Result<T> call_within(Deadline deadline, const std::string& what, const std::string& name,
                      std::function<Result<T>()> call) {
  if (deadline.at == Clock::time_point::max()) return call();
  if (deadline.passed()) return call_deadline_status(what, name);
  struct Shared {
    std::mutex mutex;
    std::condition_variable done_cv;
    std::optional<Result<T>> result;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, call = std::move(call)]() mutable {
    Result<T> result = call();
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->result.emplace(std::move(result));
    shared->done_cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mutex);
  if (!shared->done_cv.wait_until(lock, deadline.at, [&] { return shared->result.has_value(); })) {
    return call_deadline_status(what, name);
  }
  return std::move(*shared->result);
}

inline Status call_within(Deadline deadline, const std::string& what, const std::string& name,
                          std::function<Status()> call) {
  return call_within<bool>(deadline, what, name,
                           [call = std::move(call)]() -> Result<bool> {
                             ZW_RETURN_IF_ERROR(call());
                             return true;
                           })
      .status();
}

}  // namespace zerowait::internal
