// NVIDIA cuFile (GPUDirect Storage), loaded at run time with dlopen: CUDA is never a build
// dependency. The C declarations used are those of cufile.h (CUDA 12.2 and later); only the
// entry points and structures the device reader needs are mirrored here, with their layouts.
// Without libcufile nothing fails: cufile_api() says why, and the device reader reads through
// its own POSIX path instead (io/device_reader.cpp).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

using CufileHandle_t = void*;  // CUfileHandle_t

// CUfileError_t: a cuFile code (0, or 5000 + n) and, for CU_FILE_CUDA_DRIVER_ERROR, the CUDA
// driver's CUresult. Returned by value (two ints: in a register on x86-64 and aarch64).
struct CufileError {
  int err = 0;
  int cu_err = 0;
};

// CUfileDescr_t with type CU_FILE_HANDLE_TYPE_OPAQUE_FD.
struct CufileDescriptor {
  int type = 1;  // CU_FILE_HANDLE_TYPE_OPAQUE_FD
  union {
    int fd;
    void* handle;
  } handle = {};
  const void* fs_ops = nullptr;
};

// CUfileDrvProps_t. nvfs.major_version and minor_version are 0 when the nvidia-fs kernel module
// is not in use: cuFile then serves reads itself through host memory (its compatibility mode).
struct CufileDriverProperties {
  struct {
    unsigned major_version = 0;
    unsigned minor_version = 0;
    size_t poll_thresh_size = 0;    // KiB
    size_t max_direct_io_size = 0;  // KiB
    unsigned dstatusflags = 0;
    unsigned dcontrolflags = 0;  // bit 1: CU_FILE_ALLOW_COMPAT_MODE
  } nvfs;
  unsigned fflags = 0;
  unsigned max_device_cache_size = 0;
  unsigned per_buffer_cache_size = 0;
  unsigned max_device_pinned_mem_size = 0;
  unsigned max_batch_io_size = 0;
  unsigned max_batch_io_timeout_msecs = 0;
  // Room for fields a newer library may append, so that it never writes past this object.
  unsigned char reserved[256] = {};
};

inline constexpr int kCufileBaseError = 5000;  // CUFILEOP_BASE_ERR
inline constexpr int kCufileDriverAlreadyOpen = kCufileBaseError + 26;
inline constexpr unsigned kCufileAllowCompatModeFlag = 1u << 1;
// CUFileBoolConfigParameter_t values (cuFile 1.14 and later).
inline constexpr int kCufileParamAllowCompatMode = 1;
inline constexpr int kCufileParamForceCompatMode = 2;

// The entry points, resolved together; `ok` only when every required one is there.
struct CufileApi {
  bool ok = false;
  std::string reason;   // why not, when !ok: the library not found, or an entry point missing
  std::string library;  // the file actually loaded (from the dynamic linker's map)
  int version = 0;      // cuFileGetVersion (e.g. 1150 for 1.15.0); 0 where it is absent

  CufileError (*driver_open)() = nullptr;
  CufileError (*driver_get_properties)(CufileDriverProperties*) = nullptr;
  CufileError (*handle_register)(CufileHandle_t*, CufileDescriptor*) = nullptr;
  void (*handle_deregister)(CufileHandle_t) = nullptr;
  CufileError (*buf_register)(const void*, size_t, int) = nullptr;
  CufileError (*buf_deregister)(const void*) = nullptr;
  // Returns the bytes read (fewer near the end of the file, 0 at it), -1 with errno for an OS
  // error, or a negated cuFile code.
  ssize_t (*read)(CufileHandle_t, void*, size_t, off_t, off_t) = nullptr;
  // Optional: null where the library predates them.
  CufileError (*get_version)(int*) = nullptr;
  CufileError (*get_parameter_bool)(int, bool*) = nullptr;
};

// Loads libcufile: `override_path` when not empty, else a copy the process already holds
// (RTLD_NOLOAD: one that Python preloaded from the nvidia-cufile wheel), else libcufile.so.0 and
// libcufile.so from the linker's search path. Not cached: cufile_api() is.
CufileApi load_cufile(const std::string& override_path);

// load_cufile($ZEROWAIT_CUFILE_LIBRARY), once per process. Thread-safe.
const CufileApi& cufile_api();

