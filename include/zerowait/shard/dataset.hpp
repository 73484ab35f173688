// A dataset: many shards behind one global sample index.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/block_cache.hpp"
#include "zerowait/storage/byte_source.hpp"
#include "zerowait/shard/manifest.hpp"
#include "zerowait/shard/reader.hpp"

namespace zerowait {

struct DatasetOptions {
  IoBackend backend = IoBackend::kPread;
  // Every shard file, once opened with `backend`, is read through what this returns (empty:
  // the file itself). See SourceWrapper.
  SourceWrapper wrap_source;
  // Remote shards (http(s)://, s3://) are read through this node-local cache when set
  // (docs/cache.md); `wrap_source` then wraps the cached source.
  std::shared_ptr<BlockCache> cache;
  // The most memory the open shards' indexes may hold (about 48 bytes a sample): past it, the
  // shards used longest ago are closed (a reader still in use stays valid until released) and
  // reopened when needed again. At 10^9 samples every index at once would take ~48 GB. The shard
  // just opened is always kept, so a single larger shard still works.
  uint64_t index_budget_bytes = 1ull << 30;
};

// Where global sample i lives.
struct SampleLocation {
  size_t shard = 0;
  uint64_t local = 0;
};

// Thread-safe: every method may be called from many threads; shards open lazily on first use
// (different shards in parallel, each shard once), and stay open while their indexes fit
// `index_budget_bytes`. Readers returned by shard() are shared: they stay valid after the Dataset
// closed them or is gone. Errors name the manifest or shard file.
class Dataset {
 public:
  // `path` is one of: a manifest.json; a directory holding one; a directory of .zws / .tar files
  // (no manifest: each shard's footer or tar index is read); a single .zws; a single .tar.
  // Or an http(s):// or s3://BUCKET/KEY URL of a manifest.json, of a folder (prefix) holding
  // one, or of a single .zws: the manifest comes with one GET (no listing), and shards are read
  // with ranged GETs (docs/remote.md). s3:// takes its settings from the environment and the AWS
  // config files, as the AWS SDKs do. Or a brace list of shards, local or remote, as WebDataset
  // writes them: "shard-{000000..000099}.tar", "{train,extra}/shard-0.zws" (each opened at once).
  static Result<std::shared_ptr<Dataset>> open(const std::string& path,
                                               DatasetOptions options = {});

  const std::string& path() const { return path_; }
  // The backend its shard files are opened with (DatasetOptions::backend).
  IoBackend backend() const { return options_.backend; }
  // The node-local cache remote shards are read through; null without one.
  const std::shared_ptr<BlockCache>& cache() const { return options_.cache; }
  // The manifest as written by pack, or one synthesized from the shards.
  const Manifest& manifest() const { return manifest_; }
  uint64_t size() const { return manifest_.samples; }
  size_t shard_count() const { return shard_paths_.size(); }
  const std::string& shard_path(size_t s) const { return shard_paths_[s]; }
  const std::vector<std::string>& fields() const { return manifest_.fields; }
  const std::vector<std::string>& classes() const { return manifest_.classes; }

  // kInvalidArgument when i >= size().
  Result<SampleLocation> locate(uint64_t global_index) const;
  // Opens (unless open) and returns shard s. A shard whose sample count or size disagrees with
  // the manifest is kCorrupt.
  Result<std::shared_ptr<ShardReader>> shard(size_t s) const;
  // Shard s if it is open now, else null: never opens one (for hints that must not wait).
  std::shared_ptr<ShardReader> shard_if_open(size_t s) const;
  // Opens these shards, several at once (a remote shard's opening costs round trips); the first
  // error, in the list's order.
  Status open_shards(const std::vector<size_t>& shards) const;
  // The indexes held now, and how many times a shard was opened (reopens included).
  struct IndexUse {
    uint64_t bytes = 0;
    uint64_t shards_open = 0;
    uint64_t opens = 0;
  };
  IndexUse index_use() const;
  // Reads one sample into a buffer of its own. Its key and field names point into the shard's
  // index: valid while this Dataset lives.
  Result<Sample> read(uint64_t global_index, const ReadOptions& options = {}) const;

 private:
  Dataset() = default;
  // A dataset at `path` with `options`, the cache (if any) folded into options_.wrap_source.
  static std::shared_ptr<Dataset> make(std::string path, DatasetOptions options);
  static Result<std::shared_ptr<Dataset>> open_remote(const std::string& url,
                                                      DatasetOptions options);
  Status add_shard_paths(const std::vector<std::string>& paths, bool from_manifest);

  std::string path_;
  DatasetOptions options_;
  Manifest manifest_;
  std::vector<std::string> shard_paths_;  // absolute or relative to the working directory
  std::vector<uint64_t> first_index_;     // first global index of each shard, plus the total
  // Opens shard s and checks it against the manifest; no lock held.
  Result<std::shared_ptr<ShardReader>> open_checked(size_t s) const;
  Result<std::shared_ptr<ShardReader>> check_against_manifest(
      size_t s, std::shared_ptr<ShardReader> reader) const;
  // Keeps shard s's reader, closing the least recently used others past the budget. Locked.
  void hold(size_t s, std::shared_ptr<ShardReader> reader) const;

  mutable std::mutex mutex_;
  mutable std::vector<std::shared_ptr<ShardReader>> readers_;
  mutable std::list<size_t> recently_used_;  // open shards, most recent first
  mutable std::vector<std::list<size_t>::iterator> place_in_recent_;
  mutable IndexUse index_use_;
  mutable std::vector<char> opening_;      // a thread is opening shard s, without the lock
  mutable std::condition_variable opened_;  // an opening ended
};

}  // namespace zerowait
