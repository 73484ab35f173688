// Reads samples out of one shard: a native .zws file, or a WebDataset .tar read in place.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"
#include "zerowait/shard/format.hpp"

namespace zerowait {

// One field of a sample, pointing into the buffer the sample was read into.
struct FieldView {
  std::string_view name;
  std::span<const std::byte> bytes;
};

// One sample, pointing into the reader's index (key, names) and the caller's buffer (bytes).
struct SampleView {
  uint64_t index = 0;  // local index in the shard
  std::string_view key;
  std::vector<FieldView> fields;
  std::span<const std::byte> bytes;  // the sample's whole byte span (what its checksum covers)

  // Returns the field named `name`, or nullptr.
  const FieldView* field(std::string_view name) const;
};

// A sample that owns its bytes.
struct Sample {
  std::vector<std::byte> buffer;
  SampleView view;
};

struct ReadOptions {
  bool verify = false;  // check the sample checksum (kCorrupt names shard, index and key)
  Deadline deadline = Deadline::none();
};

// A bad sample found by verify().
struct BadSample {
  uint64_t index = 0;
  std::string key;
  std::string reason;
};

enum class ShardKind { kNative, kTar };

// Thread-safe after open: all methods are const and reads may run concurrently.
class ShardReader {
 public:
  // Opens a native shard with one read of the footer and one of the index.
  static Result<std::shared_ptr<ShardReader>> open(std::shared_ptr<ByteSource> source);
  // Opens a path or URL (through the storage registry, zerowait/storage/open.hpp): ".tar" goes
  // through the WebDataset tar index (see webdataset.hpp), anything else is a native shard.
  static Result<std::shared_ptr<ShardReader>> open_path(const std::string& path,
                                                        IoBackend backend = IoBackend::kPread);
  // Wraps an already-built index (used by the tar reader).
  ShardReader(std::shared_ptr<ByteSource> source, format::ShardIndex index, uint32_t flags,
              ShardKind kind, uint64_t index_checksum = 0);

  const std::string& name() const { return source_->name(); }
  ShardKind kind() const { return kind_; }
  uint64_t size() const { return index_.sample_count(); }
  uint32_t flags() const { return flags_; }
  bool has_checksums() const { return (flags_ & format::kNoChecksums) == 0; }
  // The footer's xxHash3-64 of the index (what a manifest records); 0 for a tar.
  uint64_t index_checksum() const { return index_checksum_; }
  const format::ShardIndex& index() const { return index_; }
  ByteSource& source() const { return *source_; }

  std::string_view key(uint64_t i) const { return index_.key(i); }
  // Bytes a buffer needs to hold sample i.
  uint64_t sample_bytes(uint64_t i) const { return index_.samples[i].size; }

  // Reads sample i into `buffer` (at least sample_bytes(i) long). The view points into `buffer`.
  Result<SampleView> read_sample(uint64_t i, std::span<std::byte> buffer,
                                 const ReadOptions& options = {}) const;
  // Same, into a buffer of its own.
  Result<Sample> read_sample(uint64_t i, const ReadOptions& options = {}) const;

  // Bytes a buffer needs to hold samples [first, first + count) with one contiguous read.
  uint64_t span_bytes(uint64_t first, uint64_t count) const;
  // Reads samples [first, first + count) with one read into `buffer` (span_bytes long).
  Result<std::vector<SampleView>> read_samples(uint64_t first, uint64_t count,
                                               std::span<std::byte> buffer,
                                               const ReadOptions& options = {}) const;

  // Reads every sample in order, in reads of about `options.chunk_bytes` of consecutive samples
  // (one sample larger than that is read alone), hinting the bytes ahead to the source so their
  // I/O overlaps the caller's work. Calls `visit` once per chunk; the views are valid during the
  // call only. Stops at, and returns, the first error of a read or of `visit`.
  struct ScanOptions {
    // 512 KiB reads stay in the CPU caches while the caller touches them (warm reads run at
    // `cat` speed; 2 MiB was 15 % slower); 32 MiB hinted ahead keep enough I/O in flight for cold
    // reads to reach fio's sequential rate (both measured with bench/ on 20,000 samples).
    uint64_t chunk_bytes = 512 << 10;
    uint64_t prefetch_bytes = 32 << 20;  // 0: no hints
    bool verify = false;
    Deadline deadline = Deadline::none();
  };
  Status scan(const std::function<Status(std::span<const SampleView>)>& visit,
              const ScanOptions& options) const;

  // Checks the checksum of every sample through scan(). Calls `on_bad` for each mismatch and
  // `on_progress(bytes)` after each chunk with that chunk's byte count. Returns an error only
  // when the shard cannot be read at all; bad samples are reported through `on_bad` and counted
  // in the result.
  Result<uint64_t> verify(const std::function<void(const BadSample&)>& on_bad,
                          const std::function<void(uint64_t)>& on_progress = {}) const;

  // For callers that read sample bytes themselves (the loader coalesces reads across samples):
  // the view of sample i over its bytes `sample_bytes` (sample_bytes(i) long), and its checksum
  // check (kCorrupt naming shard, index, key and offset; ok when the shard has no checksums).
  SampleView make_view(uint64_t i, std::span<const std::byte> sample_bytes) const;
  Status check_sample(uint64_t i, std::span<const std::byte> sample_bytes) const;

 private:
  std::shared_ptr<ByteSource> source_;
  format::ShardIndex index_;
  uint32_t flags_ = 0;
  ShardKind kind_ = ShardKind::kNative;
  uint64_t index_checksum_ = 0;
};

}  // namespace zerowait
