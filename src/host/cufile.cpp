#include "host/cufile.hpp"

#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "common/file.hpp"
#include "host/cuda_runtime.hpp"
#include "host/dynamic_library.hpp"

namespace zerowait::internal {
namespace {

constexpr const char* kOverrideVariable = "ZEROWAIT_CUFILE_LIBRARY";
constexpr const char* kNvidiaFsVersion = "/proc/driver/nvidia-fs/version";
// One cuFileRead call reads at most this much, so that a long read of a huge range still
// returns to its caller's loop (and an error names an offset near where it happened).
constexpr uint64_t kMaxCufileReadBytes = uint64_t{1} << 30;

std::string loaded_file(void* lib, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

// Returns the library handle (and the name it was found under), or null with `why` set.
void* open_library(const std::string& override_path, std::string* name, std::string* why) {
  if (!override_path.empty()) {
    *name = override_path;
    void* lib = dlopen(override_path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr)
      *why = "$" + std::string(kOverrideVariable) + "=" + override_path + ": " + dl_error();
    return lib;
  }
  std::string errors;
  if (void* lib = open_first_library({"libcufile.so.0", "libcufile.so"}, name, &errors)) {
    return lib;
  }
  *why = "libcufile.so.0 was not found (" + errors +
         "); `pip install nvidia-cufile` provides it, and importing zerowait.gds preloads it";
  return nullptr;
}

// The process's library and driver state: replaced only by reset_cufile_for_testing().
struct CufileState {
  std::mutex mutex;
  std::unique_ptr<CufileApi> api;
  std::vector<std::unique_ptr<CufileApi>> retired;  // replaced by tests, kept for late readers
  bool driver_tried = false;
  Status driver_status;
};

CufileState& state() {
  static auto* s = new CufileState();  // outlives exit: handles may be released late
  return *s;
}

std::string read_first_line(const char* path, bool* present) {
  std::ifstream in(path);
  *present = in.good();
  std::string text;
  if (*present) std::getline(in, text);
  return text;
}

std::string config_in_effect() {
  if (const char* env = std::getenv("CUFILE_ENV_PATH_JSON"); env != nullptr && *env != '\0') {
    return std::string(env) + (::access(env, R_OK) == 0
                                   ? " (CUFILE_ENV_PATH_JSON)"
                                   : " (CUFILE_ENV_PATH_JSON, not readable: built-in defaults)");
  }
  if (::access("/etc/cufile.json", R_OK) == 0) return "/etc/cufile.json";
  return "none (cuFile's built-in defaults)";
}

// cuFile writes its log into the working directory unless CUFILE_LOGFILE_PATH says otherwise
// (read when the driver opens): a file of this process's own under $TMPDIR instead, so that a
// repository or a job's directory does not collect cufile.log files. Called with the lock held.
void set_default_log_path() {
  if (std::getenv("CUFILE_LOGFILE_PATH") != nullptr) return;
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
                           "/zerowait-cufile-" + std::to_string(::getpid()) + ".log";
  ::setenv("CUFILE_LOGFILE_PATH", path.c_str(), 0);
}

std::string bool_parameter(const CufileApi& api, int parameter) {
  if (api.get_parameter_bool == nullptr) return "unknown (no cuFileGetParameterBool)";
  bool value = false;
  const CufileError error = api.get_parameter_bool(parameter, &value);
  if (error.err != 0) return "unknown (" + cufile_error_text(error.err) + ")";
  return value ? "true" : "false";
}

}  // namespace

CufileApi load_cufile(const std::string& override_path) {
  CufileApi api;
  std::string name;
  void* lib = open_library(override_path, &name, &api.reason);
  if (lib == nullptr) return api;
  api.library = loaded_file(lib, name);
  // The header's cuFileDriverClose is cuFileDriverClose_v2; the driver is never closed here.
  const bool complete = resolve(lib, "cuFileDriverOpen", api.driver_open) &&
                        resolve(lib, "cuFileDriverGetProperties", api.driver_get_properties) &&
                        resolve(lib, "cuFileHandleRegister", api.handle_register) &&
                        resolve(lib, "cuFileHandleDeregister", api.handle_deregister) &&
                        resolve(lib, "cuFileBufRegister", api.buf_register) &&
                        resolve(lib, "cuFileBufDeregister", api.buf_deregister) &&
                        resolve(lib, "cuFileRead", api.read);
  if (!complete) {
    api.reason = api.library + " lacks an entry point zerowait uses: " + dl_error();
    return api;
  }
  resolve(lib, "cuFileGetVersion", api.get_version);
  resolve(lib, "cuFileGetParameterBool", api.get_parameter_bool);
  if (api.get_version != nullptr && api.get_version(&api.version).err != 0) api.version = 0;
  api.ok = true;
  return api;
}

const CufileApi& cufile_api() {
  CufileState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.api == nullptr) {
    const char* override_path = std::getenv(kOverrideVariable);
    s.api = std::make_unique<CufileApi>(load_cufile(override_path != nullptr ? override_path : ""));
  }
  return *s.api;
}

Status open_cufile_driver() {
  const CufileApi& api = cufile_api();
  if (!api.ok) return Status(ErrorCode::kUnsupported, api.reason);
  CufileState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.driver_tried) return s.driver_status;
  s.driver_tried = true;
  // cuFile works in the calling thread's CUDA context: make the primary context current.
  const CudaRuntime& rt = cuda_runtime();
  if (rt.ok) {
    int device = 0;
    if (rt.get_device(&device) == 0) rt.set_device(device);
  }
  set_default_log_path();
  CufileError error = api.driver_open();
  // Someone else in the process (torch, KvikIO) opened it first: it is open, which is the point.
  if (error.err == kCufileDriverAlreadyOpen) error = {};
  s.driver_status = cufile_status(error, "cuFileDriverOpen (" + api.library + ")");
  if (const char* log = std::getenv("CUFILE_LOGFILE_PATH"); !s.driver_status.is_ok() && log) {
    s.driver_status = Status(s.driver_status.code(),
                             s.driver_status.message() + " (details in cuFile's log, " + log + ")");
  }
  return s.driver_status;
}

