// Writes a sequence of samples into numbered shards of a target size: each shard is written to a
// local file under a temporary name and handed, once complete, to a ShardDestination that
// publishes it (renamed into a directory, or uploaded to an object store: dataset_output.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/shard/manifest.hpp"
#include "zerowait/shard/writer.hpp"

namespace zerowait::internal {

// Where finished shards go. Called from the writer thread only.
class ShardDestination {
 public:
  virtual ~ShardDestination() = default;
  // The local file shard `name` ("shard-000042.zws") is written to until it is complete.
  virtual std::string spool_path(const std::string& name) = 0;
  // Publishes the complete file at `spool` (which is the destination's from now on) and returns
  // the shard's path relative to the dataset root, as the manifest lists it. May return before the
  // shard is durable; finish() waits for that.
  virtual Result<std::string> publish(const std::string& spool, const std::string& name) = 0;
  // Returns once every published shard is durable (or the first error of one that is not).
  virtual Status finish() = 0;
};

class ShardSetWriter {
 public:
  // `destination` must outlive the writer.
  ShardSetWriter(ShardDestination& destination, uint64_t shard_size, ShardWriterOptions options)
      : destination_(destination), shard_size_(shard_size), options_(options) {}
  ~ShardSetWriter();  // removes a partial shard left by an error

  // Appends a sample, opening a new shard first when the current one reached the target size.
  // `checksum` is ShardWriter::sample_checksum(fields), computed by the caller.
  Status add_sample(std::string_view key, std::span<const FieldData> fields, uint64_t checksum);
  // Publishes the last shard and waits until the destination holds every shard.
  Status finish();

  const std::vector<ManifestShard>& shards() const { return shards_; }
  const std::set<std::string, std::less<>>& field_names() const { return field_names_; }
  uint64_t samples() const { return samples_; }
  uint64_t bytes() const;  // published shard bytes plus the current shard so far

  // "shard-000042.zws"
  static std::string shard_name(size_t number);

 private:
  Status close_current();

  ShardDestination& destination_;
  uint64_t shard_size_;
  ShardWriterOptions options_;
  std::optional<ShardWriter> current_;
  std::string current_tmp_;
  std::vector<ManifestShard> shards_;
  std::set<std::string, std::less<>> field_names_;  // transparent: lookups by string_view
  uint64_t samples_ = 0;
  uint64_t published_bytes_ = 0;
};

}  // namespace zerowait::internal
