#include "common/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <future>
#include <utility>

namespace zerowait::internal {

ThreadPool::ThreadPool(unsigned threads) {
  threads_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { work_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::drain(std::unique_lock<std::mutex>& lock) {
  while (body_ != nullptr && next_ < count_) {
    const size_t index = next_++;
    const auto* body = body_;
    ++running_;
    lock.unlock();
    (*body)(index);
    lock.lock();
    --running_;
  }
  if (running_ == 0 && next_ >= count_) finished_.notify_all();
}

void ThreadPool::work_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  size_t seen = generation_;
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    drain(lock);
  }
}

void ThreadPool::parallel_for(size_t count, const std::function<void(size_t)>& body) {
  if (count == 0) return;
  std::lock_guard<std::mutex> loop(loop_mutex_);
  std::unique_lock<std::mutex> lock(mutex_);
  body_ = &body;
  next_ = 0;
  count_ = count;
  ++generation_;
  if (count > 1) wake_.notify_all();
  drain(lock);
  finished_.wait(lock, [&] { return running_ == 0 && next_ >= count_; });
  body_ = nullptr;
}

unsigned available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<unsigned>(n);
  }
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

}  // namespace zerowait::internal
