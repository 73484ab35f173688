// Writes one shard file, sample by sample, streaming: memory use is one sample, not one shard.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "zerowait/common/status.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait {

struct ShardWriterOptions {
  bool align_samples = false;  // start every sample on a 4 KiB boundary (O_DIRECT / GPUDirect)
  bool sync = true;            // fsync the file in finish()
  // How long each call on the file (a write, its sync, its close: an object store's upload) may
  // take before the writer fails with kDeadlineExceeded naming the shard.
  std::chrono::nanoseconds write_timeout = kDefaultWriteTimeout;
};

// One named field of a sample to write.
struct FieldData {
  std::string_view name;
  std::span<const std::byte> bytes;
};

// What finish() wrote.
struct ShardSummary {
  uint64_t samples = 0;
  uint64_t file_bytes = 0;
  // xxHash3-64 of the index region, as the footer and the manifest record it. The index holds
  // every sample's checksum, so this one value pins down the whole shard's content.
  uint64_t index_checksum = 0;
};

// Not thread-safe; move-only. The file at `path` is created (truncated) by create() and is a
// valid shard only once finish() returned success; the caller publishes it (rename) after that.
// Runs of 4 KiB zero blocks are not written, so a local file is sparse where the data is.
class ShardWriter {
 public:
  static Result<ShardWriter> create(const std::string& path, ShardWriterOptions options = {});
  // Writes into `file`, an object of a Store being created; `path` names it in messages.
  // finish() syncs (if options.sync) and closes it.
  static Result<ShardWriter> create(std::unique_ptr<WritableFile> file, std::string path,
                                    ShardWriterOptions options = {});

  ShardWriter(ShardWriter&&) noexcept;
  ShardWriter& operator=(ShardWriter&&) noexcept;
  ~ShardWriter();  // closes without finishing: the file stays incomplete

  // Appends one sample; fields are stored in the order given. Empty keys, duplicate field
  // names and field names with '/' are kInvalidArgument.
  Status add_sample(std::string_view key, std::span<const FieldData> fields);
  // Same, with `checksum` already computed as sample_checksum(fields), so callers can hash on
  // their own threads. A wrong value makes the sample read as corrupt later.
  Status add_sample(std::string_view key, std::span<const FieldData> fields, uint64_t checksum);

  // The checksum stored for a sample: xxHash3-64 of its fields' bytes concatenated in order.
  static uint64_t sample_checksum(std::span<const FieldData> fields);

  // Writes index and footer, fsyncs (unless disabled), closes.
  Result<ShardSummary> finish();

  uint64_t samples() const;
  uint64_t bytes_written() const;  // current file size, index not yet included
  const std::string& path() const;

 private:
  struct State;
  explicit ShardWriter(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace zerowait
