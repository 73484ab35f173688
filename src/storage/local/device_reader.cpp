// DeviceReader: which path a file's reads into GPU memory take (cuFile or POSIX, decided once at
// open, KvikIO's way), and the checks every read makes before either path runs.
#include "zerowait/storage/device_reader.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <optional>
#include <utility>

#include "common/align.hpp"
#include "common/file.hpp"
#include "common/log.hpp"
#include "host/cuda_runtime.hpp"
#include "host/cufile.hpp"
#include "storage/local/device_posix_path.hpp"
#include "storage/local/file_sources.hpp"

namespace zerowait {

using internal::cuda_runtime;

namespace {

// One cuFileRead call covers at most this much, so that the deadline is looked at between calls.
constexpr uint64_t kCufileChunkBytes = uint64_t{1} << 30;
constexpr size_t kMinBounceBytes = size_t{64} << 10;

// Makes `device` the calling thread's current CUDA device until destroyed, then restores the
// one before: the caller's own CUDA code (torch's) must not see its device change.
class CurrentDeviceScope {
 public:
  CurrentDeviceScope() = default;
  CurrentDeviceScope(const CurrentDeviceScope&) = delete;
  CurrentDeviceScope& operator=(const CurrentDeviceScope&) = delete;
  ~CurrentDeviceScope() {
    if (previous_ >= 0 && previous_ != device_) cuda_runtime().set_device(previous_);
  }

  Status enter(int device) {
    const internal::CudaRuntime& rt = cuda_runtime();
    ZW_RETURN_IF_ERROR(internal::cuda_status(rt.get_device(&previous_), "cudaGetDevice"));
    device_ = device;
    if (previous_ == device) return Status::ok();
    return internal::cuda_status(rt.set_device(device),
                                 "cudaSetDevice(" + std::to_string(device) + ")");
  }

 private:
  int previous_ = -1;
  int device_ = -1;
};

// Why cuFile cannot read `file` (opened with O_DIRECT when `direct`), or "" when it can, in
// which case `*registered` holds the registration.
std::string cufile_unusable_reason(GdsMode mode, const internal::File& file, bool direct,
                                   std::optional<internal::CufileFile>* registered) {
  if (!internal::host_destinations_for_testing() && !cuda_runtime().ok) {
    return "no CUDA device (" + cuda_runtime().reason + ")";
  }
  const internal::CufileApi& api = internal::cufile_api();
  if (!api.ok) return api.reason;
  // KvikIO does not try cuFile without /run/udev (it fails with an internal error there); here
  // auto tries, and falls back at open or at the first read, saying so.
  const bool udev = ::access("/run/udev", R_OK | X_OK) == 0;
  const std::string udev_hint =
      udev ? ""
           : " (/run/udev is not readable: cuFile needs it, e.g. --volume /run/udev:/run/udev:ro)";
  if (mode == GdsMode::kAuto && !direct) {
    return "the file system of '" + file.path() + "' refuses O_DIRECT, which cuFile needs";
  }
  if (Status driver = internal::open_cufile_driver(); !driver.is_ok()) {
    return driver.message() + udev_hint;
  }
  Result<internal::CufileFile> handle = internal::CufileFile::register_fd(file.fd(), file.path());
  if (!handle.is_ok()) {
    return handle.status().message() + (direct ? "" : " (opened without O_DIRECT: refused)") +
           udev_hint;
  }
  registered->emplace(std::move(handle).value());
  return "";
}

std::string cufile_description(bool* compat_mode) {
  const internal::CufileEvidence evidence = internal::cufile_evidence();
  *compat_mode = evidence.compat_mode();
  std::string text = "cuFile (" + evidence.library;
  if (evidence.version != 0) text += ", version " + std::to_string(evidence.version);
  text += ")";
  if (*compat_mode) {
    text += " in its compatibility mode: no nvidia-fs (" + evidence.nvidia_fs +
            "), so cuFile reads through host memory itself";
  }
  return text;
}

}  // namespace

struct DeviceReader::State {
  std::string path;
  uint64_t size = 0;
  DeviceReaderOptions options;
  bool direct = false;  // `file` is open with O_DIRECT
  internal::File file;
  std::optional<internal::CufileFile> cufile;  // declared after `file`: deregistered first
  // gds=auto chose cuFile, and no read has succeeded through it yet: a failing first read
  // switches the reader to the POSIX path instead of failing.
  bool cufile_unproven = false;
  std::mutex mutex;  // serializes reads; guards everything below
  DeviceReaderStats stats;
  int device = -1;  // the GPU every destination is on; set by the first read
  std::unique_ptr<internal::DeviceCopier> copier;