std::string cufile_error_text(int code) {
  if (code < kCufileBaseError) return std::strerror(code);
  // The names of cufile.h's CUfileOpError, by their offset from CUFILEOP_BASE_ERR.
  static constexpr const char* kNames[] = {nullptr,
                                           "DRIVER_NOT_INITIALIZED",
                                           "DRIVER_INVALID_PROPS",
                                           "DRIVER_UNSUPPORTED_LIMIT",
                                           "DRIVER_VERSION_MISMATCH",
                                           "DRIVER_VERSION_READ_ERROR",
                                           "DRIVER_CLOSING",
                                           "PLATFORM_NOT_SUPPORTED",
                                           "IO_NOT_SUPPORTED",
                                           "DEVICE_NOT_SUPPORTED",
                                           "NVFS_DRIVER_ERROR",
                                           "CUDA_DRIVER_ERROR",
                                           "CUDA_POINTER_INVALID",
                                           "CUDA_MEMORY_TYPE_INVALID",
                                           "CUDA_POINTER_RANGE_ERROR",
                                           "CUDA_CONTEXT_MISMATCH",
                                           "INVALID_MAPPING_SIZE",
                                           "INVALID_MAPPING_RANGE",
                                           "INVALID_FILE_TYPE",
                                           "INVALID_FILE_OPEN_FLAG",
                                           "DIO_NOT_SET",
                                           nullptr,
                                           "INVALID_VALUE",
                                           "MEMORY_ALREADY_REGISTERED",
                                           "MEMORY_NOT_REGISTERED",
                                           "PERMISSION_DENIED",
                                           "DRIVER_ALREADY_OPEN",
                                           "HANDLE_NOT_REGISTERED",
                                           "HANDLE_ALREADY_REGISTERED",
                                           "DEVICE_NOT_FOUND",
                                           "INTERNAL_ERROR",
                                           "GETNEWFD_FAILED",
                                           nullptr,
                                           "NVFS_SETUP_ERROR",
                                           "IO_DISABLED",
                                           "BATCH_SUBMIT_FAILED",
                                           "GPU_MEMORY_PINNING_FAILED",
                                           "BATCH_FULL",
                                           "ASYNC_NOT_SUPPORTED",
                                           "INTERNAL_BATCH_SETUP_ERROR",
                                           "INTERNAL_BATCH_SUBMIT_ERROR",
                                           "INTERNAL_BATCH_GETSTATUS_ERROR",
                                           "INTERNAL_BATCH_CANCEL_ERROR",
                                           "NOMEM_ERROR",
                                           "IO_ERROR",
                                           "INTERNAL_BUF_REGISTER_ERROR",
                                           "HASH_OPR_ERROR",
                                           "INVALID_CONTEXT_ERROR",
                                           "NVFS_INTERNAL_DRIVER_ERROR",
                                           "BATCH_NOCOMPAT_ERROR"};
  // cufile.h's own words for the codes a first run is likely to meet.
  static constexpr std::pair<int, const char*> kMeanings[] = {
      {5001,
       "nvidia-fs driver is not loaded; allow_compat_mode in cufile.json enables "
       "compatibility mode"},
      {5007, "GPUDirect Storage not supported on current platform"},
      {5008, "GPUDirect Storage not supported on current file"},
      {5009, "GPUDirect Storage not supported on current GPU"},
      {5011, "CUDA Driver API error"},
      {5019, "unsupported file open flags"},
      {5020, "fd direct IO not set"},
      {5030, "internal error"},
      {5033, "NVFS driver initialization error"},
      {5049, "compat mode off error"}};
  const int index = code - kCufileBaseError;
  const char* name = index < static_cast<int>(std::size(kNames)) ? kNames[index] : nullptr;
  std::string text =
      std::string("CU_FILE_") + (name != nullptr ? name : "ERROR") + " (" + std::to_string(code);
  for (const auto& [known, meaning] : kMeanings) {
    if (known == code) text += std::string(": ") + meaning;
  }
  return text + ")";
}

