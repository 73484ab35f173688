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
#include "zerowait/storage/open.hpp"
#include "zerowait/storage/store.hpp"
#include "zerowait/shard/manifest.hpp"
#include "zerowait/shard/reader.hpp"

namespace zerowait {

struct DatasetOptions {
  IoBackend backend = IoBackend::kPread;
  // Unset, `path` and the shards are paths or URLs read through the storage registry
  // (zerowait/storage/open.hpp). Set, they are names in this store, which every read goes
  // through: how a test reads a dataset through a FaultStore (zerowait/storage/fault_store.hpp)
  // that fails, stalls, cuts short or observes its reads.
  std::shared_ptr<Store> store;
  // Shards fetched over the network (http(s)://, s3://) are read through this node-local cache
  // when set (docs/cache.md).
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
  // `path` is a local path or a URL (http(s)://, s3://BUCKET/KEY; docs/remote.md), read the same
  // way: a manifest.json; a folder holding one; a folder of .zws / .tar files without one (listed
  // where the storage lists folders; each shard's footer or tar index is read); a single .zws;
  // a single .tar; or a brace list of shards as WebDataset writes them:
  // "shard-{000000..000099}.tar", "{train,extra}/shard-0.zws" (each opened at once). A manifest
  // is read whole (one GET at a URL), and shards with ranged reads when first used. s3:// takes
  // its settings from the environment and the AWS config files, as the AWS SDKs do.
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
  static std::shared_ptr<Dataset> make(std::string path, DatasetOptions options);
  // path_ as a manifest (.json), or a folder holding one or holding shards.
  Status open_manifest_or_folder();
  // The dataset's objects by path or URL (or by name in options_.store): a whole one (a
  // manifest), a folder's names, a shard (read through the cache). `known`: what the manifest
  // says of it.
  Result<std::string> read_whole(const std::string& path) const;
  Result<std::vector<std::string>> list_folder(const std::string& path) const;
  Result<std::shared_ptr<ShardReader>> open_shard_at(const std::string& path,
                                                     const KnownObject* known) const;
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
