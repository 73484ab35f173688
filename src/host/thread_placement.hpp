// start_thread: the one way a component starts a thread with a name and a CPU set (the loader's
// NUMA placement). Here, not in common/, because setting a thread's CPUs is host/numa's job.
#pragma once

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// What a thread is called and where it runs, set by the thread itself before its work starts
// (so no work ever runs on the wrong CPUs, and nothing reaches into a running thread).
struct ThreadPlacement {
  // Shown by top -H, /proc/<pid>/task/<tid>/comm and debuggers; cut to 15 characters (the
  // kernel's limit). Empty: the creating thread's name, as the kernel gives it.
  std::string name;
  // Empty: the creating thread's CPUs, as the kernel gives them.
  std::vector<unsigned> cpus;
};

// Starts a thread that applies `placement`, then runs `work`. Returns once the placement is
// applied. When the CPUs cannot be set (set_thread_cpus' errors), `work` never runs and the
// thread is joined before the error returns. The caller owns (joins) the returned thread.
Result<std::thread> start_thread(const ThreadPlacement& placement, std::function<void()> work);

}  // namespace zerowait::internal
