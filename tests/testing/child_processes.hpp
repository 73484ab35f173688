// Child processes of a test that start together and cannot hang the suite.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace zerowait::testing {

// Child processes that start together. A child forked while a thread of the parent (the test
// server answering an earlier child) holds an allocator lock inherits that lock held forever:
// GCC 12's ASan runtime takes no locks around fork. So every child is forked first and waits on
// a pipe; they run once start() closes it, while the parent's threads are idle.
class ChildProcesses {
 public:
  ChildProcesses() {
    if (::pipe2(go_, O_CLOEXEC) != 0) ADD_FAILURE() << "pipe: " << std::strerror(errno);
  }
  ~ChildProcesses() {
    start();
    for (pid_t pid : pids_) ::kill(pid, SIGKILL), ::waitpid(pid, nullptr, 0);
  }

  pid_t add(const std::function<int()>& body) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(go_[1]);
      char c;
      while (::read(go_[0], &c, 1) < 0 && errno == EINTR) {
      }
      ::_exit(body());
    }
    pids_.push_back(pid);
    return pid;
  }

  void start() {
    if (go_[1] >= 0) ::close(go_[1]);
    go_[1] = -1;
  }

  // The exit code of `pid` (128 + signal if killed); a child still running after `limit` is
  // killed and reported as 128 + SIGKILL with a test failure, so a hang fails instead of
  // stalling the suite.
  int wait(pid_t pid, std::chrono::seconds limit = std::chrono::seconds(120)) {
    start();
    int status = 0;
    const auto give_up = std::chrono::steady_clock::now() + limit;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        ADD_FAILURE() << "child " << pid << " still running after " << limit.count() << " s";
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::erase(pids_, pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  int go_[2] = {-1, -1};
  std::vector<pid_t> pids_;
};

}  // namespace zerowait::testing