  // Switches to the POSIX path for `why` (gds=auto's fallback: noted once, counted).
  Status fall_back_to_posix(const std::string& why);
  Status check_requests(std::span<const DeviceReadRequest> requests);
  Status read_cufile(std::span<const DeviceReadRequest> requests, Deadline deadline);
  Status read_posix(std::span<const DeviceReadRequest> requests, Deadline deadline);
};

const char* gds_mode_name(GdsMode mode) {
  switch (mode) {
    case GdsMode::kAuto:
      return "auto";
    case GdsMode::kOn:
      return "on";
    case GdsMode::kOff:
      return "off";
  }
  return "auto";
}

Result<GdsMode> parse_gds_mode(std::string_view name) {
  for (const GdsMode mode : {GdsMode::kAuto, GdsMode::kOn, GdsMode::kOff}) {
    if (name == gds_mode_name(mode)) return mode;
  }
  return invalid_argument("unknown gds mode '" + std::string(name) +
                          "': choose auto (cuFile where it works), on (cuFile or an error) or "
                          "off (zerowait's POSIX path)");
}

Result<std::unique_ptr<DeviceReader>> DeviceReader::open(const std::string& path,
                                                         const DeviceReaderOptions& options) {
  if (options.bounce_bytes < kMinBounceBytes || options.bounce_bytes % kDirectIoAlignment != 0) {
    return invalid_argument("bounce_bytes must be a multiple of 4096 of at least 64 KiB, not " +
                            std::to_string(options.bounce_bytes));
  }
  auto state = std::make_unique<State>();
  state->path = path;
  state->options = options;
  if (options.direct || options.mode != GdsMode::kOff) {
    ZW_ASSIGN_OR_RETURN(state->file, internal::open_direct_or_buffered(path, &state->direct));
    state->stats.direct_fallbacks = state->direct ? 0 : 1;
  } else {
    ZW_ASSIGN_OR_RETURN(state->file, internal::File::open_read(path));
  }
  ZW_ASSIGN_OR_RETURN(state->size, state->file.size());

  DeviceReaderStats& stats = state->stats;
  const std::string mode = std::string("gds=") + gds_mode_name(options.mode);
  stats.path = "posix";
  stats.reason = mode;
  if (options.mode != GdsMode::kOff) {
    const std::string why_not =
        cufile_unusable_reason(options.mode, state->file, state->direct, &state->cufile);
    if (why_not.empty()) {
      stats.path = "cufile";
      stats.reason = mode + ": " + cufile_description(&stats.cufile_compat_mode);
      state->cufile_unproven = options.mode == GdsMode::kAuto;
    } else if (options.mode == GdsMode::kOn) {
      return Status(ErrorCode::kUnsupported,
                    mode + ": cannot read '" + path + "' through cuFile: " + why_not);
    } else {
      ZW_RETURN_IF_ERROR(state->fall_back_to_posix(why_not));
    }
  } else {
    ZW_RETURN_IF_ERROR(state->fall_back_to_posix(""));  // gds=off: the POSIX path by choice
  }
  return std::unique_ptr<DeviceReader>(new DeviceReader(std::move(state)));
}

Status DeviceReader::State::fall_back_to_posix(const std::string& why) {
  if (!why.empty()) {
    internal::note_fallback("gds", "GPUDirect Storage (cuFile) is not used: " + why +
                                       "; reading into GPU memory through pinned host buffers");
    stats.gds_fallbacks = 1;
    stats.reason = "gds=auto: " + why;
  }
  stats.path = "posix";
  stats.cufile_compat_mode = false;
  cufile.reset();
  cufile_unproven = false;
  if (direct && !options.direct) {  // the page cache is wanted: O_DIRECT was only for cuFile
    ZW_ASSIGN_OR_RETURN(file, internal::File::open_read(path));
    direct = false;
  }
  stats.direct = direct;
  return Status::ok();
}

DeviceReader::DeviceReader(std::unique_ptr<State> state) : state_(std::move(state)) {}
DeviceReader::~DeviceReader() = default;

const std::string& DeviceReader::path() const { return state_->path; }
uint64_t DeviceReader::size() const { return state_->size; }

DeviceReaderStats DeviceReader::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->stats;
}

Status DeviceReader::read(void* device, uint64_t size, uint64_t offset, Deadline deadline) {
  const DeviceReadRequest request{offset, size, device};
  return read(std::span<const DeviceReadRequest>(&request, 1), deadline);
}

Status DeviceReader::read(std::span<const DeviceReadRequest> requests, Deadline deadline) {
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  ZW_RETURN_IF_ERROR(s.check_requests(requests));
  if (deadline.passed()) {
    return internal::deadline_status(s.path, requests.empty() ? 0 : requests.front().offset,
                                     requests.size());
  }
  CurrentDeviceScope scope;
  if (!internal::host_destinations_for_testing() && s.device >= 0) {
    ZW_RETURN_IF_ERROR(scope.enter(s.device));
  }
  if (s.cufile.has_value()) {
    Status status = s.read_cufile(requests, deadline);
    if (status.code() == ErrorCode::kIo && s.cufile_unproven) {
      ZW_RETURN_IF_ERROR(s.fall_back_to_posix("its first read failed: " + status.message()));
      status = s.read_posix(requests, deadline);
    }
    ZW_RETURN_IF_ERROR(status);
    s.cufile_unproven = false;
  } else {
    ZW_RETURN_IF_ERROR(s.read_posix(requests, deadline));
  }
  s.stats.requests += requests.size();
  return Status::ok();
}

