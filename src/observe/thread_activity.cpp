// The main thread's activity, from what /proc says about it. The rules (docs/observe.md,
// "How watch attributes"):
//   running in user space                            -> compute
//   blocked outside a system call in state D         -> input (a page fault on a mapped file)
//   a system call: its rule in kSyscalls below, by what its file descriptor is.
// Only x86_64 and aarch64 numbers are known; elsewhere every call is "other".
#include "observe/thread_activity.hpp"

#include <cstdlib>
#include <set>
#include <sstream>
#include <vector>

#include "observe/proc_reading.hpp"

namespace zerowait::observe {
namespace {

// What a system call means for the job, before its file descriptor is looked at.
enum class Rule {
  kFileRead,     // fd 0: regular file -> input; pipe or unix socket with children -> input;
                 // other sockets -> communication
  kFileMeta,     // opening, stat-ing, listing files: input (path arguments are not resolved)
  kFileWrite,    // fd 0: regular file -> checkpoint; socket -> communication
  kFileCommit,   // rename: checkpoint (publishing a written file)
  kWait,         // poll/select/epoll/futex: children and a pipe -> input; else sockets -> comm.
  kFutex,        // like kWait, but never communication: the GIL and every lock wait here too;
                 // with zerowait loader threads: next() waiting for a batch -> input
  kSocket,       // send/recv/connect/accept on fd 0: unix socket with children -> input;
                 // else communication
  kSleep,        // a sleep standing for the accelerator (MLPerf Storage emulation): compute
  kIoctl,        // fd 0: /dev/nvidia* -> compute (a CUDA driver call)
  kYield,        // sched_yield: CUDA's spin-wait for the GPU -> compute
};

struct SyscallRule {
  const char* name;
  long x86_64;   // -1: no such call on this architecture
  long aarch64;
  Rule rule;
};

// Numbers from the kernel's arch/x86/entry/syscalls/syscall_64.tbl and
// include/uapi/asm-generic/unistd.h (aarch64).
constexpr SyscallRule kSyscalls[] = {
    {"read", 0, 63, Rule::kFileRead},
    {"pread64", 17, 67, Rule::kFileRead},
    {"readv", 19, 65, Rule::kFileRead},
    {"preadv", 295, 69, Rule::kFileRead},
    {"preadv2", 327, 286, Rule::kFileRead},
    {"lseek", 8, 62, Rule::kFileRead},
    {"close", 3, 57, Rule::kFileRead},
    {"fadvise64", 221, 223, Rule::kFileRead},
    {"readahead", 187, 213, Rule::kFileRead},
    {"open", 2, -1, Rule::kFileMeta},
    {"openat", 257, 56, Rule::kFileMeta},
    {"stat", 4, -1, Rule::kFileMeta},
    {"fstat", 5, 80, Rule::kFileMeta},
    {"lstat", 6, -1, Rule::kFileMeta},
    {"newfstatat", 262, 79, Rule::kFileMeta},
    {"statx", 332, 291, Rule::kFileMeta},
    {"getdents64", 217, 61, Rule::kFileMeta},
    {"write", 1, 64, Rule::kFileWrite},
    {"pwrite64", 18, 68, Rule::kFileWrite},
    {"writev", 20, 66, Rule::kFileWrite},
    {"pwritev", 296, 70, Rule::kFileWrite},
    {"pwritev2", 328, 287, Rule::kFileWrite},
    {"fsync", 74, 82, Rule::kFileWrite},
    {"fdatasync", 75, 83, Rule::kFileWrite},
    {"sync_file_range", 277, 84, Rule::kFileWrite},
    {"ftruncate", 77, 46, Rule::kFileWrite},
    {"fallocate", 285, 47, Rule::kFileWrite},
    {"rename", 82, -1, Rule::kFileCommit},
    {"renameat", 264, 38, Rule::kFileCommit},
    {"renameat2", 316, 276, Rule::kFileCommit},
    {"poll", 7, -1, Rule::kWait},
    {"ppoll", 271, 73, Rule::kWait},
    {"select", 23, -1, Rule::kWait},
    {"pselect6", 270, 72, Rule::kWait},
    {"epoll_wait", 232, -1, Rule::kWait},
    {"epoll_pwait", 281, 22, Rule::kWait},
    {"epoll_pwait2", 441, 441, Rule::kWait},
    {"futex", 202, 98, Rule::kFutex},
    {"sendto", 44, 206, Rule::kSocket},
    {"recvfrom", 45, 207, Rule::kSocket},
    {"sendmsg", 46, 211, Rule::kSocket},
    {"recvmsg", 47, 212, Rule::kSocket},
    {"sendmmsg", 307, 269, Rule::kSocket},
    {"recvmmsg", 299, 243, Rule::kSocket},
    {"connect", 42, 203, Rule::kSocket},
    {"accept", 43, 202, Rule::kSocket},
    {"accept4", 288, 242, Rule::kSocket},
    {"nanosleep", 35, 101, Rule::kSleep},
    {"clock_nanosleep", 230, 115, Rule::kSleep},
    {"ioctl", 16, 29, Rule::kIoctl},
    {"sched_yield", 24, 124, Rule::kYield},
};

long native_number(const SyscallRule& rule) {
#if defined(__x86_64__)
  return rule.x86_64;
#elif defined(__aarch64__)
  return rule.aarch64;
#else
  (void)rule;
  return -1;
#endif
}

const SyscallRule* find_rule(long number) {
  if (number < 0) return nullptr;
  for (const SyscallRule& rule : kSyscalls) {
    if (native_number(rule) == number) return &rule;
  }
  return nullptr;
}

struct ProcessFds {
  bool pipe = false;
  bool socket = false;
  std::set<std::string> sockets;   // the "socket:[INODE]" links
  std::set<std::string> channels;  // "FD TARGET" of every socket and /dev/shm file
};

ProcessFds scan_fds(const host::System& system, pid_t pid) {
  ProcessFds found;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  for (const std::string& fd : system.list(dir)) {
    const std::optional<std::string> target = system.link_target(dir + "/" + fd);
    if (!target) continue;
    const FdKind kind = fd_kind_of_link(*target);
    found.pipe = found.pipe || kind == FdKind::kPipe;
    found.socket = found.socket || kind == FdKind::kSocket;
    if (kind == FdKind::kSocket) found.sockets.insert(*target);
    if (kind == FdKind::kSocket || target->starts_with("/dev/shm/")) {
      found.channels.insert(fd + " " + *target);
    }
  }
  return found;
}

// The inodes of the unix-domain sockets in the process's network namespace: column 7 of
// /proc/PID/net/unix.
std::set<std::string> unix_socket_inodes(const host::System& system, pid_t pid) {
  std::set<std::string> inodes;
  const std::optional<std::string> table =
      system.read("/proc/" + std::to_string(pid) + "/net/unix");
  if (!table) return inodes;
  std::istringstream lines(*table);
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string field;
    int column = 0;
    while (column < 7 && fields >> field) ++column;
    if (column == 7) inodes.insert(field);
  }
  return inodes;
}

// Whether "socket:[INODE]" is a unix-domain socket of the process. A DataLoader passes each
// batch's shared-memory handles from its workers over one (recvmsg with SCM_RIGHTS); gloo and
// NCCL talk TCP.
bool unix_socket(const std::set<std::string>& inodes, const std::string& target) {
  if (!target.starts_with("socket:[") || !target.ends_with("]")) return false;
  return inodes.count(target.substr(8, target.size() - 9)) != 0;
}

bool unix_socket(const host::System& system, pid_t pid, const std::string& target) {
  return unix_socket(unix_socket_inodes(system, pid), target);
}

// Whether the main thread, running or in a call the table does not hold (socket, mmap), is
// unpickling a batch from child processes: a DataLoader's main process rebuilds each tensor of a
// batch by connecting to the worker that made it over a new unix socket (an authenticated
// handshake, then the shared-memory fd), so a unix socket the previous sample did not see is a
// batch being received. Sockets that stay open from sample to sample (a logging or metrics
// daemon) are not. Updates `history` with what it saw.
bool receiving_batch(const host::System& system, pid_t pid, SocketHistory* history) {
  if (history == nullptr) return false;
  const ProcessFds fds = scan_fds(system, pid);
  std::set<std::string> unix_sockets;
  if (!fds.sockets.empty()) {
    const std::set<std::string> inodes = unix_socket_inodes(system, pid);
    for (const std::string& target : fds.sockets) {
      if (unix_socket(inodes, target)) unix_sockets.insert(target);
    }
  }
  bool fresh = false;
  for (const std::string& target : unix_sockets) {
    fresh = fresh || history->unix_sockets.count(target) == 0;
  }
  history->unix_sockets = std::move(unix_sockets);
  return fresh;
}

ThreadActivity classify_syscall(const host::System& system, pid_t pid, const SyscallRule& call,
                                uint64_t fd_arg, bool has_children) {
  const std::string name = call.name;
  std::string target;
  FdKind kind = FdKind::kUnknown;
  if (call.rule == Rule::kFileRead || call.rule == Rule::kFileWrite ||
      call.rule == Rule::kSocket || call.rule == Rule::kIoctl) {
    const std::string link =
        "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(static_cast<int>(fd_arg));
    target = system.link_target(link).value_or("");
    kind = target.empty() ? FdKind::kUnknown : fd_kind_of_link(target);
  }
  const std::string on = name + " on " + (target.empty() ? "fd " + std::to_string(fd_arg) : target);
  const auto socket_activity = [&]() -> ThreadActivity {
    if (has_children && unix_socket(system, pid, target)) {
      return {Activity::kInput, on + ", a unix socket to child processes"};
    }
    return {Activity::kCommunication, on};
  };
  switch (call.rule) {
    case Rule::kFileRead:
    case Rule::kFileWrite:
      if (kind == FdKind::kRegularFile) {
        return {call.rule == Rule::kFileRead ? Activity::kInput : Activity::kCheckpoint, on};
      }
      if (kind == FdKind::kSocket) return socket_activity();
      if (kind == FdKind::kPipe && call.rule == Rule::kFileRead && has_children) {
        return {Activity::kInput, on + ", from child processes"};
      }
      return {Activity::kOther, on};
    case Rule::kFileMeta:
      return {Activity::kInput, name};
    case Rule::kFileCommit:
      return {Activity::kCheckpoint, name};
    case Rule::kWait:
    case Rule::kFutex: {
      const ProcessFds fds = scan_fds(system, pid);
      if (has_children && fds.pipe) return {Activity::kInput, name + ", children and a pipe"};
      if (call.rule == Rule::kFutex && runs_zerowait_loader(system, pid)) {
        return {Activity::kInput, name + ", zerowait loader threads"};
      }
      if (call.rule == Rule::kWait && fds.socket) {
        return {Activity::kCommunication, name + " with sockets open"};
      }
      return {Activity::kOther, name};
    }
    case Rule::kSocket:
      return socket_activity();
    case Rule::kSleep:
    case Rule::kYield:
      return {Activity::kCompute, name};
    case Rule::kIoctl:
      return {kind == FdKind::kNvidiaDevice ? Activity::kCompute : Activity::kOther, on};
  }
  return {Activity::kOther, name};
}

}  // namespace

