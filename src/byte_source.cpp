#include "zerowait/byte_source.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "internal/file.hpp"

namespace zerowait {
namespace {

// Every backend rejects a range past the end the same way: the caller's index is wrong, which
// for a file means it was truncated or the index is corrupt.
Status check_range(const std::string& name, uint64_t size, const ReadRequest& r) {
  if (r.offset > size || r.dst.size() > size - r.offset) {
    return corrupt("short read of '" + name + "' at offset " + std::to_string(r.offset) +
                   ": needs " + std::to_string(r.dst.size()) + " bytes, the source has " +
                   std::to_string(size) + " (truncated?)");
  }
  return Status::ok();
}

Status deadline_status(const std::string& name, const ReadRequest& r) {
  return Status(ErrorCode::kDeadlineExceeded, "read of '" + name + "' at offset " +
                                                   std::to_string(r.offset) +
                                                   " did not finish before its deadline");
}

class PreadSource final : public ByteSource {
 public:
  PreadSource(internal::File file, uint64_t size) : file_(std::move(file)), size_(size) {}
  const std::string& name() const override { return file_.path(); }
  uint64_t size() const override { return size_; }

  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    for (const ReadRequest& r : requests) {
      // A local pread cannot be interrupted once issued; the deadline bounds the batch.
      if (deadline.passed()) return deadline_status(name(), r);
      ZW_RETURN_IF_ERROR(check_range(name(), size_, r));
      ZW_RETURN_IF_ERROR(file_.pread_exact(r.offset, r.dst));
    }
    return Status::ok();
  }

  void advise_sequential() override {
    ::posix_fadvise(file_.fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
  }
  void prefetch(uint64_t offset, uint64_t length) override {
    ::posix_fadvise(file_.fd(), static_cast<off_t>(offset), static_cast<off_t>(length),
                    POSIX_FADV_WILLNEED);
  }

 private:
  internal::File file_;
  uint64_t size_;
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
    for (const ReadRequest& r : requests) {
      if (deadline.passed()) return deadline_status(name(), r);
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
    for (const ReadRequest& r : requests) {
      if (deadline.passed()) return deadline_status(name(), r);
      ZW_RETURN_IF_ERROR(check_range(name_, bytes_.size(), r));
      if (!r.dst.empty()) std::memcpy(r.dst.data(), bytes_.data() + r.offset, r.dst.size());
    }
    return Status::ok();
  }

 private:
  std::string name_;
  std::vector<std::byte> bytes_;
};

}  // namespace

const char* io_backend_name(IoBackend backend) {
  switch (backend) {
    case IoBackend::kPread: return "pread";
    case IoBackend::kMmap: return "mmap";
  }
  return "unknown";
}

Result<IoBackend> parse_io_backend(const std::string& name) {
  if (name == "pread") return IoBackend::kPread;
  if (name == "mmap") return IoBackend::kMmap;
  return invalid_argument("unknown I/O backend '" + name + "': use 'pread' or 'mmap'");
}

Status ByteSource::read_at(uint64_t offset, std::span<std::byte> dst, Deadline deadline) {
  ReadRequest request{offset, dst};
  return read(std::span<const ReadRequest>(&request, 1), deadline);
}

Result<std::unique_ptr<ByteSource>> open_file_source(const std::string& path, IoBackend backend) {
  ZW_ASSIGN_OR_RETURN(internal::File file, internal::File::open_read(path));
  ZW_ASSIGN_OR_RETURN(uint64_t size, file.size());
  if (backend == IoBackend::kPread) {
    return std::unique_ptr<ByteSource>(new PreadSource(std::move(file), size));
  }
  const std::byte* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, file.fd(), 0);
    if (p == MAP_FAILED) return errno_status(errno, "cannot mmap", path);
    data = static_cast<const std::byte*>(p);
  }
  // The mapping outlives the descriptor; closing it here keeps one fd per source at most.
  return std::unique_ptr<ByteSource>(new MmapSource(path, data, size));
}

std::unique_ptr<ByteSource> make_memory_source(std::string name, std::span<const std::byte> bytes) {
  return std::make_unique<MemorySource>(std::move(name), bytes);
}

}  // namespace zerowait
