// A fixed set of threads that run the parts of one parallel loop at a time (the checkpoint
// snapshot copy, tensor writes and restores). A thread with a name and a CPU set is started by
// start_thread (host/thread_placement.hpp).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// A fixed set of threads that run the parts of one parallel loop at a time. The calling thread
// works too, so a pool of N threads uses N + 1 cores' worth of parallelism only when N + 1
// parts exist.
class ThreadPool {
 public:
  // `threads` helpers besides the caller (0: the caller runs everything).
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs body(i) for every i in [0, count), each exactly once, on the helpers and the caller;
  // returns when all have returned. One loop at a time per pool (calls are serialised).
  void parallel_for(size_t count, const std::function<void(size_t)>& body);

  unsigned helpers() const { return static_cast<unsigned>(threads_.size()); }

 private:
  void work_loop();
  // Takes and runs items of the current loop until none are left.
  void drain(std::unique_lock<std::mutex>& lock);

  std::mutex loop_mutex_;  // serialises parallel_for calls
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  const std::function<void(size_t)>* body_ = nullptr;
  size_t next_ = 0;
  size_t count_ = 0;
  size_t running_ = 0;
  size_t generation_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// The number of CPUs this process may run on (at least 1).
unsigned available_cpus();

}  // namespace zerowait::internal
