// Every ByteSource backend on real files: random, unaligned and edge ranges equal the file's
// bytes; errors name path and offset; deadlines; a read that really hangs (a FIFO nobody writes)
// is cancelled at its deadline; concurrent readers; O_DIRECT's buffered fallback.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/file.hpp"
#include "common/log.hpp"
#include "storage/local/file_sources.hpp"
#include "storage/local/read_engine.hpp"
#include "testing/testing.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using namespace std::chrono_literals;

constexpr size_t kAlign = kDirectIoAlignment;

// Memory aligned for O_DIRECT, so a test can hand out aligned and deliberately unaligned buffers.
class AlignedMemory {
 public:
  explicit AlignedMemory(size_t size)
      : bytes_(
            static_cast<std::byte*>(std::aligned_alloc(kAlign, (size + kAlign) / kAlign * kAlign)),
            &std::free) {}
  std::byte* get() const { return bytes_.get(); }

 private:
  std::unique_ptr<std::byte, decltype(&std::free)> bytes_;
};

struct TestRange {
  uint64_t offset;
  size_t size;
  size_t misalign;  // of the destination buffer, 0 for an aligned one
};

// Edge cases, then `random_count` random ranges; half of all offsets and buffers are aligned.
std::vector<TestRange> make_ranges(uint64_t file_size, size_t random_count, uint64_t seed) {
  const uint64_t last_block = file_size / kAlign * kAlign;
  std::vector<TestRange> ranges = {
      {0, 0, 0},                                // empty
      {file_size, 0, 0},                        // empty, at the end
      {file_size - 1, 1, 0},                    // the last byte
      {file_size - 1, 1, 17},                   // the last byte into an unaligned buffer
      {0, file_size, 0},                        // the whole file
      {0, file_size, 5},                        // the whole file, unaligned buffer
      {kAlign, 2 * kAlign, 0},                  // fully aligned
      {last_block, file_size - last_block, 0},  // aligned start, ends at the file's end
      {kAlign - 1, 2, 0},                       // across a block boundary
      {3, kAlign * 3, 0},                       // unaligned offset, aligned length and buffer
  };
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < random_count; ++i) {
    uint64_t offset = rng() % file_size;
    if (rng() % 2) offset = offset / kAlign * kAlign;
    size_t size = static_cast<size_t>(rng() % std::min<uint64_t>(64 * 1024, file_size - offset));
    if (rng() % 2) size = size / kAlign * kAlign;
    ranges.push_back({offset, size, rng() % 2 ? 0 : static_cast<size_t>(1 + rng() % (kAlign - 1))});
  }
  return ranges;
}

// Reads `ranges` in one read() call and checks every byte against `content`.
void expect_reads_match(ByteSource& source, const std::string& content,
                        const std::vector<TestRange>& ranges) {
  size_t arena_size = 0;
  for (const TestRange& r : ranges) arena_size += (r.misalign + r.size + kAlign) / kAlign * kAlign;
  AlignedMemory arena(arena_size);
  std::memset(arena.get(), 0xAA, arena_size);
  std::vector<ReadRequest> requests;
  size_t at = 0;
  for (const TestRange& r : ranges) {
    requests.push_back({r.offset, {arena.get() + at + r.misalign, r.size}});
    at += (r.misalign + r.size + kAlign) / kAlign * kAlign;
  }
  Status status = source.read(requests, Deadline::none());
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  for (size_t i = 0; i < ranges.size(); ++i) {
    const std::string got(reinterpret_cast<const char*>(requests[i].dst.data()), ranges[i].size);
    ASSERT_TRUE(got == content.substr(ranges[i].offset, ranges[i].size))
        << "range " << i << ": offset " << ranges[i].offset << ", " << ranges[i].size
        << " bytes, buffer misaligned by " << ranges[i].misalign;
  }
}

// The open flags of this process's descriptor for `path` (from /proc/self/fdinfo), or -1 when it
// holds none: how a test sees whether a source really opened its file with O_DIRECT.
int open_flags_of(const std::string& path) {
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(entry.path(), ec) != path || ec) continue;
    const std::string info =
        testing::read_file("/proc/self/fdinfo/" + entry.path().filename().string());
    const size_t at = info.find("flags:");
    if (at != std::string::npos)
      return static_cast<int>(std::stol(info.substr(at + 6), nullptr, 8));
  }
  return -1;
}