Status cufile_status(CufileError error, const std::string& what) {
  if (error.err == 0) return Status::ok();
  std::string message = what + ": " + cufile_error_text(error.err);
  if (error.cu_err != 0) message += " (CUresult " + std::to_string(error.cu_err) + ")";
  return Status(ErrorCode::kIo, message);
}

Result<CufileFile> CufileFile::register_fd(int fd, const std::string& path) {
  const CufileApi& api = cufile_api();
  if (!api.ok) return Status(ErrorCode::kUnsupported, api.reason);
  CufileDescriptor descriptor;
  descriptor.handle.fd = fd;
  CufileFile file;
  ZW_RETURN_IF_ERROR(cufile_status(api.handle_register(&file.handle_, &descriptor),
                                   "cuFileHandleRegister('" + path + "')"));
  return file;
}

CufileFile::~CufileFile() {
  if (handle_ != nullptr) cufile_api().handle_deregister(handle_);
}

CufileFile::CufileFile(CufileFile&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)) {}

CufileFile& CufileFile::operator=(CufileFile&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) cufile_api().handle_deregister(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

Result<CufileBuffer> CufileBuffer::register_memory(const void* device, size_t bytes) {
  const CufileApi& api = cufile_api();
  if (!api.ok) return Status(ErrorCode::kUnsupported, api.reason);
  ZW_RETURN_IF_ERROR(open_cufile_driver());
  ZW_RETURN_IF_ERROR(cufile_status(api.buf_register(device, bytes, 0),
                                   "cuFileBufRegister(" + std::to_string(bytes) + " bytes)"));
  CufileBuffer buffer;
  buffer.device_ = device;
  return buffer;
}

CufileBuffer::~CufileBuffer() {
  if (device_ != nullptr) cufile_api().buf_deregister(device_);
}

CufileBuffer::CufileBuffer(CufileBuffer&& other) noexcept
    : device_(std::exchange(other.device_, nullptr)) {}

CufileBuffer& CufileBuffer::operator=(CufileBuffer&& other) noexcept {
  if (this != &other) {
    if (device_ != nullptr) cufile_api().buf_deregister(device_);
    device_ = std::exchange(other.device_, nullptr);
  }
  return *this;
}

Status cufile_read_exact(const CufileFile& file, const std::string& path, void* device,
                         uint64_t bytes, uint64_t offset) {
  const CufileApi& api = cufile_api();
  uint64_t done = 0;
  while (done < bytes) {
    const uint64_t ask = std::min(bytes - done, kMaxCufileReadBytes);
    errno = 0;
    const ssize_t n = api.read(file.handle(), device, ask, static_cast<off_t>(offset + done),
                               static_cast<off_t>(done));
    if (n < 0) {
      const int err = errno;
      if (n == -1 && err == EINTR) continue;
      const std::string why = n == -1 ? std::string(std::strerror(err != 0 ? err : EIO))
                                      : cufile_error_text(static_cast<int>(-n));
      return io_error("cuFileRead of '" + path + "' at offset " + std::to_string(offset + done) +
                      " (" + std::to_string(ask) + " bytes): " + why);
    }
    if (n == 0) return short_read_status(path, offset + done, bytes - done);
    done += static_cast<uint64_t>(n);
  }
  return Status::ok();
}

CufileEvidence cufile_evidence() {
  CufileEvidence e;
  e.nvidia_fs = read_first_line(kNvidiaFsVersion, &e.nvidia_fs_present);
  if (!e.nvidia_fs_present) e.nvidia_fs = std::string(kNvidiaFsVersion) + ": absent";
  e.config = config_in_effect();
  e.run_udev_readable = ::access("/run/udev", R_OK | X_OK) == 0;
  const CufileApi& api = cufile_api();
  e.library_loaded = api.ok;
  e.library = api.ok ? api.library : api.reason;
  e.version = api.version;
  if (!api.ok) return e;
  const Status driver = open_cufile_driver();
  e.driver_opened = driver.is_ok();
  e.driver = driver.is_ok() ? "opened" : driver.message();
  if (const char* log = std::getenv("CUFILE_LOGFILE_PATH")) e.log = log;
  e.allow_compat_parameter = bool_parameter(api, kCufileParamAllowCompatMode);
  e.force_compat_parameter = bool_parameter(api, kCufileParamForceCompatMode);
  if (!e.driver_opened) return e;
  CufileDriverProperties properties;
  if (api.driver_get_properties(&properties).err == 0) {
    e.properties_read = true;
    e.nvfs_major = properties.nvfs.major_version;
    e.nvfs_minor = properties.nvfs.minor_version;
    e.allow_compat_flag = (properties.nvfs.dcontrolflags & kCufileAllowCompatModeFlag) != 0;
  }
  return e;
}

void reset_cufile_for_testing(const std::string& library) {
  CufileState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  // The previous API stays allocated: a caller may still hold a reference to it.
  if (s.api != nullptr) s.retired.push_back(std::move(s.api));
  s.api = std::make_unique<CufileApi>(load_cufile(library));
  s.driver_tried = false;
  s.driver_status = Status::ok();
}

}  // namespace zerowait::internal
