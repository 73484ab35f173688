// Reads byte ranges of a local file straight into GPU memory: through NVIDIA cuFile
// (GPUDirect Storage) where it works, else through zerowait's own POSIX path, the way RAPIDS
// KvikIO does. docs/io.md ("Reading into GPU memory") describes the paths and the evidence.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait {

// Whether reads into GPU memory go through cuFile. The names answer "use GPUDirect Storage?":
// KvikIO's CompatMode answers the opposite question (its ON is kOff here).
enum class GdsMode {
  kAuto,  // cuFile when its library loads, its driver opens and the file registers; otherwise
          // the POSIX path, noted once (and why) and counted
  kOn,    // cuFile, or an error that says why it cannot be used
  kOff,   // the POSIX path: O_DIRECT reads into two page-locked bounce buffers, each copied to
          // the GPU (cudaMemcpyAsync on the reader's stream) while the other is being filled
};

// "auto" / "on" / "off".
const char* gds_mode_name(GdsMode mode);
// Parses those names; kInvalidArgument naming the accepted values otherwise.
Result<GdsMode> parse_gds_mode(std::string_view name);

// Read `size` bytes at file offset `offset` into GPU memory at `device`.
struct DeviceReadRequest {
  uint64_t offset = 0;
  uint64_t size = 0;
  void* device = nullptr;
};

struct DeviceReaderOptions {
  GdsMode mode = GdsMode::kAuto;
  // POSIX path: read with O_DIRECT (past the page cache; buffered where the file system refuses
  // it, noted once and counted). false reads through the page cache: for files read again soon.
  bool direct = true;
  // POSIX path: the size of each of the two bounce buffers (a multiple of 4096, >= 64 KiB).
  size_t bounce_bytes = size_t{8} << 20;
};

// What a reader does and did. `path` never changes after open().
struct DeviceReaderStats {
  std::string path;    // "cufile" or "posix": how every read of this reader is served
  std::string reason;  // why that path, e.g. "gds=auto: libcufile.so.0 was not found (...)"
  // path == "cufile", but cuFile itself reads through host memory (no nvidia-fs kernel module:
  // cuFile's compatibility mode). gds_evidence() shows why.
  bool cufile_compat_mode = false;
  bool direct = false;  // path == "posix" and reads use O_DIRECT
  uint64_t requests = 0;
  uint64_t cufile_bytes = 0;
  uint64_t posix_bytes = 0;
  uint64_t gds_fallbacks = 0;     // 1 when gds=auto fell back to the POSIX path at open
  uint64_t direct_fallbacks = 0;  // 1 when the file system refused O_DIRECT at open
};

// A local file open for reads into GPU memory. read() calls on one reader are serialized (it
// owns one CUDA stream and one pair of bounce buffers); open one reader per thread to read in
// parallel. Every error names the file, and for a read the offset.
class DeviceReader {
 public:
  // kNotFound / kIo when the file cannot be opened; with GdsMode::kOn, kUnsupported saying why
  // cuFile cannot be used (no CUDA device, no libcufile, the driver or the file's registration
  // failed) instead of falling back.
  static Result<std::unique_ptr<DeviceReader>> open(const std::string& path,
                                                    const DeviceReaderOptions& options = {});
  ~DeviceReader();
  DeviceReader(const DeviceReader&) = delete;
  DeviceReader& operator=(const DeviceReader&) = delete;

  const std::string& path() const;
  uint64_t size() const;

  // Fills every request completely before returning (the bytes are in GPU memory, no copy in
  // flight), or returns an error: a range past size() is kCorrupt "short read"; memory that is
  // not GPU memory, or of another GPU than the first read's, is kInvalidArgument; no CUDA
  // device is kUnsupported. kDeadlineExceeded when `deadline` passes: checked between chunks
  // (up to 1 GiB for cuFile, one bounce buffer for POSIX), so one chunk already started runs
  // to its end; copies in flight are waited for before returning. Work queued on other CUDA
  // streams is not waited for: synchronize the stream that last used the memory first. After
  // an error the destination's contents are unspecified.
  Status read(std::span<const DeviceReadRequest> requests, Deadline deadline = Deadline::none());
  // One range.
  Status read(void* device, uint64_t size, uint64_t offset, Deadline deadline = Deadline::none());

  DeviceReaderStats stats() const;

  struct State;  // defined in src/io/device_reader.cpp

 private:
  explicit DeviceReader(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// What this machine says about GPUDirect Storage, gathered when asked (opening cuFile's driver
// if its library loads): the evidence that cuFile moves bytes storage -> GPU directly, or runs
// in its compatibility mode (reads through host memory, no nvidia-fs), or cannot run at all.
struct GdsEvidence {
  bool cufile_usable = false;  // the library loaded and its driver opened
  bool compat_mode = false;    // usable, but without nvidia-fs: reads go through host memory
  std::string summary;         // one line: which of the three, and the deciding fact
  // Each fact as (name, value): "library", "cufile_version", "driver", "nvidia_fs",
  // "nvfs_version" (cuFileDriverGetProperties), "allow_compat_mode", "force_compat_mode",
  // "cufile_json", "run_udev", "cufile_log" (where cuFile logs its errors), "cuda".
  std::vector<std::pair<std::string, std::string>> facts;
};
GdsEvidence gds_evidence();

}  // namespace zerowait