// Whether the filesystem holding `path` accepts O_DIRECT, and if not, why.
std::string o_direct_unsupported_reason(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return "";
  }
  return "open(O_DIRECT) of " + path + " fails: " + std::strerror(errno);
}

std::string backend_test_name(const ::testing::TestParamInfo<IoBackend>& info) {
  return io_backend_name(info.param);
}

class AllBackends : public ::testing::TestWithParam<IoBackend> {
 protected:
  void SetUp() override {
    // Not a multiple of the block size: the last block is partial.
    // A backend that is not there would be replaced by pread, and the test would pass without
    // testing it: skip, saying why.
    if (GetParam() == IoBackend::kIoUring && !io_uring_available()) {
      GTEST_SKIP() << "io_uring is not available here: " << io_uring_unavailable_reason();
    }
    content_ = testing::random_bytes(3 * 1024 * 1024 + 1234, 7);
    testing::write_file(path_, content_);
    if (GetParam() == IoBackend::kDirect) {
      const std::string why = o_direct_unsupported_reason(path_);
      if (!why.empty()) GTEST_SKIP() << "no O_DIRECT here: " << why;
    }
    const uint64_t direct_fallbacks = internal::fallback_count("direct");
    auto source = open_file_source(path_, GetParam());
    ASSERT_TRUE(source.is_ok()) << source.status().to_string();
    source_ = std::move(source).value();
    if (GetParam() == IoBackend::kDirect) {
      EXPECT_EQ(internal::fallback_count("direct"), direct_fallbacks);
      EXPECT_NE(open_flags_of(path_) & O_DIRECT, 0) << "the direct source reads buffered";
    }
  }

  TempDir dir_;
  std::string path_ = dir_ / "data.bin";
  std::string content_;
  std::unique_ptr<ByteSource> source_;
};

TEST_P(AllBackends, RangesOfEveryShapeEqualTheFileBytes) {
  EXPECT_EQ(source_->size(), content_.size());
  // 310 requests in one call: more than a ring holds at once.
  expect_reads_match(*source_, content_, make_ranges(content_.size(), 300, 1));
  // Where io_uring works, every thread got its ring.
  if (io_uring_available()) {
    EXPECT_EQ(internal::fallback_count("io_uring_thread"), 0u);
  }
}

