#include "zerowait/storage/cache_directory.hpp"

#include <pwd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "zerowait/storage/url.hpp"

namespace zerowait {
namespace {

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// The home directory of this process's user in the password database: a batch job or a
// container may start without HOME.
std::string password_home() {
  const long hint = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(hint > 0 ? size_t(hint) : 16384);
  passwd entry{};
  passwd* found = nullptr;
  if (::getpwuid_r(::geteuid(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr || found->pw_dir == nullptr) {
    return "";
  }
  return found->pw_dir;
}

}  // namespace

Result<std::string> user_cache_directory() {
  const std::string named = env_or_empty(kCacheDirectoryVariable);
  if (!named.empty()) {
    if (named[0] != '/') {
      return invalid_argument(std::string(kCacheDirectoryVariable) + "=" + named +
                              " is not an absolute path; name a directory on local disk");
    }
    return named;
  }
  const std::string xdg = env_or_empty("XDG_CACHE_HOME");
  if (!xdg.empty() && xdg[0] == '/') return xdg + "/zerowait";
  std::string home = env_or_empty("HOME");
  if (home.empty() || home[0] != '/') home = password_home();
  if (home.empty()) {
    return invalid_argument(
        "no cache directory for user " + std::to_string(::geteuid()) +
        ": XDG_CACHE_HOME and HOME are unset and the password database names no "
        "home; set XDG_CACHE_HOME to a directory on local disk");
  }
  return (home == "/" ? "" : home) + "/.cache/zerowait";
}

Result<std::string> default_cache_directory(const char* subdirectory) {
  ZW_ASSIGN_OR_RETURN(const std::string root, user_cache_directory());
  return root + "/" + subdirectory;
}

Result<std::string> make_default_cache_directory(const char* subdirectory) {
  ZW_ASSIGN_OR_RETURN(const std::string root, user_cache_directory());
  // The parent (~/.cache) as any program makes it; zerowait's own directories private.
  std::error_code error;
  const std::filesystem::path parent = std::filesystem::path(root).parent_path();
  std::filesystem::create_directories(parent, error);
  if (error) {
    return errno_status(error.value(), "cannot create the cache directory", parent.string());
  }
  const std::string dir = root + "/" + subdirectory;
  for (const std::string& path : {root, dir}) {
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
      return errno_status(errno, "cannot create the cache directory", path);
    }
  }
  return dir;
}

Result<std::shared_ptr<BlockCache>> open_default_block_cache(std::string_view dataset_path,
                                                             uint64_t capacity_bytes) {
  if (!is_url(dataset_path)) return std::shared_ptr<BlockCache>();
  BlockCacheOptions options;
  ZW_ASSIGN_OR_RETURN(options.directory, make_default_cache_directory(kBlockCacheSubdirectory));
  options.capacity_bytes = capacity_bytes;
  if (capacity_bytes == 0) {
    struct statvfs fs {};
    if (::statvfs(options.directory.c_str(), &fs) != 0) {
      return errno_status(errno, "cannot measure the file system of", options.directory);
    }
    const uint64_t tenth = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize / 10;
    options.capacity_bytes = std::max<uint64_t>(1, std::min(tenth, kDefaultCacheMaxBytes));
  }
  return BlockCache::open(std::move(options));
}

}  // namespace zerowait
