// Where zerowait keeps a user's caches when the caller names no directory: under the user's own
// cache directory (the XDG Base Directory spec's), so that an ordinary user on a cluster node
// needs no root and shares nothing with other users. docs/cache.md lists what goes where.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/block_cache.hpp"

namespace zerowait {

// The environment variable that names zerowait's cache directory outright (an absolute path),
// ahead of the XDG rule below: a node's local NVMe when home directories are on NFS.
inline constexpr const char* kCacheDirectoryVariable = "ZEROWAIT_CACHE_DIR";

// $ZEROWAIT_CACHE_DIR when set (kInvalidArgument naming it when it is not an absolute path), else
// $XDG_CACHE_HOME/zerowait when XDG_CACHE_HOME is an absolute path (the spec ignores a relative
// one), else $HOME/.cache/zerowait, else the password database's home directory +
// /.cache/zerowait. kInvalidArgument naming XDG_CACHE_HOME and HOME when no home is known.
// Nothing is created. Thread-safe (reads the environment).
Result<std::string> user_cache_directory();

// The caches under it, one subdirectory each.
inline constexpr const char* kBlockCacheSubdirectory = "blocks";   // remote data (BlockCache)
inline constexpr const char* kTarIndexSubdirectory = "tar-index";  // indexes of read-only tars

// user_cache_directory() + "/" + `subdirectory`: the default directory of that cache.
Result<std::string> default_cache_directory(const char* subdirectory);

// default_cache_directory(subdirectory), created if missing: the directories zerowait creates
// are 0700 (the spec's mode; a user's cache may name the data it holds). Errors name the path.
Result<std::string> make_default_cache_directory(const char* subdirectory);

// The cap of the cache remote data gets when nobody names one: a tenth of the cache's file system,
// at most this. A cache taken without being asked for should not fill a shared node's disk.
inline constexpr uint64_t kDefaultCacheMaxBytes = 64ull << 30;

// The node-local cache a dataset at `dataset_path` reads its remote shards through when its
// caller chose none: for a URL, the cache in make_default_cache_directory(kBlockCacheSubdirectory)
// capped at `capacity_bytes` (0: min(a tenth of its file system, kDefaultCacheMaxBytes)), shared
// with every process of the node that opens it; for a local path, null (the page cache keeps local
// files). The one place that decides; the CLI and Python ask it. Errors name the directory.
Result<std::shared_ptr<BlockCache>> open_default_block_cache(std::string_view dataset_path,
                                                             uint64_t capacity_bytes = 0);

}  // namespace zerowait