TEST_P(AllBackends, ARangePastTheEndIsCorruptNamingPathAndOffset) {
  std::vector<std::byte> buffer(100);
  const uint64_t offset = content_.size() - 50;
  Status status = source_->read_at(offset, buffer);
  EXPECT_EQ(status.code(), ErrorCode::kCorrupt) << status.to_string();
  EXPECT_NE(status.message().find("short read"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find(path_), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("offset " + std::to_string(offset)), std::string::npos)
      << status.message();
}

TEST_P(AllBackends, APassedDeadlineIsDeadlineExceededNamingPathAndOffset) {
  std::vector<std::byte> a(10), b(10);
  std::vector<ReadRequest> requests = {{123, a}, {456, b}};
  Status status = source_->read(requests, Deadline{Clock::now() - 1ms});
  EXPECT_EQ(status.code(), ErrorCode::kDeadlineExceeded) << status.to_string();
  EXPECT_NE(status.message().find(path_), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("offset 123"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("2 requests unfinished"), std::string::npos) << status.message();
}

TEST_P(AllBackends, AFutureDeadlineLetsTheReadFinish) {
  expect_reads_match(*source_, content_, make_ranges(content_.size(), 20, 2));
  std::vector<std::byte> buffer(4096);
  EXPECT_TRUE(source_->read_at(8192, buffer, Deadline::after(60s)).is_ok());
  EXPECT_EQ(std::memcmp(buffer.data(), content_.data() + 8192, buffer.size()), 0);
}

TEST_P(AllBackends, FourThreadsReadOneSourceAtOnce) {
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t call = 0; call < 10; ++call) {
        expect_reads_match(*source_, content_, make_ranges(content_.size(), 100, 100 * t + call));
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// Data loader workers are forked: a child must not use the ring its parent's thread set up.
TEST_P(AllBackends, AForkedChildReadsToo) {
  const std::vector<TestRange> ranges = make_ranges(content_.size(), 100, 5);
  expect_reads_match(*source_, content_, ranges);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    expect_reads_match(*source_, content_, ranges);
    ::_exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child failed: " << status;
  expect_reads_match(*source_, content_, ranges);
}

TEST_P(AllBackends, HintsAreHarmless) {
  source_->advise_sequential();
  source_->prefetch(0, content_.size());
  source_->prefetch(content_.size() + 10, 10);
  expect_reads_match(*source_, content_, make_ranges(content_.size(), 10, 3));
}

INSTANTIATE_TEST_SUITE_P(IoBackends, AllBackends,
                         ::testing::Values(IoBackend::kPread, IoBackend::kMmap, IoBackend::kIoUring,
                                           IoBackend::kDirect),
                         backend_test_name);

TEST(IoBackendNames, RoundTripAndAutoResolves) {
  for (IoBackend b :
       {IoBackend::kPread, IoBackend::kMmap, IoBackend::kIoUring, IoBackend::kDirect}) {
    auto parsed = parse_io_backend(io_backend_name(b));
    ASSERT_TRUE(parsed.is_ok());
    EXPECT_EQ(*parsed, b);
  }
  auto automatic = parse_io_backend("auto");
  ASSERT_TRUE(automatic.is_ok());
  EXPECT_EQ(*automatic, io_uring_available() ? IoBackend::kIoUring : IoBackend::kPread);
  EXPECT_EQ(io_uring_available(), io_uring_unavailable_reason().empty());
  auto bad = parse_io_backend("carrier-pigeon");
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  for (const char* name : {"auto", "pread", "mmap", "io_uring", "direct"}) {
    EXPECT_NE(bad.status().message().find(name), std::string::npos) << bad.status().message();
  }
}

// Runs ChildWithIoUringDisabled in a child process of this test binary, with io_uring disabled.
TEST(IoUringFallback, AutoAndIoUringReadWithPreadWhenIoUringIsDisabled) {
  const std::string self = fs::read_symlink("/proc/self/exe");
  testing::CommandResult r =
      testing::run_command({self, "--gtest_filter=IoUringFallback.ChildWithIoUringDisabled"},
                           {"ZEROWAIT_DISABLE_IO_URING=1"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[  PASSED  ] 1 test"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("io_uring is not available (disabled by ZEROWAIT_DISABLE_IO_URING); "
                       "reading with a pread thread pool"),
            std::string::npos)
      << r.err;
}

TEST(IoUringFallback, ChildWithIoUringDisabled) {
  if (std::getenv("ZEROWAIT_DISABLE_IO_URING") == nullptr) {
    GTEST_SKIP() << "runs as a child of AutoAndIoUringReadWithPreadWhenIoUringIsDisabled";
  }
  EXPECT_FALSE(io_uring_available());
  EXPECT_EQ(io_uring_unavailable_reason(), "disabled by ZEROWAIT_DISABLE_IO_URING");
  const uint64_t fallbacks = internal::fallback_count("io_uring");
  auto automatic = parse_io_backend("auto");
  ASSERT_TRUE(automatic.is_ok());
  EXPECT_EQ(*automatic, IoBackend::kPread);
  EXPECT_EQ(internal::fallback_count("io_uring"), fallbacks + 1);

  TempDir dir;
  const std::string content = testing::random_bytes(200 * 1000, 9);
  testing::write_file(dir / "f", content);
  for (IoBackend backend : {IoBackend::kIoUring, IoBackend::kDirect}) {
    auto source = open_file_source(dir / "f", backend);
    ASSERT_TRUE(source.is_ok()) << source.status().to_string();
    expect_reads_match(**source, content, make_ranges(content.size(), 100, 4));
  }
  EXPECT_EQ(internal::fallback_count("io_uring"), fallbacks + 3);
}

// A FIFO that this process holds open for writing too, and never writes: a read of it waits
// until it is cancelled.
class HangingFifo : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!io_uring_available()) GTEST_SKIP() << "io_uring: " << io_uring_unavailable_reason();
    ASSERT_EQ(::mkfifo(path_.c_str(), 0600), 0) << std::strerror(errno);
    const int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);  // O_RDWR: opens without a writer
    ASSERT_GE(fd, 0) << std::strerror(errno);
    fifo_ = internal::File(fd, path_);
  }

  TempDir dir_;
  std::string path_ = dir_ / "never-written.fifo";
  internal::File fifo_;
};

