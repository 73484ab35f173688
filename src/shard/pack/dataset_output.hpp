// Where a dataset being written goes — a local directory or an S3 prefix — and the order it is
// published in: shards as they are finished, quarantine.json, then the manifest last, so that a
// dataset exists at its location only once all of it is there. `zerowait pack` and the
// DatasetWriter (zerowait/shard/dataset_writer.hpp) both write through it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shard/pack/shard_set_writer.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/shard/manifest.hpp"
#include "zerowait/shard/pack.hpp"

namespace zerowait::internal {

class DatasetOutput : public ShardDestination {
 public:
  // Whether each shard file is fsynced when finished (a spooled shard that is uploaded is made
  // durable by its upload instead).
  virtual bool sync_shards() const = 0;
  // Writes a small file (quarantine.json, the manifest) as a whole.
  virtual Status put_file(const std::string& name, std::string_view text) = 0;
  // After a new manifest is published: removes shards it does not list, left by an earlier
  // dataset or an interrupted write. Best effort.
  virtual void remove_stale_shards(const std::vector<ManifestShard>& kept) = 0;
  // The path or URL of file `name` in the output.
  virtual std::string location(const std::string& name) const = 0;
};

// Opens `out` (a local directory, created if missing, or s3://BUCKET/PREFIX). A dataset already
// there is refused (kAlreadyExists, naming it and --overwrite) unless `overwrite`, which removes
// its manifest first so that no reader sees it listing new shards. With part_count > 1 the output
// is the part's directory, out/pack_part_dir_name(I, N), and a merged manifest in `out` (which
// would list the part's shards) is refused or removed the same way. `tmp_dir`: where shards for
// s3:// are spooled (empty: $TMPDIR, else /tmp). `sync`: fsync shards, files and directory.
Result<std::unique_ptr<DatasetOutput>> open_dataset_output(const std::string& out,
                                                           const std::string& tmp_dir,
                                                           bool overwrite, bool sync,
                                                           uint32_t part_index = 0,
                                                           uint32_t part_count = 1);

// Publishes a written dataset whose shards are all published (ShardSetWriter::finish):
// quarantine.json (what was not written, and why), then the manifest, then removes stale shards.
// Returns the manifest's location.
Result<std::string> publish_dataset(DatasetOutput& output, const Manifest& manifest,
                                    const std::vector<QuarantineEntry>& quarantined);

}  // namespace zerowait::internal
