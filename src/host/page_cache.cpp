#include "zerowait/host/page_cache.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <vector>

#include "common/file.hpp"

namespace zerowait {

namespace {

// Files are mapped this much at a time for mincore(): 1 GiB of address space, 256 Ki flags.
constexpr uint64_t kWindowBytes = uint64_t{1} << 30;
// Reads of a warm-up: large enough for the device's full speed, small enough to skip resident
// parts of a file.
constexpr uint64_t kChunkBytes = uint64_t{4} << 20;

uint64_t page_size() { return uint64_t(sysconf(_SC_PAGESIZE)); }

// Calls `on_page(offset, resident)` for every page of `file`, window by window.
Status for_each_page(const internal::File& file, uint64_t size,
                     const std::function<void(uint64_t, bool)>& on_page) {
  const uint64_t page = page_size();
  std::vector<unsigned char> flags;
  for (uint64_t start = 0; start < size; start += kWindowBytes) {
    const uint64_t length = std::min(kWindowBytes, size - start);
    void* map = mmap(nullptr, length, PROT_READ, MAP_SHARED, file.fd(), off_t(start));
    if (map == MAP_FAILED) return errno_status(errno, "cannot map", file.path(), start);
    flags.resize((length + page - 1) / page);
    const int rc = mincore(map, length, flags.data());
    const int err = errno;
    munmap(map, length);
    if (rc != 0) return errno_status(err, "cannot query the page cache for", file.path(), start);
    for (size_t i = 0; i < flags.size(); ++i) on_page(start + i * page, (flags[i] & 1) != 0);
  }
  return Status::ok();
}

// Whether mincore() tells this process the truth about `file` (the kernel's can_do_mincore():
// the owner, a writer, or CAP_FOWNER, which root holds).
bool mincore_answers(const internal::File& file) {
  struct stat info {};
  if (::fstat(file.fd(), &info) != 0) return true;  // the mapping's own error comes next
  return info.st_uid == ::geteuid() || ::geteuid() == 0 ||
         ::faccessat(AT_FDCWD, file.path().c_str(), W_OK, AT_EACCESS) == 0;
}

Result<FileResidency> residency_of(const internal::File& file) {
  ZW_ASSIGN_OR_RETURN(const uint64_t size, file.size());
  FileResidency r{file.path(), size, 0};
  if (!mincore_answers(file)) {
    r.measured = false;
    return r;
  }
  const uint64_t page = page_size();
  ZW_RETURN_IF_ERROR(for_each_page(file, size, [&](uint64_t offset, bool resident) {
    if (resident) r.resident_bytes += std::min(page, size - offset);
  }));
  return r;
}

}  // namespace

double FileResidency::share() const {
  if (!measured) return std::nan("");
  return bytes == 0 ? 1.0 : double(resident_bytes) / double(bytes);
}

double Residency::share() const {
  const uint64_t measured = bytes - unmeasured_bytes;
  if (measured == 0) return unmeasured_bytes == 0 ? 1.0 : std::nan("");
  return double(resident_bytes) / double(measured);
}

Result<FileResidency> file_residency(const std::string& path) {
  ZW_ASSIGN_OR_RETURN(const internal::File file, internal::File::open_read(path));
  return residency_of(file);
}

Result<Residency> residency(const std::vector<std::string>& paths) {
  Residency total;
  for (const std::string& path : paths) {
    ZW_ASSIGN_OR_RETURN(FileResidency r, file_residency(path));
    total.bytes += r.bytes;
    total.resident_bytes += r.resident_bytes;
    if (!r.measured) total.unmeasured_bytes += r.bytes;
    total.files.push_back(std::move(r));
  }
  return total;
}

Result<WarmReport> warm_page_cache(const std::vector<std::string>& paths,
                                   const WarmOptions& options) {
  WarmReport report;
  ZW_ASSIGN_OR_RETURN(report.before, residency(paths));
  const uint64_t missing = report.before.bytes - report.before.resident_bytes;  // unknown: all
  const uint64_t total = options.max_bytes == 0 ? missing : std::min(missing, options.max_bytes);
  std::vector<std::byte> buffer(kChunkBytes);
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& path : paths) {
    if (report.capped) break;
    ZW_ASSIGN_OR_RETURN(const internal::File file, internal::File::open_read(path));
    ZW_ASSIGN_OR_RETURN(const uint64_t size, file.size());
    // The chunks holding a page that is not resident, read whole; all of a file whose
    // residency this user cannot learn.
    const bool known = mincore_answers(file);
    std::vector<bool> wanted((size + kChunkBytes - 1) / kChunkBytes, !known);
    if (known) {
      ZW_RETURN_IF_ERROR(for_each_page(file, size, [&](uint64_t offset, bool resident) {
        if (!resident) wanted[offset / kChunkBytes] = true;
      }));
    }
    for (size_t c = 0; c < wanted.size(); ++c) {
      if (!wanted[c]) continue;
      const uint64_t offset = c * kChunkBytes;
      const uint64_t length = std::min(kChunkBytes, size - offset);
      if (options.max_bytes != 0 && report.bytes_read + length > options.max_bytes) {
        report.capped = true;
        break;
      }
      ZW_RETURN_IF_ERROR(file.pread_exact(offset, {buffer.data(), length}));
      report.bytes_read += length;
      if (options.progress) options.progress(std::min(report.bytes_read, total), total);
    }
  }
  report.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ZW_ASSIGN_OR_RETURN(report.after, residency(paths));
  return report;
}

Status evict_from_page_cache(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    ZW_ASSIGN_OR_RETURN(internal::File file, internal::File::open_read(path));
    if (::fdatasync(file.fd()) != 0) return errno_status(errno, "cannot fdatasync", path);
    if (const int err = ::posix_fadvise(file.fd(), 0, 0, POSIX_FADV_DONTNEED); err != 0) {
      return errno_status(err, "cannot drop from the page cache (posix_fadvise)", path);
    }
  }
  return Status::ok();
}

}  // namespace zerowait
