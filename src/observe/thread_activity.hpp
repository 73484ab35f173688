// Classifies a job's main thread (tid == pid) from /proc: its state, the system call it is in
// (/proc/PID/task/TID/syscall) and what that call's file descriptor is (/proc/PID/fd/N). Read
// through host::System, so fixture trees stand in for /proc in tests.
#pragma once

#include <sys/types.h>

#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "host/system.hpp"
#include "zerowait/observe/activity.hpp"

namespace zerowait::observe {

// What a file descriptor's /proc/PID/fd link points at.
enum class FdKind { kUnknown, kRegularFile, kPipe, kSocket, kNvidiaDevice, kOther };

// "/data/x.jpg" -> regular file, "pipe:[123]", "socket:[9]", "/dev/nvidia0"; "/dev/null",
// "anon_inode:[eventpoll]" and the rest -> other.
FdKind fd_kind_of_link(std::string_view target);

// This build's number of a system call ("read" -> 0 on x86_64, 63 on aarch64); nullopt for a
// name the table does not hold. Tests write fixture syscall files with it.
std::optional<long> syscall_number(std::string_view name);

struct ThreadActivity {
  Activity activity = Activity::kOther;
  std::string detail;     // "read on /data/x.jpg", "running", "futex, children and a pipe"
  bool degraded = false;  // the syscall file was unreadable (no ptrace rights): state only
  bool running = false;   // running in user space (input: unpickling a batch; else compute)
};

// What classify_thread saw at the previous sample: the unix sockets the process held.
struct SocketHistory {
  std::set<std::string> unix_sockets;  // "socket:[INODE]"
};

// Classifies thread `tid` of process `pid`. `has_children`: the process has child processes
// (DataLoader workers feed it through pipes). `history` (may be null): kept by the caller from
// sample to sample, so that a new unix socket to the children marks a batch being unpickled.
// nullopt when the thread is gone or a zombie.
std::optional<ThreadActivity> classify_thread(const host::System& system, pid_t pid, pid_t tid,
                                              bool has_children, SocketHistory* history = nullptr);

// The file descriptors through which a DataLoader's batches reach the process, as "FD TARGET":
// its sockets and its /dev/shm files. Each tensor of a batch comes over a new unix socket and
// keeps its shared-memory file open until the tensor is freed, so the set changes all through
// receiving a batch and releasing the one before, and stands still during compute.
std::set<std::string> batch_channels(const host::System& system, pid_t pid);

// Whether the process runs a zerowait Loader (threads named "zw-loader-N").
bool runs_zerowait_loader(const host::System& system, pid_t pid);

}  // namespace zerowait::observe
