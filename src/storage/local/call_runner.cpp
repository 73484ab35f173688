#include "storage/local/call_runner.hpp"

#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "storage/local/call_within.hpp"

namespace zerowait::internal {
namespace {

struct Task {
  std::function<Status()> call;
  std::optional<Status> result;
  bool abandoned = false;  // its caller stopped waiting: nobody reads the result
  std::condition_variable done_cv;
};

struct Worker {
  std::thread thread;
  std::shared_ptr<Task> current;
};

}  // namespace

// Everything under `mutex`. Shared with the threads, so a thread stuck past the runner's life
// still has it.
struct CallRunner::Pool {
  std::mutex mutex;
  std::condition_variable work_cv;
  std::deque<std::shared_ptr<Task>> queue;
  std::list<Worker> workers;  // a list: each thread keeps a pointer to its own entry
  size_t idle = 0;
  bool stopping = false;
  bool abandoned = false;  // a caller has stopped waiting for a call
};

namespace {

void work(const std::shared_ptr<CallRunner::Pool>& pool, Worker* self);

}  // namespace

CallRunner::CallRunner(std::string name)
    : name_(std::move(name)), pool_(std::make_shared<Pool>()) {}

CallRunner::~CallRunner() {
  std::vector<std::thread> to_join;
  {
    std::lock_guard<std::mutex> lock(pool_->mutex);
    pool_->stopping = true;
    for (Worker& worker : pool_->workers) {
      // Joining a thread stuck in the kernel would block here as long as the storage does.
      if (worker.current && worker.current->abandoned) {
        worker.thread.detach();
      } else {
        to_join.push_back(std::move(worker.thread));
      }
    }
  }
  pool_->work_cv.notify_all();
  for (std::thread& thread : to_join) thread.join();
}

Status CallRunner::run(Deadline deadline, const std::string& what, std::function<Status()> call) {
  if (deadline.at == Clock::time_point::max()) return call();
  if (deadline.passed()) return call_deadline_status(what, name_);
  auto task = std::make_shared<Task>();
  task->call = std::move(call);
  std::unique_lock<std::mutex> lock(pool_->mutex);
  pool_->queue.push_back(task);
  if (pool_->queue.size() > pool_->idle) {
    Worker& worker = pool_->workers.emplace_back();
    worker.thread = std::thread(work, pool_, &worker);
  } else {
    pool_->work_cv.notify_one();
  }
  if (!task->done_cv.wait_until(lock, deadline.at, [&] { return task->result.has_value(); })) {
    task->abandoned = true;
    pool_->abandoned = true;
    return call_deadline_status(what, name_);
  }
  return std::move(*task->result);
}

bool CallRunner::abandoned() const {
  std::lock_guard<std::mutex> lock(pool_->mutex);
  return pool_->abandoned;
}

namespace {

void work(const std::shared_ptr<CallRunner::Pool>& pool, Worker* self) {
  std::unique_lock<std::mutex> lock(pool->mutex);
  for (;;) {
    ++pool->idle;
    pool->work_cv.wait(lock, [&] { return pool->stopping || !pool->queue.empty(); });
    --pool->idle;
    if (pool->queue.empty()) return;
    self->current = std::move(pool->queue.front());
    pool->queue.pop_front();
    // A call whose caller gave up before it started is not made late.
    if (!self->current->abandoned) {
      lock.unlock();
      Status status = self->current->call();
      lock.lock();
      self->current->result = std::move(status);
      self->current->done_cv.notify_all();
    }
    self->current.reset();
  }
}

}  // namespace

}  // namespace zerowait::internal
