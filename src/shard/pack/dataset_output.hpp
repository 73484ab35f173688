// Where a dataset being written goes — any Store open_store() serves: a local directory, an S3
// prefix, memory:// in tests — and the order it is published in: shards as they are finished,
// quarantine.json, then the manifest last, so that a dataset exists at its location only once all
// of it is there. `zerowait pack` and the DatasetWriter (zerowait/shard/dataset_writer.hpp) both
// write through it. How an object reaches the store (spooled, uploaded in parts) is the store's
// business; the layout is decided here from the store's traits:
// - where publish is a rename, a shard is written as ".<name>.partial" beside its final name and
//   renamed into place (a leading dot keeps it out of `*.zws` globs and directory scans);
// - where publish would copy every byte (an object store), a shard is written under its final
//   name, and the manifest alone decides what counts;
// - where the store limits the request rate per key prefix, shards land under hash-named
//   prefixes (PREFIX/3f2a/shard-000042.zws), so readers of one dataset do not all queue behind
//   one prefix. The manifest lists those paths relative to the dataset root, as a local one does.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "shard/pack/shard_set_writer.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/shard/manifest.hpp"
#include "zerowait/shard/pack.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait::internal {

// "3f2a/shard-000042.zws": where shard `name` goes below the dataset root on a store that limits
// the request rate per prefix. Four hex digits of a hash of the name: neighbouring shards land on
// unrelated prefixes, the same name always on one.
std::string hashed_shard_path(const std::string& name);

class DatasetOutput final : public ShardDestination {
 public:
  // Opens `out` (a local directory, created if missing, or a URL open_store serves). A dataset
  // already there is refused (kAlreadyExists, naming it and --overwrite) unless `overwrite`,
  // which removes its manifest first so that no reader sees it listing new shards. With
  // part_count > 1 the output is the part's directory, out/pack_part_dir_name(I, N), and a merged
  // manifest in `out` (which would list the part's shards) is refused or removed the same way.
  // `tmp_dir`: where a store that uploads spools its objects (empty: $TMPDIR, else /tmp).
  // `sync`: fsync shards, files and directory where the store has such a thing. `store`: the
  // Store to write `out` through instead of the one open_store gives for it (a FaultStore).
  static Result<std::unique_ptr<DatasetOutput>> open(const std::string& out,
                                                     const std::string& tmp_dir, bool overwrite,
                                                     bool sync, uint32_t part_index = 0,
                                                     uint32_t part_count = 1,
                                                     std::shared_ptr<Store> store = nullptr);
  ~DatasetOutput() override;  // waits for a shard's upload in flight

  DatasetOutput(const DatasetOutput&) = delete;
  DatasetOutput& operator=(const DatasetOutput&) = delete;

  Result<ShardWriter> create(const std::string& name, bool align_samples) override;
  Result<std::string> publish(const std::string& name) override;
  void discard(const std::string& name) override;
  Status finish() override;

  // Writes a small file (quarantine.json, the manifest) so that it appears whole.
  Status put_file(const std::string& name, std::string_view text);
  // After a new manifest is published: removes shards it does not list, left by an earlier
  // dataset or an interrupted write. Best effort.
  void remove_stale_shards(const std::vector<ManifestShard>& kept);
  // The path or URL of file `name` in the output.
  std::string location(const std::string& name) const;

  // Closes `file` (an object store uploads it) on a thread of its own, once the previous one is
  // closed (whose error is returned here): one shard uploads while the next is written, and
  // local disk holds two spooled shards at most. finish() waits for the last.
  Status close_in_background(std::unique_ptr<WritableFile> file, Deadline deadline);

 private:
  DatasetOutput(std::shared_ptr<Store> store, std::string location, std::string dir, bool sync);
  std::string final_path(const std::string& name) const;  // relative to the dataset root
  std::string write_path(const std::string& name) const;  // where it is written until published
  Status wait_for_upload();

  std::shared_ptr<Store> store_;
  std::string location_;  // the dataset root as the user named it (a part's: below it)
  std::string dir_;       // the dataset root in the store: "" or a part's directory
  bool sync_;
  StoreTraits traits_;
  std::thread upload_;  // the close (upload) in flight, if any
  Status upload_status_;
};

// Writes small file `name` of directory `dir` of `store` ("" is its root) so that it appears
// whole: written beside it as ".<name>.partial" and published by rename where publish is one, in
// one PUT on an object store (which shows an object whole or not at all). `sync`: the directory
// is synced afterwards.
Status put_published(Store& store, const std::string& dir, const std::string& name,
                     std::string_view text, bool sync);

// Publishes a written dataset whose shards are all published (ShardSetWriter::finish):
// quarantine.json (what was not written, and why), then the manifest, then removes stale shards.
// Returns the manifest's location.
Result<std::string> publish_dataset(DatasetOutput& output, const Manifest& manifest,
                                    const std::vector<QuarantineEntry>& quarantined);

}  // namespace zerowait::internal
