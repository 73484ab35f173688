#include "host/thread_placement.hpp"

#include <pthread.h>

#include <future>
#include <utility>

#include "common/log.hpp"
#include "host/numa.hpp"

namespace zerowait::internal {

Result<std::thread> start_thread(const ThreadPlacement& placement, std::function<void()> work) {
  std::promise<Status> placed;
  std::future<Status> placed_status = placed.get_future();
  // The promise moves into the thread: it is done with it before `work` starts.
  // The new thread's fallbacks count for whoever started it (a Loader's workers for the Loader).
  std::thread thread([placement, work = std::move(work), placed = std::move(placed),
                      tally = current_fallback_tally()]() mutable {
    FallbackScope scope(std::move(tally));
    if (!placement.name.empty()) {
      pthread_setname_np(pthread_self(), placement.name.substr(0, 15).c_str());  // only a label
    }
    Status status = placement.cpus.empty() ? Status::ok() : set_thread_cpus(placement.cpus);
    const bool placed_ok = status.is_ok();
    placed.set_value(std::move(status));
    if (placed_ok) work();
  });
  Status status = placed_status.get();
  if (!status.is_ok()) {
    thread.join();
    return status.with_context("starting thread '" + placement.name + "'");
  }
  return thread;
}

}  // namespace zerowait::internal
