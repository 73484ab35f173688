// IoBackend::kDirect: reads with O_DIRECT, past the page cache, so an epoch over a dataset larger
// than memory neither evicts everything else nor pays for copies into the cache. O_DIRECT wants
// the file offset, the length and the buffer address aligned; requests that are not go through
// a bounce buffer.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/align.hpp"
#include "common/log.hpp"
#include "storage/local/file_sources.hpp"
#include "storage/local/read_engine.hpp"

namespace zerowait::internal {
namespace {

constexpr uint64_t kAlign = kDirectIoAlignment;
// A thread keeps a bounce buffer up to this size for its next call; a larger one is freed at
// once, so one huge unaligned read does not pin its memory for the thread's life.
constexpr size_t kKeptBounceBytes = size_t{64} << 20;

std::atomic<int> injected_open_error{0};

bool is_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kAlign == 0; }

// The calling thread's kAlign-aligned scratch memory, reused from call to call.
class BounceBuffer {
 public:
  BounceBuffer() = default;
  BounceBuffer(const BounceBuffer&) = delete;
  BounceBuffer& operator=(const BounceBuffer&) = delete;
  ~BounceBuffer() { std::free(data_); }

  // Returns at least `size` bytes (contents unspecified), or nullptr when memory runs out.
  std::byte* get(size_t size) {
    if (size > capacity_) {
      release();
      void* p = nullptr;
      if (::posix_memalign(&p, kAlign, size) != 0) return nullptr;
      data_ = static_cast<std::byte*>(p);
      capacity_ = size;
    }
    return data_;
  }
  void trim() {
    if (capacity_ > kKeptBounceBytes) release();
  }

 private:
  void release() {
    std::free(data_);
    data_ = nullptr;
    capacity_ = 0;
  }

  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
};

thread_local BounceBuffer this_thread_bounce;

// A range read into `block_bytes` of the bounce buffer at `at`, of which `length` bytes from
// `skip` on belong to the caller at `to`.
struct BouncedRange {
  size_t range;  // index in the call's RangeReads
  size_t at;
  size_t block_bytes;
  size_t skip;
  size_t length;
  std::byte* to;
};

class DirectSource final : public ByteSource {
 public:
  DirectSource(File file, uint64_t size, bool use_io_uring)
      : file_(std::move(file)), size_(size), use_io_uring_(use_io_uring) {}
  const std::string& name() const override { return file_.path(); }
  uint64_t size() const override { return size_; }
  bool bypasses_page_cache() const override { return true; }

  // advise_sequential() and prefetch() stay no-ops: they would only fill the page cache that
  // these reads bypass.
  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    std::vector<RangeRead> ranges;
    std::vector<BouncedRange> bounced;
    size_t bounce_bytes = 0;
    ranges.reserve(requests.size());
    for (const ReadRequest& r : requests) {
      ZW_RETURN_IF_ERROR(check_range(name(), size_, r));
      if (!r.dst.empty()) plan(r, &ranges, &bounced, &bounce_bytes);
    }
    std::byte* bounce = nullptr;
    if (bounce_bytes > 0) {
      bounce = this_thread_bounce.get(bounce_bytes);
      if (bounce == nullptr) {
        return errno_status(ENOMEM, "cannot allocate a bounce buffer to read", name());
      }
      for (const BouncedRange& b : bounced) {
        ranges[b.range].dst = std::span<std::byte>(bounce + b.at, b.block_bytes);
      }
    }
    Status status = use_io_uring_ ? read_ranges(file_, ranges, deadline, /*direct=*/true)
                                  : pread_read(file_, ranges, deadline, /*direct=*/true);
    if (status.is_ok()) {
      for (const BouncedRange& b : bounced) std::memcpy(b.to, bounce + b.at + b.skip, b.length);
    }
    this_thread_bounce.trim();
    return status;
  }

 private:
  // Appends the reads that fill `r`: an aligned offset and buffer take the whole blocks
  // directly and only a final partial block through the bounce buffer; anything else reads the
  // aligned blocks around it into the bounce buffer. A bounced range's dst is set once the
  // buffer's size is known.
  static void plan(const ReadRequest& r, std::vector<RangeRead>* ranges,
                   std::vector<BouncedRange>* bounced, size_t* bounce_bytes) {
    uint64_t start = r.offset;
    size_t skip = 0;
    size_t direct_bytes = 0;
    if (r.offset % kAlign == 0 && is_aligned(r.dst.data())) {
      direct_bytes = align_down(r.dst.size(), kAlign);
      if (direct_bytes > 0)
        ranges->push_back({r.offset, r.dst.first(direct_bytes), direct_bytes, &r});
      if (direct_bytes == r.dst.size()) return;
      start += direct_bytes;
    } else {
      start = align_down(r.offset, kAlign);
      skip = r.offset - start;
    }
    const size_t length = r.dst.size() - direct_bytes;
    // The blocks may reach past the end of the file; the read then stops there, after the
    // `skip + length` bytes that are needed.
    const size_t block_bytes = align_up(skip + length, kAlign);
    bounced->push_back(
        {ranges->size(), *bounce_bytes, block_bytes, skip, length, r.dst.data() + direct_bytes});
    ranges->push_back({start, {}, skip + length, &r});
    *bounce_bytes += block_bytes;
  }

  File file_;
  uint64_t size_;
  bool use_io_uring_;
};

}  // namespace

Result<File> open_direct_or_buffered(const std::string& path, bool* direct) {
  int err = injected_open_error.load();
  int fd = -1;
  if (err == 0) {
    fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) err = errno;
  }
  *direct = fd >= 0;
  if (fd >= 0) return File(fd, path);
  if (err != EINVAL) return errno_status(err, "cannot open (O_DIRECT)", path);
  note_fallback("direct",
                "O_DIRECT is not supported on " + path + "'s filesystem; reading buffered");
  return File::open_read(path);
}

Result<std::unique_ptr<ByteSource>> open_direct_source(const std::string& path) {
  bool direct = false;
  ZW_ASSIGN_OR_RETURN(File file, open_direct_or_buffered(path, &direct));
  ZW_ASSIGN_OR_RETURN(uint64_t size, file.size());
  if (!direct) return make_buffered_source(std::move(file), size);
  const bool use_io_uring = resolve_auto_io_backend() == IoBackend::kIoUring;
  return std::unique_ptr<ByteSource>(new DirectSource(std::move(file), size, use_io_uring));
}

void fail_direct_open_for_testing(int err) { injected_open_error.store(err); }

}  // namespace zerowait::internal
