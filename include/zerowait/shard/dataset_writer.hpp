// Writes a dataset from samples a program produces (the rows of a table, a query, a generator),
// not from files on disk: the same shards, manifest, checksums and quarantine as `zerowait pack`,
// streaming (memory holds one sample), to a local directory or s3://BUCKET/PREFIX.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/shard/pack.hpp"
#include "zerowait/shard/writer.hpp"

namespace zerowait {

struct DatasetWriterOptions {
  // A local directory (created if missing), or s3://BUCKET/PREFIX (shards uploaded as they are
  // finished, under hash-named key prefixes; docs/remote.md).
  std::string out_dir;
  std::string tmp_dir;                 // s3:// only: where a shard is spooled before its upload
  uint64_t shard_size = 256ull << 20;  // a shard is closed once it reaches this many bytes
  bool align = false;                  // 4 KiB-align every sample
  bool verify_images = false;          // full JPEG/PNG decode instead of a header check
  bool overwrite = false;              // replace a dataset already in out_dir
  bool sync = true;                    // fsync shards, manifest and directory
  // ImageFolder-style class names that a "cls" field indexes (manifest "classes"); optional.
  std::vector<std::string> classes;
};

struct DatasetWriterReport {
  uint64_t samples = 0;    // written
  uint64_t bytes_in = 0;   // payload bytes written
  uint64_t bytes_out = 0;  // shard bytes
  uint64_t shards = 0;
  std::string manifest_path;                // out_dir/manifest.json, or its s3:// URL
  std::vector<QuarantineEntry> quarantined;  // samples not written; path is "sample KEY"
  double seconds = 0;
};

// Not thread-safe. Nothing is a dataset until finish() returns: the manifest is written last, and
// a writer destroyed (or failing) before that leaves no manifest, and no partial shard.
class DatasetWriter {
 public:
  // Opens the output: an existing dataset there is kAlreadyExists unless `overwrite` (its
  // manifest is removed first, so no reader sees it listing new shards). Errors name the
  // directory or bucket and key.
  static Result<std::unique_ptr<DatasetWriter>> create(DatasetWriterOptions options);
  ~DatasetWriter();
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;

  // Appends one sample with the fields in the order given. A key used before, an empty key or
  // field name, a name with '/', or a field named twice is kInvalidArgument, and nothing is
  // written. A field that names an image type (jpg, jpeg, png, or ending in ".png" and so on)
  // and does not hold a whole image is not an error: the sample is quarantined as `pack` does
  // (returned false, listed in the report and in quarantine.json). kIo for a failed write (a
  // full disk) names the shard.
  Result<bool> write(std::string_view key, std::span<const FieldData> fields);

  // Publishes the last shard, quarantine.json and the manifest. Once only.
  Result<DatasetWriterReport> finish();

  uint64_t samples() const;        // written so far
  uint64_t quarantined() const;    // not written so far
  uint64_t bytes_written() const;  // shard bytes so far

  class Impl;

 private:
  explicit DatasetWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zerowait