TEST_F(HangingFifo, IoUringReadIsCancelledAtItsDeadline) {
  std::vector<std::byte> a(64), b(64);
  std::vector<internal::RangeRead> ranges = {{0, a, a.size()}, {0, b, b.size()}};
  const auto start = Clock::now();
  std::optional<Status> status =
      internal::io_uring_read(fifo_, ranges, Deadline::after(200ms), /*direct=*/false);
  const auto elapsed = Clock::now() - start;
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), ErrorCode::kDeadlineExceeded) << status->to_string();
  EXPECT_NE(status->message().find(path_), std::string::npos) << status->message();
  EXPECT_NE(status->message().find("at offset 0 (2 requests unfinished)"), std::string::npos)
      << status->message();
  EXPECT_LT(elapsed, 60s);  // it returns; how promptly is the kernel's business

  // Both reads are gone: bytes written now are not taken by them, and the buffers stay as they
  // were.
  ASSERT_EQ(::write(fifo_.fd(), "later", 5), 5);
  char got[8] = {};
  ASSERT_EQ(::read(fifo_.fd(), got, sizeof got), 5);
  EXPECT_EQ(std::string(got, 5), "later");
  EXPECT_EQ(std::count(a.begin(), a.end(), std::byte{0}), 64);
  EXPECT_EQ(std::count(b.begin(), b.end(), std::byte{0}), 64);
}

TEST_F(HangingFifo, TheThreadsRingStillWorksAfterACancel) {
  std::vector<std::byte> a(8);
  std::vector<internal::RangeRead> hang = {{0, a, a.size()}};
  auto cancelled = internal::io_uring_read(fifo_, hang, Deadline::after(50ms), false);
  ASSERT_TRUE(cancelled.has_value());
  EXPECT_EQ(cancelled->code(), ErrorCode::kDeadlineExceeded);

  ASSERT_EQ(::write(fifo_.fd(), "12345678", 8), 8);
  auto read = internal::io_uring_read(fifo_, hang, Deadline::after(60s), false);
  ASSERT_TRUE(read.has_value());
  EXPECT_TRUE(read->is_ok()) << read->to_string();
  EXPECT_EQ(std::memcmp(a.data(), "12345678", 8), 0);
}

// The engines beneath the sources, asked for ranges the file does not have (as after a
// truncation): short reads are kCorrupt naming path and offset, except an O_DIRECT final block,
// which may end early.
class Engines : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (use_io_uring() && !io_uring_available()) {
      GTEST_SKIP() << "io_uring is not available here: " << io_uring_unavailable_reason();
    }
    testing::write_file(path_, content_);
    auto file = internal::File::open_read(path_);
    ASSERT_TRUE(file.is_ok());
    file_ = std::move(file).value();
  }
  bool use_io_uring() const { return GetParam(); }
  Status read(std::span<const internal::RangeRead> ranges, bool direct) {
    if (!use_io_uring()) return internal::pread_read(file_, ranges, Deadline::none(), direct);
    return internal::read_ranges(file_, ranges, Deadline::none(), direct);
  }

  TempDir dir_;
  std::string path_ = dir_ / "short.bin";
  std::string content_ = testing::random_bytes(10000, 5);
  internal::File file_;
};

TEST_P(Engines, AFileEndingInsideARangeIsAShortRead) {
  std::vector<std::byte> buffer(3000);
  std::vector<internal::RangeRead> ranges = {{0, buffer, 100}, {9000, buffer, buffer.size()}};
  Status status = read(ranges, false);
  EXPECT_EQ(status.code(), ErrorCode::kCorrupt) << status.to_string();
  EXPECT_NE(status.message().find("short read of '" + path_ + "' at offset 10000: needs 2000"),
            std::string::npos)
      << status.message();
}