std::set<std::string> batch_channels(const host::System& system, pid_t pid) {
  return scan_fds(system, pid).channels;
}

FdKind fd_kind_of_link(std::string_view target) {
  if (target.starts_with("pipe:")) return FdKind::kPipe;
  if (target.starts_with("socket:")) return FdKind::kSocket;
  if (target.starts_with("/dev/nvidia")) return FdKind::kNvidiaDevice;
  if (target.starts_with("/dev/") || target.starts_with("/proc/") ||
      target.starts_with("/sys/") || !target.starts_with("/")) {
    return FdKind::kOther;  // ttys, /dev/null, anon_inode:[eventfd], memfd:...
  }
  return FdKind::kRegularFile;
}

std::optional<long> syscall_number(std::string_view name) {
  for (const SyscallRule& rule : kSyscalls) {
    if (name == rule.name && native_number(rule) >= 0) return native_number(rule);
  }
  return std::nullopt;
}

// Whether the process runs a zerowait Loader: threads named "zw-loader-N" (loader_run.cpp names
// them). Its main thread waiting on a futex is then next() waiting for a batch.
bool runs_zerowait_loader(const host::System& system, pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const std::string& tid : system.list(tasks)) {
    if (system.read_line(tasks + "/" + tid + "/comm").value_or("").starts_with("zw-loader-")) {
      return true;
    }
  }
  return false;
}

