#include "host/thread_priority.hpp"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace zerowait::internal {

void yield_cpu_to_others(int nice) {
  if (nice <= 0) return;
  sched_param param{};
  pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
  const auto tid = static_cast<id_t>(syscall(SYS_gettid));
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, tid);
  if (errno == 0) setpriority(PRIO_PROCESS, tid, std::min(19, current + nice));
}

}  // namespace zerowait::internal
