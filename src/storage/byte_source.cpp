#include "zerowait/storage/byte_source.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/file.hpp"
#include "common/log.hpp"
#include "storage/local/file_sources.hpp"

namespace zerowait {
namespace internal {

Status check_range(const std::string& name, uint64_t size, const ReadRequest& r) {
  if (r.offset > size || r.dst.size() > size - r.offset) {
    return corrupt("short read of '" + name + "' at offset " + std::to_string(r.offset) +
                   ": needs " + std::to_string(r.dst.size()) + " bytes, the source has " +
                   std::to_string(size) + " (truncated?)");
  }
  return Status::ok();
}

Status deadline_status(const std::string& name, uint64_t offset, size_t unfinished) {
  return Status(ErrorCode::kDeadlineExceeded,
                "deadline passed while reading '" + name + "' at offset " + std::to_string(offset) +
                    " (" + std::to_string(unfinished) +
                    (unfinished == 1 ? " request" : " requests") + " unfinished)");
}

void CachedFileSource::advise_sequential() {
  ::posix_fadvise(file_.fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
}

void CachedFileSource::prefetch(uint64_t offset, uint64_t length) {
  ::posix_fadvise(file_.fd(), static_cast<off_t>(offset), static_cast<off_t>(length),
                  POSIX_FADV_WILLNEED);
}

}  // namespace internal

namespace {

using internal::check_range;
using internal::deadline_status;

class PreadSource final : public internal::CachedFileSource {
 public:
  using CachedFileSource::CachedFileSource;

  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReadRequest& r = requests[i];
      // A local pread cannot be interrupted once issued; the deadline bounds the batch.
      if (deadline.passed()) return deadline_status(name(), r.offset, requests.size() - i);
      ZW_RETURN_IF_ERROR(check_range(name(), size(), r));
      ZW_RETURN_IF_ERROR(file().pread_exact(r.offset, r.dst));
    }
    return Status::ok();
  }
};

class MmapSource final : public ByteSource {
 public:
  MmapSource(std::string name, const std::byte* data, uint64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}
  ~MmapSource() override {
    if (size_ > 0) ::munmap(const_cast<std::byte*>(data_), size_);
  }
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return size_; }

  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReadRequest& r = requests[i];
      if (deadline.passed()) return deadline_status(name_, r.offset, requests.size() - i);
      ZW_RETURN_IF_ERROR(check_range(name_, size_, r));
      if (!r.dst.empty()) std::memcpy(r.dst.data(), data_ + r.offset, r.dst.size());
    }
    return Status::ok();
  }

  void advise_sequential() override {
    if (size_ > 0) ::madvise(const_cast<std::byte*>(data_), size_, MADV_SEQUENTIAL);
  }
  void prefetch(uint64_t offset, uint64_t length) override {
    if (offset >= size_) return;
    // madvise wants a page-aligned start.
    const uint64_t start = offset & ~uint64_t{4095};
    const uint64_t len = std::min<uint64_t>(length + (offset - start), size_ - start);
    ::madvise(const_cast<std::byte*>(data_) + start, len, MADV_WILLNEED);
  }

 private:
  std::string name_;
  const std::byte* data_;
  uint64_t size_;
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(std::string name, std::span<const std::byte> bytes)
      : name_(std::move(name)), bytes_(bytes.begin(), bytes.end()) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return bytes_.size(); }

  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReadRequest& r = requests[i];
      if (deadline.passed()) return deadline_status(name_, r.offset, requests.size() - i);
      ZW_RETURN_IF_ERROR(check_range(name_, bytes_.size(), r));
      if (!r.dst.empty()) std::memcpy(r.dst.data(), bytes_.data() + r.offset, r.dst.size());
    }
    return Status::ok();
  }

 private:
  std::string name_;
  std::vector<std::byte> bytes_;
};

Result<std::unique_ptr<ByteSource>> open_mmap_source(const std::string& path) {
  ZW_ASSIGN_OR_RETURN(internal::File file, internal::File::open_read(path));
  ZW_ASSIGN_OR_RETURN(uint64_t size, file.size());
  const std::byte* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, file.fd(), 0);
    if (p == MAP_FAILED) return errno_status(errno, "cannot mmap", path);
    data = static_cast<const std::byte*>(p);
  }
  // The mapping outlives the descriptor; closing it here keeps one fd per source at most.
  return std::unique_ptr<ByteSource>(new MmapSource(path, data, size));
}

}  // namespace

std::unique_ptr<ByteSource> internal::make_buffered_source(File file, uint64_t size) {
  if (resolve_auto_io_backend() == IoBackend::kIoUring) {
    return make_io_uring_source(std::move(file), size);
  }
  return std::make_unique<PreadSource>(std::move(file), size);
}

const char* io_backend_name(IoBackend backend) {
  switch (backend) {
    case IoBackend::kPread:
      return "pread";
    case IoBackend::kMmap:
      return "mmap";
    case IoBackend::kIoUring:
      return "io_uring";
    case IoBackend::kDirect:
      return "direct";
  }
  return "unknown";
}

Result<IoBackend> parse_io_backend(const std::string& name) {
  for (IoBackend backend :
       {IoBackend::kPread, IoBackend::kMmap, IoBackend::kIoUring, IoBackend::kDirect}) {
    if (name == io_backend_name(backend)) return backend;
  }
  if (name == "auto") return resolve_auto_io_backend();
  return invalid_argument("unknown I/O backend '" + name +
                          "': use 'auto', 'pread', 'mmap', 'io_uring' or 'direct'");
}

IoBackend resolve_auto_io_backend() {
  if (io_uring_available()) return IoBackend::kIoUring;
  internal::note_fallback("io_uring", "io_uring is not available (" +
                                          io_uring_unavailable_reason() +
                                          "); reading with a pread thread pool");
  return IoBackend::kPread;
}

Status ByteSource::read_at(uint64_t offset, std::span<std::byte> dst, Deadline deadline) {
  ReadRequest request{offset, dst};
  return read(std::span<const ReadRequest>(&request, 1), deadline);
}

Result<std::unique_ptr<ByteSource>> open_file_source(const std::string& path, IoBackend backend) {
  switch (backend) {
    case IoBackend::kMmap:
      return open_mmap_source(path);
    case IoBackend::kDirect:
      return internal::open_direct_source(path);
    case IoBackend::kPread:
    case IoBackend::kIoUring:
      break;
  }
  ZW_ASSIGN_OR_RETURN(internal::File file, internal::File::open_read(path));
  ZW_ASSIGN_OR_RETURN(uint64_t size, file.size());
  if (backend == IoBackend::kIoUring) return internal::make_buffered_source(std::move(file), size);
  return std::unique_ptr<ByteSource>(new PreadSource(std::move(file), size));
}

std::unique_ptr<ByteSource> make_memory_source(std::string name, std::span<const std::byte> bytes) {
  return std::make_unique<MemorySource>(std::move(name), bytes);
}

}  // namespace zerowait
