// Where zerowait keeps a user's caches by default ($XDG_CACHE_HOME/zerowait, ~/.cache/zerowait),
// and the cache that uses it today: the index of a WebDataset tar in a directory the user may not
// write. The last test runs the CLI as an unprivileged user over a root-owned dataset.
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include "testing/testing.hpp"
#include "zerowait/storage/cache_directory.hpp"
#include "zerowait/shard/webdataset.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Sets (or with nullopt unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string expect_ok(const Result<std::string>& result) {
  EXPECT_TRUE(result.is_ok()) << result.status().to_string();
  return result.is_ok() ? *result : "";
}

TEST(CacheDirectory, FollowsTheXdgBaseDirectorySpec) {
  ScopedEnv home("HOME", "/home/someone");
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/scratch/cache");
    EXPECT_EQ(expect_ok(user_cache_directory()), "/scratch/cache/zerowait");
    EXPECT_EQ(expect_ok(default_cache_directory(kBlockCacheSubdirectory)),
              "/scratch/cache/zerowait/blocks");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "relative/cache");  // the spec ignores a relative one
    EXPECT_EQ(expect_ok(user_cache_directory()), "/home/someone/.cache/zerowait");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "");
    EXPECT_EQ(expect_ok(default_cache_directory(kTarIndexSubdirectory)),
              "/home/someone/.cache/zerowait/tar-index");
  }
}

TEST(CacheDirectory, WithoutHomeThePasswordDatabaseHasIt) {
  ScopedEnv xdg("XDG_CACHE_HOME", std::nullopt);
  ScopedEnv home("HOME", std::nullopt);
  const passwd* entry = ::getpwuid(::geteuid());
  ASSERT_NE(entry, nullptr);
  const std::string pw_home = entry->pw_dir;
  EXPECT_EQ(expect_ok(user_cache_directory()),
            (pw_home == "/" ? "" : pw_home) + "/.cache/zerowait");
}

TEST(CacheDirectory, MadeOnlyWhenUsedAndPrivate) {
  TempDir dir;
  ScopedEnv xdg("XDG_CACHE_HOME", dir / "cache");
  EXPECT_FALSE(fs::exists(dir / "cache")) << "naming the directory creates nothing";
  EXPECT_EQ(expect_ok(make_default_cache_directory(kTarIndexSubdirectory)),
            dir / "cache/zerowait/tar-index");
  for (const std::string& path : {dir / "cache/zerowait", dir / "cache/zerowait/tar-index"}) {
    struct stat info {};
    ASSERT_EQ(::stat(path.c_str(), &info), 0) << path;
    EXPECT_EQ(info.st_mode & 0777, 0700u) << path;
  }
  // A cache home that cannot be made is an error naming it.
  testing::write_file(dir / "file", "");
  ScopedEnv blocked("XDG_CACHE_HOME", dir / "file");
  const Result<std::string> made = make_default_cache_directory(kTarIndexSubdirectory);
  ASSERT_FALSE(made.is_ok());
  EXPECT_NE(made.status().message().find(dir / "file"), std::string::npos)
      << made.status().to_string();
}

