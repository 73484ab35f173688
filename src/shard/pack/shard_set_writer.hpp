// Writes a sequence of samples into numbered shards of a target size inside one directory:
// each shard is written under a temporary name and renamed once complete and synced.
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

class ShardSetWriter {
 public:
  ShardSetWriter(std::string dir, uint64_t shard_size, ShardWriterOptions options)
      : dir_(std::move(dir)), shard_size_(shard_size), options_(options) {}
  ~ShardSetWriter();  // removes a partial shard left by an error

  // Appends a sample, opening a new shard first when the current one reached the target size.
  // `checksum` is ShardWriter::sample_checksum(fields), computed by the caller.
  Status add_sample(std::string_view key, std::span<const FieldData> fields, uint64_t checksum);
  // Finishes and publishes the last shard.
  Status finish();

  const std::vector<ManifestShard>& shards() const { return shards_; }
  const std::set<std::string, std::less<>>& field_names() const { return field_names_; }
  uint64_t samples() const { return samples_; }
  uint64_t bytes() const;  // published shard bytes plus the current shard so far

  // "shard-000042.zws"
  static std::string shard_name(size_t number);

 private:
  Status close_current();

  std::string dir_;
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
