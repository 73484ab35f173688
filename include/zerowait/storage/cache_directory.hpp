// Where zerowait keeps a user's caches when the caller names no directory: under the user's own
// cache directory (the XDG Base Directory spec's), so that an ordinary user on a cluster node
// needs no root and shares nothing with other users. docs/cache.md lists what goes where.
#pragma once

#include <string>

#include "zerowait/common/status.hpp"

namespace zerowait {

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

}  // namespace zerowait