// Ranges inside the file, and destinations in the memory of one GPU (recorded by the first).
Status DeviceReader::State::check_requests(std::span<const DeviceReadRequest> requests) {
  const bool host = internal::host_destinations_for_testing();
  for (const DeviceReadRequest& r : requests) {
    if (r.offset > size || r.size > size - r.offset) {
      return corrupt("short read of '" + path + "' at offset " + std::to_string(r.offset) +
                     ": needs " + std::to_string(r.size) + " bytes, the file has " +
                     std::to_string(size) + " (truncated?)");
    }
    if (r.size == 0 || host) continue;
    if (r.device == nullptr)
      return invalid_argument("a read of '" + path + "' into a null pointer");
    ZW_ASSIGN_OR_RETURN(const int owner, internal::cuda_pointer_device(r.device));
    if (device < 0) device = owner;
    if (owner != device) {
      return invalid_argument("a read of '" + path + "' at offset " + std::to_string(r.offset) +
                              " into memory of GPU " + std::to_string(owner) +
                              "; this reader reads into GPU " + std::to_string(device));
    }
  }
  return Status::ok();
}

Status DeviceReader::State::read_cufile(std::span<const DeviceReadRequest> requests,
                                        Deadline deadline) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const DeviceReadRequest& r = requests[i];
    for (uint64_t done = 0; done < r.size;) {
      if (deadline.passed()) {
        return internal::deadline_status(path, r.offset + done, requests.size() - i);
      }
      const uint64_t chunk = std::min(r.size - done, kCufileChunkBytes);
      ZW_RETURN_IF_ERROR(internal::cufile_read_exact(
          *cufile, path, static_cast<std::byte*>(r.device) + done, chunk, r.offset + done));
      done += chunk;
      stats.cufile_bytes += chunk;
    }
  }
  return Status::ok();
}

Status DeviceReader::State::read_posix(std::span<const DeviceReadRequest> requests,
                                       Deadline deadline) {
  if (copier == nullptr) {
    if (internal::host_destinations_for_testing()) {
      copier = internal::make_host_copier();
    } else if (device < 0) {
      return Status::ok();  // nothing but empty requests so far
    } else {
      ZW_ASSIGN_OR_RETURN(copier, internal::make_cuda_copier(device));
    }
  }
  // Borrowed for this call only: a reader kept open does not hold on to them.
  std::array<internal::PooledBounceBuffer, 2> buffers;
  for (internal::PooledBounceBuffer& buffer : buffers) {
    ZW_ASSIGN_OR_RETURN(buffer, internal::PooledBounceBuffer::borrow(
                                    options.bounce_bytes, copier->wants_pinned_buffers()));
  }
  ZW_RETURN_IF_ERROR(internal::read_through_bounce_buffers(
      file, direct, requests, buffers, options.bounce_bytes, *copier, deadline));
  for (const DeviceReadRequest& r : requests) stats.posix_bytes += r.size;
  return Status::ok();
}

GdsEvidence gds_evidence() {
  const internal::CufileEvidence e = internal::cufile_evidence();
  GdsEvidence out;
  out.cufile_usable = e.library_loaded && e.driver_opened;
  out.compat_mode = e.compat_mode();
  const std::string nvfs = std::to_string(e.nvfs_major) + "." + std::to_string(e.nvfs_minor);
  if (!e.library_loaded) {
    out.summary = "cuFile unavailable: " + e.library;
  } else if (!e.driver_opened) {
    out.summary = "cuFile's driver does not open: " + e.driver;
  } else if (out.compat_mode) {
    out.summary =
        "cuFile runs in its compatibility mode (reads go through host memory): " +
        (e.nvidia_fs_present ? "nvidia-fs version " + nvfs + " reported by cuFile" : e.nvidia_fs);
  } else {
    out.summary = "GPUDirect Storage available: nvidia-fs " + e.nvidia_fs + ", cuFile " +
                  std::to_string(e.version);
  }
  const internal::CudaRuntime& rt = cuda_runtime();
  out.facts = {
      {"library", e.library},
      {"cufile_version", e.version != 0 ? std::to_string(e.version) : "unknown"},
      {"driver", e.library_loaded ? e.driver : "not tried"},
      {"nvidia_fs", e.nvidia_fs},
      {"nvfs_version",
       e.properties_read ? nvfs + " (cuFileDriverGetProperties; 0.0: not in use)" : "unknown"},
      {"allow_compat_mode", e.properties_read
                                ? std::string(e.allow_compat_flag ? "true" : "false") +
                                      " (driver flag); parameter: " + e.allow_compat_parameter
                                : e.allow_compat_parameter},
      {"force_compat_mode", e.force_compat_parameter},
      {"cufile_json", e.config},
      {"run_udev", e.run_udev_readable ? "readable" : "not readable"},
      {"cufile_log", e.log.empty() ? "not set" : e.log},
      {"cuda", rt.ok ? std::to_string(rt.devices) + " device(s)" : rt.reason},
  };
  return out;
}

}  // namespace zerowait
