// The page cache's share of files, asked of the kernel (mincore), and a warm-up that reads only
// what is missing, within its byte budget. The files are dropped from the cache with
// POSIX_FADV_DONTNEED first; where the file system keeps them anyway (tmpfs), the tests skip.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "testing/testing.hpp"
#include "zerowait/host/page_cache.hpp"

namespace zerowait {
namespace {

using testing::kMiB;

void write_file(const std::string& path, uint64_t bytes) {
  std::ofstream out(path, std::ios::binary);
  const std::string chunk(kMiB, 'z');
  for (uint64_t done = 0; done < bytes; done += kMiB) out.write(chunk.data(), long(kMiB));
}

// Written back and dropped from the page cache; false where the kernel keeps the pages.
bool evict(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  fsync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  const Result<FileResidency> r = file_residency(path);
  return r.is_ok() && r->resident_bytes < r->bytes / 4;
}

class PageCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      paths_.push_back(dir_.path() + "/shard-" + std::to_string(i));
      write_file(paths_.back(), 12 * kMiB);
    }
    for (const std::string& p : paths_) {
      if (!evict(p)) GTEST_SKIP() << "this file system keeps pages after POSIX_FADV_DONTNEED";
    }
  }
  testing::TempDir dir_;
  std::vector<std::string> paths_;
};

TEST_F(PageCacheTest, ResidencyFollowsReads) {
  Result<Residency> before = residency(paths_);
  ASSERT_TRUE(before.is_ok()) << before.status().message();
  EXPECT_EQ(before->bytes, 24 * kMiB);
  EXPECT_LT(before->share(), 0.25);
  {
    std::ifstream in(paths_[0], std::ios::binary);
    std::vector<char> all(12 * kMiB);
    in.read(all.data(), long(all.size()));
  }
  Result<Residency> after = residency(paths_);
  ASSERT_TRUE(after.is_ok());
  EXPECT_EQ(after->files[0].resident_bytes, 12 * kMiB);
  EXPECT_LT(after->files[1].resident_bytes, 3 * kMiB);
}

TEST_F(PageCacheTest, WarmReadsWhatIsMissingWithinItsBudget) {
  WarmOptions capped;
  capped.max_bytes = 10 * kMiB;  // two 4 MiB chunks fit, a third would not
  uint64_t last_done = 0, last_total = 0;
  capped.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
  };
  Result<WarmReport> first = warm_page_cache(paths_, capped);
  ASSERT_TRUE(first.is_ok()) << first.status().message();
  EXPECT_EQ(first->bytes_read, 8 * kMiB);
  EXPECT_TRUE(first->capped);
  EXPECT_EQ(last_total, 10 * kMiB);
  EXPECT_GE(first->after.resident_bytes, first->before.resident_bytes + 8 * kMiB);

  Result<WarmReport> rest = warm_page_cache(paths_, {});
  ASSERT_TRUE(rest.is_ok());
  EXPECT_FALSE(rest->capped);
  EXPECT_LE(rest->bytes_read, 16 * kMiB);  // not the chunks the first warm-up read
  EXPECT_EQ(rest->after.resident_bytes, 24 * kMiB);

  Result<WarmReport> again = warm_page_cache(paths_, {});
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->bytes_read, 0u);
}

TEST(PageCache, AUserWhomMincoreDoesNotAnswerIsToldSoAndWarmsEverything) {
  // A file this user neither owns nor may write: root's, read by nobody; /etc/passwd for a
  // user who is not root.
  testing::TempDir dir;
  const bool root = ::geteuid() == 0;
  const std::string path = root ? dir.path() + "/shard" : "/etc/passwd";
  if (root) {
    write_file(path, 12 * kMiB);
    ::chmod(dir.path().c_str(), 0755);
    ::chmod(path.c_str(), 0644);
  }
  ASSERT_TRUE(warm_page_cache({path}, {}).is_ok());  // resident, as far as anyone can tell
  const std::string seen = testing::run_unprivileged([&] {
    const Result<Residency> r = residency({path});
    const Result<WarmReport> warm = warm_page_cache({path}, {});
    if (!r.is_ok() || !warm.is_ok()) return std::string("error");
    return std::to_string(r->files[0].measured) + " " + std::to_string(r->unmeasured_bytes) + " " +
           std::to_string(std::isnan(r->share())) + " " + std::to_string(warm->bytes_read);
  });
  const uint64_t size = std::filesystem::file_size(path);
  // Not measured, all of it, share unknown; the warm-up read the whole file (it cannot know).
  EXPECT_EQ(seen, "0 " + std::to_string(size) + " 1 " + std::to_string(size));
}

TEST(PageCache, MissingFilesAreNamedAndEmptyOnesResident) {
  testing::TempDir dir;
  const std::string missing = dir.path() + "/nope";
  Result<FileResidency> r = file_residency(missing);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find(missing), std::string::npos);
  const std::string empty = dir.path() + "/empty";
  write_file(empty, 0);
  Result<Residency> all = residency({empty});
  ASSERT_TRUE(all.is_ok());
  EXPECT_EQ(all->share(), 1.0);
}

}  // namespace
}  // namespace zerowait