std::optional<ThreadActivity> classify_thread(const host::System& system, pid_t pid, pid_t tid,
                                              bool has_children, SocketHistory* history) {
  const std::string task = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid);
  const std::optional<std::string> stat = system.read(task + "/stat");
  if (!stat) return std::nullopt;
  const char state = stat_state(*stat);
  if (state == 'Z' || state == 'X') return std::nullopt;
  // Unreadable without ptrace rights over the process (a --pid of another user's job, or of a
  // process that is not watch's child under Yama's ptrace_scope 1): only the state is left.
  const std::optional<std::string> syscall = system.read(task + "/syscall");
  if (!syscall) {
    ThreadActivity degraded =
        state == 'R'   ? ThreadActivity{Activity::kCompute, "running (no syscall file)"}
        : state == 'D' ? ThreadActivity{Activity::kInput, "state D (no syscall file)"}
                       : ThreadActivity{Activity::kOther, "no syscall file"};
    degraded.degraded = true;
    return degraded;
  }
  const bool receiving = has_children && receiving_batch(system, pid, history);
  if (syscall->starts_with("running")) {
    return receiving ? ThreadActivity{Activity::kInput,
                                      "running, receiving a batch from child "
                                      "processes over a new unix socket",
                                      false, true}
                     : ThreadActivity{Activity::kCompute, "running", false, true};
  }
  std::istringstream fields(*syscall);
  long number = -1;
  std::string first_arg;
  fields >> number >> first_arg;
  if (!fields && first_arg.empty()) {
    return ThreadActivity{Activity::kOther, "unreadable syscall file"};
  }
  if (number < 0) {
    // Blocked outside a system call: in D that is a page fault, most often on a mapped file.
    return state == 'D' ? ThreadActivity{Activity::kInput, "page fault (state D)"}
                        : ThreadActivity{Activity::kOther, "blocked outside a system call"};
  }
  const SyscallRule* rule = find_rule(number);
  if (rule == nullptr) {
    return receiving ? ThreadActivity{Activity::kInput, "syscall " + std::to_string(number) +
                                                            ", receiving a batch from child "
                                                            "processes over a new unix socket"}
                     : ThreadActivity{Activity::kOther, "syscall " + std::to_string(number)};
  }
  const uint64_t fd_arg = std::strtoull(first_arg.c_str(), nullptr, 16);
  return classify_syscall(system, pid, *rule, fd_arg, has_children);
}

}  // namespace zerowait::observe