TEST(CacheDirectory, ZerowaitCacheDirComesFirst) {
  ScopedEnv xdg("XDG_CACHE_HOME", "/scratch/cache");
  {
    ScopedEnv named(kCacheDirectoryVariable, "/nvme/zw");
    EXPECT_EQ(expect_ok(user_cache_directory()), "/nvme/zw");
    EXPECT_EQ(expect_ok(default_cache_directory(kBlockCacheSubdirectory)), "/nvme/zw/blocks");
  }
  // A relative one (or a URL) is refused, naming the variable, rather than resolved against
  // whatever directory the job happens to start in.
  for (const char* wrong : {"relative/zw", "s3://bucket/zw"}) {
    ScopedEnv named(kCacheDirectoryVariable, wrong);
    const Result<std::string> dir = user_cache_directory();
    ASSERT_FALSE(dir.is_ok()) << wrong;
    EXPECT_EQ(dir.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(dir.status().message().find("ZEROWAIT_CACHE_DIR=" + std::string(wrong)),
              std::string::npos)
        << dir.status().to_string();
  }
}

TEST(DefaultBlockCache, OnlyRemoteDatasetsGetOneInTheDefaultDirectoryCapped) {
  TempDir dir;
  ScopedEnv named(kCacheDirectoryVariable, dir / "zw");
  for (const char* local : {"/data/train", "relative/train", "train/manifest.json"}) {
    const Result<std::shared_ptr<BlockCache>> none = open_default_block_cache(local);
    ASSERT_TRUE(none.is_ok()) << none.status().to_string();
    EXPECT_EQ(*none, nullptr) << local;
  }
  EXPECT_FALSE(fs::exists(dir / "zw")) << "local data creates no cache";

  const Result<std::shared_ptr<BlockCache>> cache = open_default_block_cache("s3://bucket/train/");
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  ASSERT_NE(*cache, nullptr);
  EXPECT_EQ((*cache)->options().directory, dir / "zw/blocks");
  EXPECT_GT((*cache)->options().capacity_bytes, 0u);
  EXPECT_LE((*cache)->options().capacity_bytes, kDefaultCacheMaxBytes);
  // A cap the caller gives wins; the directory is the same, shared with the first.
  const Result<std::shared_ptr<BlockCache>> capped =
      open_default_block_cache("https://host/train/{000..003}.tar", 64 << 20);
  ASSERT_TRUE(capped.is_ok()) << capped.status().to_string();
  EXPECT_EQ((*capped)->options().directory, dir / "zw/blocks");
  EXPECT_EQ((*capped)->options().capacity_bytes, 64u << 20);
}

// A one-member tar at `path`, made by the system's tar.
void make_tar(const TempDir& dir, const std::string& path) {
  testing::write_file(dir / "src/a.jpg", "11");
  const testing::CommandResult r =
      testing::run_command({"/usr/bin/tar", "-cf", path, "-C", dir / "src", "a.jpg"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

size_t open_and_count(const std::string& tar) {
  const Result<std::shared_ptr<ShardReader>> reader = open_tar_shard(tar);
  EXPECT_TRUE(reader.is_ok()) << reader.status().to_string();
  return reader.is_ok() ? (*reader)->size() : 0;
}

TEST(TarIndexCache, WhereTheTarsDirectoryIsNotWritableItGoesToTheUserCache) {
  TempDir dir;
  ScopedEnv xdg("XDG_CACHE_HOME", dir / "cache");
  make_tar(dir, dir / "x.tar");
  fs::create_directory(dir / "x.tar.zwidx");  // nothing can be written beside the tar
  const std::string cached = expect_ok(tar_index_user_cache_path(dir / "x.tar"));
  EXPECT_EQ(cached.rfind(dir / "cache/zerowait/tar-index/", 0), 0u) << cached;
  EXPECT_EQ(open_and_count(dir / "x.tar"), 1u);
  ASSERT_TRUE(fs::is_regular_file(cached));
  const auto written = fs::last_write_time(cached);
  EXPECT_EQ(open_and_count(dir / "x.tar"), 1u);
  EXPECT_EQ(fs::last_write_time(cached), written) << "the cached index was rebuilt, not reused";
  // A relative path to the same tar finds the same index.
  const fs::path before = fs::current_path();
  fs::current_path(dir.path());
  EXPECT_EQ(expect_ok(tar_index_user_cache_path("x.tar")), cached);
  fs::current_path(before);
}

TEST(TarIndexCache, NeitherPlaceWritableOnlyCostsTheCache) {
  TempDir dir;
  testing::write_file(dir / "file", "");
  ScopedEnv xdg("XDG_CACHE_HOME", dir / "file");  // no directory can be made under a file
  make_tar(dir, dir / "x.tar");
  fs::create_directory(dir / "x.tar.zwidx");
  EXPECT_EQ(open_and_count(dir / "x.tar"), 1u);
  EXPECT_EQ(open_and_count(dir / "x.tar"), 1u);
  EXPECT_TRUE(fs::is_directory(dir / "x.tar.zwidx"));
}

TEST(TarIndexCache, AnUnprivilegedUserReadingARootOwnedDataset) {
  TempDir data, home;
  make_tar(data, data / "x.tar");
  fs::permissions(data.path(), fs::perms(0755));
  fs::permissions(data / "x.tar", fs::perms(0644));
  fs::permissions(home.path(), fs::perms::all);  // the user's home: theirs to write
  const bool root = ::geteuid() == 0;
  if (!root) fs::permissions(data.path(), fs::perms(0555));  // not writable to this user either
  const testing::CommandResult r = testing::run_cli_unprivileged(
      {"inspect", data / "x.tar"}, {"HOME=" + home.path(), "XDG_CACHE_HOME="});
  if (!root) fs::permissions(data.path(), fs::perms(0755));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(data / "x.tar.zwidx")) << "written beside a tar the user may not write";
  size_t indexes = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(home / ".cache/zerowait/tar-index")) {
    EXPECT_EQ(e.path().extension(), ".zwidx") << e.path();
    ++indexes;
  }
  EXPECT_EQ(indexes, 1u);
  EXPECT_EQ(r.err.find("kept in memory only"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace zerowait