// Opens the cuFile driver, once per process (later calls return the first call's status; the
// driver stays open until the process exits, as cuFile allows). Requires cufile_api().ok; with
// a CUDA device, the calling thread's current device's context is made current first. Unless
// CUFILE_LOGFILE_PATH is set, sets it to $TMPDIR/zerowait-cufile-<pid>.log first (cuFile's own
// default is ./cufile.log).
Status open_cufile_driver();

// "CU_FILE_DRIVER_NOT_INITIALIZED (5001)"-style text for a cuFile code, or strerror for an
// errno value (a code below 5000).
std::string cufile_error_text(int code);
// ok for err == 0; else kIo "WHAT: <cufile_error_text>" (with the CUresult when there is one).
Status cufile_status(CufileError error, const std::string& what);

// A file registered with cuFile (cuFileHandleRegister), deregistered when destroyed. Move-only;
// the file descriptor must outlive it.
class CufileFile {
 public:
  // kIo naming `path` and cuFile's reason when registration fails; requires an open driver.
  static Result<CufileFile> register_fd(int fd, const std::string& path);
  CufileFile() = default;
  ~CufileFile();
  CufileFile(CufileFile&& other) noexcept;
  CufileFile& operator=(CufileFile&& other) noexcept;
  CufileFile(const CufileFile&) = delete;
  CufileFile& operator=(const CufileFile&) = delete;

  CufileHandle_t handle() const { return handle_; }

 private:
  CufileHandle_t handle_ = nullptr;
};

// Device memory registered with cuFile (cuFileBufRegister) for the lifetime of this object:
// optional, it saves cuFile its own bounce buffers when the same memory is read into many times.
class CufileBuffer {
 public:
  static Result<CufileBuffer> register_memory(const void* device, size_t bytes);
  CufileBuffer() = default;
  ~CufileBuffer();
  CufileBuffer(CufileBuffer&& other) noexcept;
  CufileBuffer& operator=(CufileBuffer&& other) noexcept;
  CufileBuffer(const CufileBuffer&) = delete;
  CufileBuffer& operator=(const CufileBuffer&) = delete;

 private:
  const void* device_ = nullptr;
};

// Reads `bytes` at `offset` of a registered file into device memory `device`, calling cuFileRead
// until all of it is there (it may return less). A file that ends first is kCorrupt "short read"
// naming `path`; a failed call is kIo naming the path, the offset and cuFile's or the OS's reason.
Status cufile_read_exact(const CufileFile& file, const std::string& path, void* device,
                         uint64_t bytes, uint64_t offset);

// What the machine says about GPUDirect Storage: the evidence behind "cuFile runs in its
// compatibility mode here". Gathered when asked; opens the driver if the library loads.
struct CufileEvidence {
  bool library_loaded = false;
  std::string library;  // path loaded, or why not
  int version = 0;
  bool driver_opened = false;
  std::string driver;  // "opened", or the error
  bool nvidia_fs_present = false;
  std::string nvidia_fs;  // the contents of /proc/driver/nvidia-fs/version, or "absent"
  bool properties_read = false;
  unsigned nvfs_major = 0, nvfs_minor = 0;
  bool allow_compat_flag = false;  // dcontrolflags' CU_FILE_ALLOW_COMPAT_MODE
  // cuFileGetParameterBool: "true", "false" or "unknown (why)".
  std::string allow_compat_parameter = "unknown";
  std::string force_compat_parameter = "unknown";
  std::string config;  // the cufile.json in effect, or "none (cuFile's built-in defaults)"
  bool run_udev_readable = false;
  std::string log;  // CUFILE_LOGFILE_PATH: where cuFile writes what went wrong

  // cuFile works but does its reads itself, through host memory: no nvidia-fs.
  bool compat_mode() const {
    return driver_opened && (!nvidia_fs_present || (nvfs_major == 0 && nvfs_minor == 0));
  }
};
CufileEvidence cufile_evidence();

// Tests: replaces the process's library with load_cufile(`library`) and forgets the driver's
// state, so a test can load a stand-in library. No cuFile handle may be alive.
void reset_cufile_for_testing(const std::string& library);

}  // namespace zerowait::internal
