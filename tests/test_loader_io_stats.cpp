// What a Loader's stats say about its reads: the backend in use (not the one asked for, when it
// fell back) and this loader's own fallback count, with fallbacks forced where they are known by
// construction (every shard refused O_DIRECT; io_uring disabled in a child process).
#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/log.hpp"
#include "storage/local/file_sources.hpp"
#include "testing/testing.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/writer.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;

constexpr size_t kShards = 3;
constexpr uint64_t kSamplesPerShard = 20;

// kShards shards of kSamplesPerShard samples with one field each.
void write_shards(const std::string& dir) {
  for (size_t s = 0; s < kShards; ++s) {
    auto writer =
        ShardWriter::create(dir + "/shard-" + std::to_string(s) + ".zws", {.sync = false});
    ASSERT_TRUE(writer.is_ok()) << writer.status().to_string();
    for (uint64_t i = 0; i < kSamplesPerShard; ++i) {
      const std::string bytes(100 + i, char('a' + s));
      const std::vector<FieldData> fields = {{"bin", std::as_bytes(std::span(bytes))}};
      ASSERT_TRUE(
          writer->add_sample("s" + std::to_string(s) + "-" + std::to_string(i), fields).is_ok());
    }
    ASSERT_TRUE(writer->finish().is_ok());
  }
}

// Reads one epoch; returns the loader's stats after it.
LoaderStats read_epoch(const std::string& dir, IoBackend io) {
  LoaderOptions options;
  options.io = io;
  options.batch_size = 8;
  options.threads = 2;
  auto loader = Loader::open(dir, options);
  EXPECT_TRUE(loader.is_ok()) << loader.status().to_string();
  if (!loader.is_ok()) return {};
  uint64_t samples = 0;
  for (;;) {
    auto batch = (*loader)->next();
    EXPECT_TRUE(batch.is_ok()) << batch.status().to_string();
    if (!batch.is_ok() || *batch == nullptr) break;
    samples += (*batch)->samples();
  }
  EXPECT_EQ(samples, kShards * kSamplesPerShard);
  return (*loader)->stats();
}

TEST(LoaderIoStats, ODirectRefusedReportsTheBufferedBackendAndOneFallbackPerShard) {
  testing::TempDir dir;
  write_shards(dir.path());
  internal::fail_direct_open_for_testing(EINVAL);  // as tmpfs before Linux 6.6 refuses it
  const LoaderStats refused = read_epoch(dir.path(), IoBackend::kDirect);
  internal::fail_direct_open_for_testing(0);
  EXPECT_EQ(refused.io, io_uring_available() ? "io_uring" : "pread");
  EXPECT_EQ(refused.io_fallbacks, kShards);

  // Another loader in the same process counts its own: none, though the process has noted some.
  const LoaderStats plain = read_epoch(dir.path(), IoBackend::kPread);
  EXPECT_EQ(plain.io, "pread");
  EXPECT_EQ(plain.io_fallbacks, 0u);
  EXPECT_GE(internal::fallback_count("direct"), kShards);
}

TEST(LoaderIoStats, ODirectThatWorksIsReportedAsDirectWithoutFallbacks) {
  testing::TempDir dir;
  write_shards(dir.path());
  bool direct = false;
  ASSERT_TRUE(internal::open_direct_or_buffered(dir / "shard-0.zws", &direct).is_ok());
  if (!direct) GTEST_SKIP() << "this file system refuses O_DIRECT";
  const LoaderStats stats = read_epoch(dir.path(), IoBackend::kDirect);
  EXPECT_EQ(stats.io, "direct");
  EXPECT_EQ(stats.io_fallbacks, 0u);
}

// Runs ChildWithIoUringDisabled in a child process of this test binary, with io_uring disabled.
TEST(LoaderIoStats, IoUringRefusedReportsPreadAndOneFallbackPerShard) {
  const std::string self = fs::read_symlink("/proc/self/exe");
  const testing::CommandResult r =
      testing::run_command({self, "--gtest_filter=LoaderIoStats.ChildWithIoUringDisabled"},
                           {"ZEROWAIT_DISABLE_IO_URING=1"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[  PASSED  ] 1 test"), std::string::npos) << r.out;
}

TEST(LoaderIoStats, ChildWithIoUringDisabled) {
  if (std::getenv("ZEROWAIT_DISABLE_IO_URING") == nullptr) {
    GTEST_SKIP() << "runs as a child of IoUringRefusedReportsPreadAndOneFallbackPerShard";
  }
  testing::TempDir dir;
  write_shards(dir.path());
  const LoaderStats stats = read_epoch(dir.path(), IoBackend::kIoUring);
  EXPECT_EQ(stats.io, "pread");
  EXPECT_EQ(stats.io_fallbacks, kShards);
}

TEST(LoaderIoStats, ADatasetOpenedWithAnotherBackendIsRefused) {
  testing::TempDir dir;
  write_shards(dir.path());
  auto dataset = Dataset::open(dir.path());  // pread
  ASSERT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  LoaderOptions options;
  options.io = IoBackend::kMmap;
  const Status refused = Loader::create(*dataset, options).status();
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidArgument) << refused.to_string();
  EXPECT_NE(refused.message().find("'mmap'"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("'pread'"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("open_loader_dataset"), std::string::npos) << refused.message();
}

}  // namespace
}  // namespace zerowait
