// A stand-in for libcufile with the same C entry points, so that the device reader's cuFile path
// (loading, driver, registration, the read loop, error texts, evidence) runs in tests without a
// GPU: "device" memory is host memory and cuFileRead is pread. Its behaviour is set per call by
// environment variables, so one test process can try several:
//   ZW_FAKE_CUFILE_DRIVER_ERROR=N    cuFileDriverOpen fails with cuFile code N
//   ZW_FAKE_CUFILE_REGISTER_ERROR=N  cuFileHandleRegister fails with cuFile code N
//   ZW_FAKE_CUFILE_READ_ERROR=N      cuFileRead returns -N (a cuFile code, or 1 for -1 + EIO)
//   ZW_FAKE_CUFILE_MAX_READ=N        cuFileRead returns at most N bytes a call
//   ZW_FAKE_CUFILE_NVFS=MAJOR.MINOR  the nvidia-fs version cuFileDriverGetProperties reports
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct Error {
  int err;
  int cu_err;
};

struct Descriptor {
  int type;
  union {
    int fd;
    void* handle;
  } handle;
  const void* fs_ops;
};

struct Properties {
  struct {
    unsigned major_version;
    unsigned minor_version;
    size_t poll_thresh_size;
    size_t max_direct_io_size;
    unsigned dstatusflags;
    unsigned dcontrolflags;
  } nvfs;
  unsigned fflags;
  unsigned rest[5];
};

std::atomic<long> open_handles{0};
std::atomic<long> reads{0};

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : 0;
}

// Handles are a file descriptor of their own plus one (so that fd 0 is not a null handle),
// opened without O_DIRECT: like cuFile in its compatibility mode, any offset, size and buffer
// address work.
int fd_of(void* handle) { return static_cast<int>(reinterpret_cast<intptr_t>(handle)) - 1; }

}  // namespace

extern "C" {

Error cuFileDriverOpen() { return {env_int("ZW_FAKE_CUFILE_DRIVER_ERROR"), 0}; }

Error cuFileDriverGetProperties(Properties* properties) {
  std::memset(properties, 0, sizeof(*properties));
  if (const char* nvfs = std::getenv("ZW_FAKE_CUFILE_NVFS")) {
    std::sscanf(nvfs, "%u.%u", &properties->nvfs.major_version, &properties->nvfs.minor_version);
  }
  properties->nvfs.dcontrolflags = 1u << 1;  // CU_FILE_ALLOW_COMPAT_MODE
  return {0, 0};
}

Error cuFileGetVersion(int* version) {
  *version = 1150;
  return {0, 0};
}

Error cuFileHandleRegister(void** handle, Descriptor* descriptor) {
  if (const int err = env_int("ZW_FAKE_CUFILE_REGISTER_ERROR"); err != 0) return {err, 0};
  const std::string self = "/proc/self/fd/" + std::to_string(descriptor->handle.fd);
  const int fd = ::open(self.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {5000 + 30, 0};  // CU_FILE_INTERNAL_ERROR
  *handle = reinterpret_cast<void*>(static_cast<intptr_t>(fd) + 1);
  ++open_handles;
  return {0, 0};
}

void cuFileHandleDeregister(void* handle) {
  ::close(fd_of(handle));
  --open_handles;
}

Error cuFileBufRegister(const void*, size_t, int) { return {0, 0}; }
Error cuFileBufDeregister(const void*) { return {0, 0}; }

ssize_t cuFileRead(void* handle, void* buffer, size_t size, off_t file_offset,
                   off_t buffer_offset) {
  ++reads;
  if (const int err = env_int("ZW_FAKE_CUFILE_READ_ERROR"); err != 0) {
    if (err != 1) return -err;
    errno = EIO;
    return -1;
  }
  if (const int most = env_int("ZW_FAKE_CUFILE_MAX_READ"); most > 0 && size > size_t(most)) {
    size = static_cast<size_t>(most);
  }
  return ::pread(fd_of(handle), static_cast<char*>(buffer) + buffer_offset, size, file_offset);
}

// For the tests: registrations not yet undone, and cuFileRead calls so far.
long zw_fake_cufile_open_handles() { return open_handles.load(); }
long zw_fake_cufile_reads() { return reads.load(); }

}  // extern "C"