TEST_P(Engines, AFinalBlockMayEndEarlyWhenOnlyItsStartIsNeeded) {
  AlignedMemory buffer(8192);
  std::vector<internal::RangeRead> ranges = {{8192, {buffer.get(), 8192}, 100}};
  Status status = read(ranges, true);
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(std::memcmp(buffer.get(), content_.data() + 8192, 10000 - 8192), 0);
}

INSTANTIATE_TEST_SUITE_P(PreadAndIoUring, Engines, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "io_uring" : "pread");
                         });

// A directory in /dev/shm (tmpfs), removed with its contents.
class ShmDir {
 public:
  ShmDir() {
    std::string tmpl = "/dev/shm/zerowait-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~ShmDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(DirectSource, ReadsCorrectlyOnTmpfsWithOrWithoutODirect) {
  ShmDir dir;
  if (dir.path().empty()) GTEST_SKIP() << "no writable /dev/shm";
  const std::string path = dir.path() + "/data.bin";
  const std::string content = testing::random_bytes(1000 * 1000 + 1, 11);
  testing::write_file(path, content);
  // tmpfs has O_DIRECT since Linux 6.6; before that the source falls back to buffered reads.
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  const bool has_o_direct = fd >= 0;
  if (fd >= 0) ::close(fd);
  const uint64_t fallbacks = internal::fallback_count("direct");
  auto source = open_file_source(path, IoBackend::kDirect);
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  EXPECT_EQ(internal::fallback_count("direct"), fallbacks + (has_o_direct ? 0 : 1));
  EXPECT_EQ((open_flags_of(path) & O_DIRECT) != 0, has_o_direct);
  expect_reads_match(**source, content, make_ranges(content.size(), 200, 12));
}

TEST(DirectSource, AFilesystemWithoutODirectFallsBackToBufferedReads) {
  TempDir dir;
  const std::string content = testing::random_bytes(300 * 1000, 13);
  testing::write_file(dir / "f", content);
  const uint64_t fallbacks = internal::fallback_count("direct");
  internal::fail_direct_open_for_testing(EINVAL);
  auto source = open_file_source(dir / "f", IoBackend::kDirect);
  internal::fail_direct_open_for_testing(0);
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  EXPECT_EQ(internal::fallback_count("direct"), fallbacks + 1);
  const int flags = open_flags_of(dir / "f");
  ASSERT_GE(flags, 0) << "the source holds no descriptor of " << dir / "f";
  EXPECT_EQ(flags & O_DIRECT, 0);
  expect_reads_match(**source, content, make_ranges(content.size(), 100, 14));
}

TEST(DirectSource, OtherOpenErrorsAreErrorsNamingThePath) {
  TempDir dir;
  testing::write_file(dir / "f", "x");
  internal::fail_direct_open_for_testing(EACCES);
  auto source = open_file_source(dir / "f", IoBackend::kDirect);
  internal::fail_direct_open_for_testing(0);
  EXPECT_EQ(source.status().code(), ErrorCode::kIo);
  EXPECT_NE(source.status().message().find(dir / "f"), std::string::npos);
  EXPECT_EQ(open_file_source(dir / "missing", IoBackend::kDirect).status().code(),
            ErrorCode::kNotFound);
}

TEST(DirectSource, AReadLargerThanTheBounceBufferAThreadKeepsWorks) {
  TempDir dir;
  const std::string content = testing::random_bytes(80 * 1024 * 1024 + 7, 15);
  testing::write_file(dir / "big", content);
  const std::string why = o_direct_unsupported_reason(dir / "big");
  if (!why.empty()) GTEST_SKIP() << "no O_DIRECT here: " << why;
  auto source = open_file_source(dir / "big", IoBackend::kDirect);
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  EXPECT_NE(open_flags_of(dir / "big") & O_DIRECT, 0) << "the direct source reads buffered";
  // 70 MiB through the bounce buffer in one call (more than a thread keeps), then small reads.
  expect_reads_match(**source, content, {{1, 70 * 1024 * 1024, 3}});
  expect_reads_match(**source, content, make_ranges(content.size(), 50, 16));
}

}  // namespace
}  // namespace zerowait
