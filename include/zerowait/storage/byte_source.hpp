// The one seam every read goes through. Shard readers, the dataset and (later) the loader and
// the remote cache only ever see a ByteSource, so local pread/mmap, O_DIRECT, io_uring, HTTP/S3
// and a node-local cache are interchangeable under them. docs/io.md describes the backends.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "zerowait/common/status.hpp"

namespace zerowait {

using Clock = std::chrono::steady_clock;

// A point in time after which a read is reported as kDeadlineExceeded instead of waited for.
struct Deadline {
  Clock::time_point at = Clock::time_point::max();

  static Deadline none() { return {}; }
  static Deadline after(std::chrono::nanoseconds d) { return {Clock::now() + d}; }
  bool passed() const { return at != Clock::time_point::max() && Clock::now() >= at; }
};

// Read `dst.size()` bytes starting at `offset` into `dst`.
struct ReadRequest {
  uint64_t offset = 0;
  std::span<std::byte> dst;
};

enum class IoBackend {
  kPread,    // pread(2) into the caller's buffer, one request after another
  kMmap,     // a read-only mapping; reads are memcpy from it
  kIoUring,  // io_uring: every request of a read() in flight at once, cancelled at the deadline
  kDirect,   // O_DIRECT (no page cache) through io_uring where it works, else pread
};

// With kDirect, a request whose offset, length and buffer address are multiples of this goes
// from the disk straight into the caller's buffer. Other requests are read through an aligned
// bounce buffer and copied: all of it, or with an aligned offset and buffer only a final
// partial block.
inline constexpr size_t kDirectIoAlignment = 4096;

// Returns "pread" / "mmap" / "io_uring" / "direct".
const char* io_backend_name(IoBackend backend);
// Parses those names, and "auto" as resolve_auto_io_backend(); kInvalidArgument names the
// accepted values otherwise.
Result<IoBackend> parse_io_backend(const std::string& name);
// kIoUring where io_uring_available(), else kPread (noted once on stderr, counted each time).
IoBackend resolve_auto_io_backend();

// Whether io_uring works in this process: a ring can be set up and a test read on it completes.
// Probed once, on first use; $ZEROWAIT_DISABLE_IO_URING=1 makes it false. Thread-safe.
bool io_uring_available();
// Why io_uring_available() is false, e.g. "io_uring_queue_init: Operation not permitted"; empty
// when it is true.
std::string io_uring_unavailable_reason();

// Random-access, read-only bytes of known size. Implementations are thread-safe: concurrent
// read() calls on one source are allowed.
class ByteSource {
 public:
  virtual ~ByteSource() = default;

  // The name used in every error message (a file path or URL).
  virtual const std::string& name() const = 0;
  virtual uint64_t size() const = 0;
  // What tells this version of the bytes from another under the same name (an object's ETag);
  // empty when the source knows nothing beyond its name and size. Caches key blocks by it.
  virtual std::string version() const { return {}; }

  // Fills every request completely, or returns an error that names the source, the offset and
  // the cause. A range past size() is kCorrupt ("short read"): callers only ask for ranges that
  // their index says exist. Returns kDeadlineExceeded when `deadline` passes first: kIoUring (and
  // kDirect over io_uring) cancels the reads still in flight at the deadline and returns once
  // the kernel has let go of every buffer; pread, mmap and memory sources check the deadline
  // between requests, so one request already started runs to its end. After an error the
  // contents of the buffers are unspecified.
  virtual Status read(std::span<const ReadRequest> requests, Deadline deadline) = 0;

  // Convenience: one range.
  Status read_at(uint64_t offset, std::span<std::byte> dst, Deadline deadline = Deadline::none());

  // A read of a few small ranges that are not part of the data stream (a shard's header, footer
  // and index), with read()'s contract. A cache of whole blocks serves them with range requests
  // of their own when it does not hold their blocks yet, so that opening a shard waits for a few
  // kilobytes, not for the blocks around them; other sources just read().
  virtual Status read_metadata(std::span<const ReadRequest> requests, Deadline deadline) {
    return read(requests, deadline);
  }

  // True when reads bypass the page cache (O_DIRECT in effect, after any fallback): a caller
  // that reads large ranges then does best with offsets, lengths and buffers aligned to
  // kDirectIoAlignment. Other sources take any range straight into the caller's buffer.
  virtual bool bypasses_page_cache() const { return false; }

  // Tells the kernel the access will be sequential (readahead); a no-op where meaningless.
  virtual void advise_sequential() {}
  // Hints that [offset, offset + length) will be read soon, so its I/O can start in the
  // background now; a no-op where meaningless. Never fails: it is only a hint.
  virtual void prefetch(uint64_t /*offset*/, uint64_t /*length*/) {}
};

// Opens a local file read-only with the given backend. kIoUring where io_uring is unavailable
// reads with pread, and kDirect on a filesystem without O_DIRECT reads buffered; both fallbacks
// are noted once on stderr and counted.
Result<std::unique_ptr<ByteSource>> open_file_source(const std::string& path,
                                                     IoBackend backend = IoBackend::kPread);

// A source over bytes held in memory (tests, fuzzers, small embedded data). Copies `bytes`.
std::unique_ptr<ByteSource> make_memory_source(std::string name, std::span<const std::byte> bytes);

}  // namespace zerowait
