// Writes a sequence of samples into numbered shards of a target size: each shard is written to an
// object a ShardDestination creates and handed, once complete, to it to publish (renamed into
// place, or left where it was uploaded: store_output.hpp).
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
  // Creates the object shard `name` ("shard-000042.zws") is written to until it is complete;
  // `align_samples` as ShardWriterOptions has it (whether to sync is the destination's choice).
  virtual Result<ShardWriter> create(const std::string& name, bool align_samples) = 0;
  // Publishes shard `name`, whose writer finished, and returns its path relative to the dataset
  // root, as the manifest lists it. May return before the shard is durable; finish() waits.
  virtual Result<std::string> publish(const std::string& name) = 0;
  // Removes what was written of shard `name`, left unfinished by an error. Best effort.
  virtual void discard(const std::string& name) = 0;
  // Returns once every published shard is durable (or the first error of one that is not).
  virtual Status finish() = 0;
};

class ShardSetWriter {
 public:
  // `destination` must outlive the writer.
  ShardSetWriter(ShardDestination& destination, uint64_t shard_size, bool align_samples)
      : destination_(destination), shard_size_(shard_size), align_samples_(align_samples) {}
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
  bool align_samples_;
  std::optional<ShardWriter> current_;
  std::vector<ManifestShard> shards_;
  std::set<std::string, std::less<>> field_names_;  // transparent: lookups by string_view
  uint64_t samples_ = 0;
  uint64_t published_bytes_ = 0;
};

}  // namespace zerowait::internal
