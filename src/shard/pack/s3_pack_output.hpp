// `pack -o s3://BUCKET/PREFIX`: shards are spooled to a local file each and uploaded as soon as
// they are complete (one uploading while the next is written), so local disk holds about two
// shards, never the dataset. They land under hash-named key prefixes (PREFIX/3f2a/shard-000042.zws)
// because an object store serves a bounded request rate per key prefix (about 5,500 GET/s in AWS
// S3), and readers of one dataset would otherwise all queue behind one. The manifest, which lists
// those paths relative to PREFIX as a local one does, is uploaded last: a dataset exists at the
// prefix only once all of it is there, and is read with no listing (Dataset::open).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "storage/s3/s3_client.hpp"
#include "shard/pack/dataset_output.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/shard/manifest.hpp"

namespace zerowait::internal {

// "3f2a/shard-000042.zws": where shard `name` goes below the dataset prefix. Four hex digits of a
// hash of the name: neighbouring shards land on unrelated prefixes, the same name always on one.
std::string hashed_shard_path(const std::string& name);

class S3PackOutput final : public DatasetOutput {
 public:
  // Makes the process's S3 client (credentials, endpoint: docs/remote.md), checks that the bucket
  // answers, refuses a dataset already at the prefix (kAlreadyExists) unless `overwrite`, which
  // removes its manifest.json first so that no reader sees it listing new shards, and makes a
  // spool directory in `tmp_dir` (empty: $TMPDIR, else /tmp). Errors name s3://BUCKET/PREFIX.
  // `merged_url`: for a part (`pack --part I/N`), the prefix the parts are merged at, whose
  // manifest would list this part's shards: refused or removed the same way.
  static Result<std::unique_ptr<S3PackOutput>> open(const std::string& url,
                                                    const std::string& tmp_dir, bool overwrite,
                                                    const std::string& merged_url = "");
  ~S3PackOutput() override;  // waits for an upload in flight, removes the spool directory

  S3PackOutput(const S3PackOutput&) = delete;
  S3PackOutput& operator=(const S3PackOutput&) = delete;

  std::string spool_path(const std::string& name) override;
  // Waits for the previous shard's upload (its error, if any, is returned here), then starts
  // uploading this one on a thread of its own and returns hashed_shard_path(name).
  Result<std::string> publish(const std::string& spool, const std::string& name) override;
  Status finish() override;

  // Spooled shards need no fsync: the upload, checked by the server, is what makes them durable.
  bool sync_shards() const override { return false; }
  // Uploads a small file (quarantine.json, the manifest) to PREFIX/name with one PUT.
  Status put_file(const std::string& name, std::string_view text) override;
  // After a new manifest is up: removes shards under the prefix that it does not list, left by an
  // earlier dataset or an interrupted pack. Best effort, as for a local directory.
  void remove_stale_shards(const std::vector<ManifestShard>& kept) override;
  // "s3://BUCKET/PREFIX/name"
  std::string location(const std::string& name) const override;

 private:
  S3PackOutput(std::shared_ptr<S3Client> client, S3Location root, std::string spool_dir);
  std::string key_of(const std::string& name) const;
  Status wait_for_upload();

  std::shared_ptr<S3Client> client_;
  std::string bucket_;
  std::string prefix_;  // without a trailing '/'; empty for the bucket's root
  std::string spool_dir_;
  std::thread upload_;  // the shard upload in flight, if any
  Status upload_status_;
};

}  // namespace zerowait::internal
