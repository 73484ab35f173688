// The storage targets: the contract every target keeps (on a real temporary directory, in memory
// and in a bucket of a real S3 server), what only a local directory does, and the fault-injecting
// wrapper that the checkpoint tests use to see the order of operations and to fail one of them.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "storage/s3/s3_client.hpp"
#include "testing/checkpoint_state.hpp"
#include "testing/s3_server.hpp"
#include "testing/testing.hpp"
#include "zerowait/host/page_cache.hpp"
#include "zerowait/storage/fault_store.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

using testing::as_bytes;

using ::zerowait::testing::contains;

// Creates `path` (and its directory) holding `bytes` through the target, the way the checkpoint
// engine writes.
void write_through(Store& target, const std::string& path, std::string_view bytes) {
  ASSERT_TRUE(
      target.make_directory(fs::path(path).parent_path().string(), metadata_deadline()).is_ok());
  auto file = target.create(path, metadata_deadline());
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  ASSERT_TRUE((*file)->write_at(0, as_bytes(bytes), write_deadline()).is_ok());
  (*file)->start_writeback(0, bytes.size(), write_deadline());
  ASSERT_TRUE((*file)->sync(write_deadline()).is_ok());
  ASSERT_TRUE((*file)->close(write_deadline()).is_ok());
}

TEST(LocalDirectoryTarget, WritesAtOffsetsSyncsAndCloses) {
  TempDir dir;
  auto target = make_local_store(dir.path());
  EXPECT_EQ(target->describe(), dir.path());
  ASSERT_TRUE(target->make_directory("step_1/shards", metadata_deadline()).is_ok());
  ASSERT_TRUE(target->make_directory("step_1/shards", metadata_deadline()).is_ok())
      << "an existing one is fine";

  auto file = target->create("step_1/shards/a.bin", metadata_deadline());
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  // Out of order, as several writer threads would.
  ASSERT_TRUE((*file)->write_at(5, as_bytes("world"), write_deadline()).is_ok());
  ASSERT_TRUE((*file)->write_at(0, as_bytes("hello"), write_deadline()).is_ok());
  (*file)->start_writeback(0, 10, write_deadline());
  ASSERT_TRUE((*file)->sync(write_deadline()).is_ok());
  ASSERT_TRUE((*file)->close(write_deadline()).is_ok());
  ASSERT_TRUE(target->sync_directory("step_1/shards", metadata_deadline()).is_ok());
  ASSERT_TRUE(target->sync_directory("", metadata_deadline()).is_ok());

  EXPECT_EQ(testing::read_file(dir / "step_1/shards/a.bin"), "helloworld");
  EXPECT_EQ(*target->read("step_1/shards/a.bin", metadata_deadline()), "helloworld");
  EXPECT_EQ(*target->size("step_1/shards/a.bin", metadata_deadline()), 10u);
  EXPECT_TRUE(*target->exists("step_1/shards/a.bin", metadata_deadline()));
  EXPECT_FALSE(*target->is_directory("step_1/shards/a.bin", metadata_deadline()));
  EXPECT_TRUE(*target->is_directory("step_1", metadata_deadline()));
  EXPECT_FALSE(*target->exists("step_2", metadata_deadline()));
  EXPECT_FALSE(*target->is_directory("step_2", metadata_deadline()));
}

// The contract every target keeps, shown on a local directory, on memory and on a bucket of the
// real S3 server ctest starts (tests/s3/rgw.sh): what the checkpoint engine relies on, whatever
// the storage. One difference is allowed: an object store has no empty directories (a directory
// exists while something is in it), so creating one is not enough to list it or to block a
// publish, and files need no parent made first.
class StoreContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "local") {
      target = make_local_store(dir.path());
      root = dir.path();
    } else if (GetParam() == "memory") {
      target = testing::fresh_memory_store("contract");
      root = target->describe();
    } else {
      auto bucket = testing::make_test_bucket();
      if (!bucket) GTEST_SKIP() << testing::kNoS3Server;
      root = "s3://" + bucket->name + "/contract";
      auto made = open_store(root);
      ASSERT_TRUE(made.is_ok()) << made.status().to_string();
      target = *made;
      empty_directories = false;
    }
  }
  TempDir dir;
  std::shared_ptr<Store> target;
  std::string root;  // what errors name
  bool empty_directories = true;
};

INSTANTIATE_TEST_SUITE_P(Targets, StoreContract, ::testing::Values("local", "memory", "s3"),
                         [](const auto& info) { return info.param; });

TEST_P(StoreContract, CreateTruncatesAnExistingFile) {
  write_through(*target, "pointer", "a long first version");
  write_through(*target, "pointer", "short");
  EXPECT_EQ(*target->read("pointer", metadata_deadline()), "short");
}

TEST_P(StoreContract, RenameReplacesAFile) {
  write_through(*target, "latest.tmp", "step_2");
  write_through(*target, "latest", "step_1");
  ASSERT_TRUE(target->publish("latest.tmp", "latest", metadata_deadline()).is_ok());
  EXPECT_EQ(*target->read("latest", metadata_deadline()), "step_2");
  EXPECT_FALSE(*target->exists("latest.tmp", metadata_deadline()));
}

TEST_P(StoreContract, PublishesADirectoryButNeverOntoAnExistingOne) {
  write_through(*target, "step_1.tmp/a.bin", "new");
  ASSERT_TRUE(target->publish("step_1.tmp", "step_1", metadata_deadline()).is_ok());
  EXPECT_EQ(*target->read("step_1/a.bin", metadata_deadline()), "new");
  EXPECT_FALSE(*target->exists("step_1.tmp", metadata_deadline()));

  // rename(2) would replace an empty directory silently; publishing must refuse, empty or not.
  if (empty_directories) {
    ASSERT_TRUE(target->make_directory("step_2", metadata_deadline()).is_ok());
    write_through(*target, "step_2.tmp/a.bin", "again");
    Status st = target->publish("step_2.tmp", "step_2", metadata_deadline());
    EXPECT_EQ(st.code(), ErrorCode::kAlreadyExists) << st.to_string();
    EXPECT_TRUE(contains(st.message(), root + "/step_2")) << st.message();
    EXPECT_TRUE(*target->exists("step_2.tmp/a.bin", metadata_deadline()))
        << "the source stays in place";
  }

  write_through(*target, "step_3.tmp/a.bin", "third");
  Status st = target->publish("step_3.tmp", "step_1", metadata_deadline());
  EXPECT_TRUE(contains(st.message(), root + "/step_1")) << st.message();
  EXPECT_TRUE(*target->exists("step_3.tmp/a.bin", metadata_deadline()))
      << "the source stays in place";
  EXPECT_EQ(st.code(), ErrorCode::kAlreadyExists) << st.to_string();
  EXPECT_EQ(*target->read("step_1/a.bin", metadata_deadline()), "new");
}

TEST_P(StoreContract, ListsSortedNames) {
  for (const char* name : {"step_10", "step_2", "latest", "step_1"}) {
    ASSERT_TRUE(target->make_directory(name, metadata_deadline()).is_ok());
  }
  write_through(*target, "step_2/b", "");
  write_through(*target, "step_2/a", "");
  EXPECT_EQ(*target->list("step_2", metadata_deadline()), (std::vector<std::string>{"a", "b"}));
  if (!empty_directories) {
    EXPECT_EQ(*target->list("", metadata_deadline()), std::vector<std::string>{"step_2"});
    EXPECT_EQ(target->list("step_1", metadata_deadline()).status().code(), ErrorCode::kNotFound);
    return;
  }
  EXPECT_EQ(*target->list("", metadata_deadline()),
            (std::vector<std::string>{"latest", "step_1", "step_10", "step_2"}));
  EXPECT_TRUE(target->list("step_1", metadata_deadline())->empty());
}

TEST_P(StoreContract, MissingPathsAreNotFoundAndNamed) {
  const std::string missing = root + "/nope/x";

  auto listed = target->list("nope/x", metadata_deadline());
  EXPECT_EQ(listed.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contains(listed.status().message(), missing)) << listed.status().message();

  auto read = target->read("nope/x", metadata_deadline());
  EXPECT_EQ(read.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contains(read.status().message(), missing)) << read.status().message();

  auto size = target->size("nope/x", metadata_deadline());
  EXPECT_EQ(size.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contains(size.status().message(), missing)) << size.status().message();

  Status renamed = target->publish("nope/x", "y", metadata_deadline());
  EXPECT_EQ(renamed.code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contains(renamed.message(), missing)) << renamed.message();

  if (!empty_directories) return;  // an object store has no parents to miss
  auto created = target->create("nope/x", metadata_deadline());
  EXPECT_EQ(created.status().code(), ErrorCode::kNotFound) << "parents are not created";
  EXPECT_TRUE(contains(created.status().message(), missing)) << created.status().message();

  Status synced = target->sync_directory("nope/x", metadata_deadline());
  EXPECT_EQ(synced.code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contains(synced.message(), missing)) << synced.message();
}

TEST_P(StoreContract, RemovesFilesAndTreesAndMissingOnesAreFine) {
  write_through(*target, "step_1/shards/a.bin", "a");
  write_through(*target, "step_1/manifest.json", "{}");
  write_through(*target, "latest", "step_1");

  ASSERT_TRUE(target->remove("latest", metadata_deadline()).is_ok());
  EXPECT_FALSE(*target->exists("latest", metadata_deadline()));
  EXPECT_TRUE(target->remove("latest", metadata_deadline()).is_ok());

  ASSERT_TRUE(target->remove_all("step_1", metadata_deadline()).is_ok());
  EXPECT_FALSE(*target->exists("step_1", metadata_deadline()));
  EXPECT_TRUE(target->remove_all("step_1", metadata_deadline()).is_ok());
  EXPECT_TRUE(*target->is_directory("", metadata_deadline())) << "the root stays";
}

TEST_P(StoreContract, ReadsRangesWithDeadlinesAndNamesTheFile) {
  write_through(*target, "step_1/a.bin", "0123456789");
  EXPECT_EQ(target->describe(), root);
  for (IoBackend backend : {IoBackend::kPread, IoBackend::kIoUring, IoBackend::kDirect}) {
    SCOPED_TRACE(io_backend_name(backend));
    auto source = target->open("step_1/a.bin", backend, metadata_deadline());
    ASSERT_TRUE(source.is_ok()) << source.status().to_string();
    EXPECT_EQ((*source)->name(), root + "/step_1/a.bin");
    EXPECT_EQ((*source)->size(), 10u);
    std::string got(4, '\0');
    ASSERT_TRUE((*source)
                    ->read_at(3, std::as_writable_bytes(std::span(got)),
                              Deadline::after(std::chrono::seconds(10)))
                    .is_ok());
    EXPECT_EQ(got, "3456");
    Status past = (*source)->read_at(8, std::as_writable_bytes(std::span(got)));
    EXPECT_EQ(past.code(), ErrorCode::kCorrupt) << past.to_string();
    EXPECT_TRUE(contains(past.message(), root + "/step_1/a.bin")) << past.message();
  }
  auto missing = target->open("step_1/b.bin", IoBackend::kPread, metadata_deadline());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contains(missing.status().message(), root + "/step_1/b.bin"))
      << missing.status().message();
  EXPECT_EQ(target->open("../x", IoBackend::kPread, metadata_deadline()).status().code(),
            ErrorCode::kInvalidArgument);
}

// Bytes no two positions of which repeat within a buffer: a piece written at a wrong offset, or
// a tail padded into the data, shows.
std::string pattern_bytes(size_t n) {
  std::string s(n, '\0');
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s[i] = static_cast<char>(x);
  }
  return s;
}

// create_streamed, as a checkpoint writes its tensor files: front to back in pieces that do not
// fall on the write buffer's bounds (8 MiB), a sync() in the middle (the tail written, then
// written again once more bytes follow it), sync() and close() at the end.
TEST_P(StoreContract, AStreamedFileReadsBackByteForByte) {
  const std::string bytes = pattern_bytes((8u << 20) * 2 + 123457);
  ASSERT_TRUE(target->make_directory("step_1", metadata_deadline()).is_ok());
  auto file = target->create_streamed("step_1/t.safetensors", metadata_deadline());
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  const size_t piece = (3u << 20) + 7;
  for (size_t off = 0; off < bytes.size(); off += piece) {
    const std::string_view part = std::string_view(bytes).substr(off, piece);
    ASSERT_TRUE((*file)->write_at(off, as_bytes(part), write_deadline()).is_ok());
    if (off == piece) ASSERT_TRUE((*file)->sync(write_deadline()).is_ok());
  }
  ASSERT_TRUE((*file)->sync(write_deadline()).is_ok());
  ASSERT_TRUE((*file)->close(write_deadline()).is_ok());
  EXPECT_EQ(*target->size("step_1/t.safetensors", metadata_deadline()), bytes.size());
  EXPECT_TRUE(*target->read("step_1/t.safetensors", metadata_deadline()) == bytes)
      << "the streamed file differs from what was written";

  // Small and empty files too (a rank manifest's size; a tensor file of empty tensors).
  for (const std::string& small : {std::string("x"), std::string()}) {
    auto f = target->create_streamed("step_1/small", metadata_deadline());
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    if (!small.empty()) ASSERT_TRUE((*f)->write_at(0, as_bytes(small), write_deadline()).is_ok());
    ASSERT_TRUE((*f)->close(write_deadline()).is_ok()) << "close() writes what sync() has not";
    EXPECT_EQ(*target->read("step_1/small", metadata_deadline()), small);
  }
}

// Whether files in `dir` open with O_DIRECT (tmpfs before Linux 6.6 refuses it).
bool takes_direct_io(const TempDir& dir) {
  const int probe = ::open((dir / "probe").c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (probe < 0) return false;
  ::close(probe);
  return true;
}

// A local streamed file goes to the disk with O_DIRECT: none of it but its tail is left in the
// page cache (the CPU a buffered write spends copying into fresh pages, and the training data it
// would evict). It is written front to back, and says so to a caller that does otherwise.
TEST(LocalDirectoryTarget, AStreamedFileBypassesThePageCacheAndIsWrittenInOrder) {
  TempDir dir;
  if (!takes_direct_io(dir)) {
    GTEST_SKIP() << "the file system of " << dir.path() << " refuses O_DIRECT";
  }
  auto target = make_local_store(dir.path());
  const std::string bytes = pattern_bytes((8u << 20) + 5000);
  auto file = target->create_streamed("t.safetensors", metadata_deadline());
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  ASSERT_TRUE((*file)->write_at(0, as_bytes(bytes), write_deadline()).is_ok());
  const Status out_of_order = (*file)->write_at(3, as_bytes("x"), write_deadline());
  EXPECT_EQ(out_of_order.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(out_of_order.message(), (dir / "t.safetensors")) &&
              contains(out_of_order.message(), "front to back"))
      << out_of_order.message();
  ASSERT_TRUE((*file)->sync(write_deadline()).is_ok());
  ASSERT_TRUE((*file)->close(write_deadline()).is_ok());
  auto resident = file_residency(dir / "t.safetensors");
  ASSERT_TRUE(resident.is_ok()) << resident.status().to_string();
  EXPECT_EQ(resident->bytes, bytes.size());
  // The tail past the last full 8 MiB buffer (5,000 bytes) is written through the page cache.
  EXPECT_LE(resident->resident_bytes, 8192u) << "a streamed file's pages stayed in the page cache";
  EXPECT_TRUE(testing::read_file(dir / "t.safetensors") == bytes);

  // The same bytes written with create() stay in the page cache: what the test above tells
  // apart is real.
  write_through(*target, "buffered", bytes);
  auto buffered = file_residency(dir / "buffered");
  ASSERT_TRUE(buffered.is_ok()) << buffered.status().to_string();
  EXPECT_GT(buffered->resident_bytes, 0u);
}

// Large spans whose memory lines up with the file go to the disk from the caller's memory at
// once (a checkpoint's staging, laid out as its files: no copy into the write buffer); other
// bytes wait in the buffer. Seen in the file's size on the disk after each write_at().
TEST(LocalDirectoryTarget, AStreamedFileWritesAlignedLargeSpansAtOnceAndBuffersTheRest) {
  TempDir dir;
  if (!takes_direct_io(dir)) {
    GTEST_SKIP() << "the file system of " << dir.path() << " refuses O_DIRECT";
  }
  auto target = make_local_store(dir.path());
  const std::string bytes = pattern_bytes((4u << 20) + 5000 + (2u << 20) + 300);
  std::unique_ptr<char, decltype(&std::free)> memory(
      static_cast<char*>(std::aligned_alloc(4096, 8u << 20)), std::free);
  std::unique_ptr<char, decltype(&std::free)> misaligned(
      static_cast<char*>(std::aligned_alloc(4096, 4u << 20)), std::free);
  std::memcpy(memory.get(), bytes.data(), (4u << 20) + 5000);
  std::memcpy(misaligned.get() + 1, bytes.data() + (4u << 20) + 5000, (2u << 20) + 300);
  const auto span_of = [](const char* p, size_t n) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(p), n);
  };
  const auto on_disk = [&] { return fs::file_size(dir / "t.safetensors"); };

  auto file = target->create_streamed("t.safetensors", metadata_deadline());
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  // A small piece waits in the buffer.
  ASSERT_TRUE((*file)->write_at(0, span_of(memory.get(), 5000), write_deadline()).is_ok());
  EXPECT_EQ(on_disk(), 0u);
  // A large span after it: the buffer is topped up to the block (8,192 bytes) and written, then
  // the span's whole blocks from its own memory; its last 904 bytes wait in the buffer.
  ASSERT_TRUE(
      (*file)->write_at(5000, span_of(memory.get() + 5000, 4u << 20), write_deadline()).is_ok());
  EXPECT_EQ(on_disk(), 4198400u);  // (5,000 + 4 MiB) rounded down to 4,096
  // A large span whose memory does not line up: the buffer's block is written, the span waits in
  // the buffer (2 MiB, less than it holds).
  ASSERT_TRUE((*file)
                  ->write_at((4u << 20) + 5000, span_of(misaligned.get() + 1, (2u << 20) + 300),
                             write_deadline())
                  .is_ok());
  EXPECT_EQ(on_disk(), 4198400u + 4096u);
  ASSERT_TRUE((*file)->sync(write_deadline()).is_ok());
  ASSERT_TRUE((*file)->close(write_deadline()).is_ok());
  auto resident = file_residency(dir / "t.safetensors");
  ASSERT_TRUE(resident.is_ok()) << resident.status().to_string();
  EXPECT_LE(resident->resident_bytes, (2u << 20) + 8192u)
      << "only the buffered tail goes through the page cache";
  EXPECT_TRUE(testing::read_file(dir / "t.safetensors") == bytes)
      << "the streamed file differs from what was written";
}

TEST(LocalDirectoryTarget, RejectsPathsThatLeaveTheRoot) {
  TempDir dir;
  ASSERT_TRUE(fs::create_directory(dir / "root"));
  testing::write_file(dir / "outside", "keep me");
  auto target = make_local_store(dir / "root");

  for (const std::string bad : {"../outside", "/etc/passwd", "a/../../outside", "..", "a/.."}) {
    SCOPED_TRACE(bad);
    Status st = target->remove(bad, metadata_deadline());
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
    EXPECT_TRUE(contains(st.message(), bad)) << st.message();
    EXPECT_EQ(target->read(bad, metadata_deadline()).status().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(target->create(bad, metadata_deadline()).status().code(),
              ErrorCode::kInvalidArgument);
    EXPECT_EQ(target->remove_all(bad, metadata_deadline()).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(target->publish("x", bad, metadata_deadline()).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(target->open(bad, IoBackend::kPread, metadata_deadline()).status().code(),
              ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(testing::read_file(dir / "outside"), "keep me");
  // ".." only as a whole component: these are ordinary names.
  write_through(*target, "a..b", "x");
  write_through(*target, "..c", "y");
  EXPECT_EQ(*target->list("", metadata_deadline()), (std::vector<std::string>{"..c", "a..b"}));
  EXPECT_EQ(target->remove_all("", metadata_deadline()).code(), ErrorCode::kInvalidArgument)
      << "never the root";
}

TEST(LocalDirectoryTarget, RelativeRootBecomesAbsolute) {
  auto target = make_local_store("some/dir/");
  EXPECT_EQ(target->describe(), (fs::current_path() / "some/dir").string());
}

// The checkpoint engine's commit sequence, written through the wrapper; stops at the first error.
Status write_step(Store& target) {
  ZW_RETURN_IF_ERROR(target.make_directory("step_1.tmp", metadata_deadline()));
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                      target.create("step_1.tmp/a.bin", metadata_deadline()));
  ZW_RETURN_IF_ERROR(file->write_at(0, as_bytes("data"), write_deadline()));
  file->start_writeback(0, 4, write_deadline());
  ZW_RETURN_IF_ERROR(file->sync(write_deadline()));
  ZW_RETURN_IF_ERROR(file->close(write_deadline()));
  ZW_RETURN_IF_ERROR(target.sync_directory("step_1.tmp", metadata_deadline()));
  ZW_RETURN_IF_ERROR(target.publish("step_1.tmp", "step_1", metadata_deadline()));
  return target.sync_directory("", metadata_deadline());
}

std::vector<std::string> recorded(const FaultStore& target) {
  std::vector<std::string> out;
  for (const StoreOperation& op : target.operations()) out.push_back(op.to_string());
  return out;
}

TEST(FaultStore, RecordsMutatingOperationsInOrder) {
  TempDir dir;
  FaultStore target(make_local_store(dir.path()));
  ASSERT_TRUE(write_step(target).is_ok());
  // Reads go through but are not recorded.
  EXPECT_EQ(*target.read("step_1/a.bin", metadata_deadline()), "data");
  EXPECT_TRUE(*target.exists("step_1", metadata_deadline()));
  EXPECT_EQ(*target.list("", metadata_deadline()), std::vector<std::string>{"step_1"});
  ASSERT_TRUE(target.remove("step_1/a.bin", metadata_deadline()).is_ok());
  ASSERT_TRUE(target.remove_all("step_1", metadata_deadline()).is_ok());

  EXPECT_EQ(recorded(target), (std::vector<std::string>{
                                  "mkdir step_1.tmp",
                                  "create step_1.tmp/a.bin",
                                  "write step_1.tmp/a.bin",
                                  "writeback step_1.tmp/a.bin",
                                  "fsync step_1.tmp/a.bin",
                                  "close step_1.tmp/a.bin",
                                  "fsync-dir step_1.tmp",
                                  "publish step_1.tmp -> step_1",
                                  "fsync-dir ",
                                  "remove step_1/a.bin",
                                  "remove-all step_1",
                              }));
  target.clear_operations();
  EXPECT_TRUE(target.operations().empty());
  EXPECT_EQ(target.describe(), dir.path());
}

TEST(FaultStore, FailsTheChosenFileOperationWithoutDoingIt) {
  TempDir dir;
  FaultStore target(make_local_store(dir.path()));
  target.set_fault_rule([](const StoreOperation& op) { return op.kind == "write" ? ENOSPC : 0; });

  ASSERT_TRUE(target.make_directory("step_1.tmp", metadata_deadline()).is_ok());
  auto file = target.create("step_1.tmp/a.bin", metadata_deadline());
  ASSERT_TRUE(file.is_ok());
  Status st = (*file)->write_at(0, as_bytes("data"), write_deadline());
  EXPECT_EQ(st.code(), ErrorCode::kIo) << st.to_string();
  EXPECT_TRUE(contains(st.message(), std::strerror(ENOSPC))) << st.message();
  EXPECT_TRUE(contains(st.message(), "No space left on device")) << st.message();
  EXPECT_TRUE(contains(st.message(), dir / "step_1.tmp/a.bin")) << st.message();
  ASSERT_TRUE((*file)->close(write_deadline()).is_ok());
  EXPECT_EQ(*target.size("step_1.tmp/a.bin", metadata_deadline()), 0u)
      << "the write did not happen";

  EXPECT_EQ(recorded(target), (std::vector<std::string>{
                                  "mkdir step_1.tmp",
                                  "create step_1.tmp/a.bin",
                                  "FAILED write step_1.tmp/a.bin",
                                  "close step_1.tmp/a.bin",
                              }));
}

TEST(FaultStore, FailsEachStepOfTheCommitInTurn) {
  // Fail operation k of the sequence for every k: it is recorded as FAILED, the sequence stops
  // there (a writeback is only a hint, so a failed one does not stop it), and the step is
  // published only if the rename (operation 7) happened.
  constexpr size_t kWriteback = 3, kRename = 7, kOperations = 9;
  for (size_t k = 0; k < kOperations; ++k) {
    SCOPED_TRACE("failing operation " + std::to_string(k));
    TempDir dir;
    FaultStore target(make_local_store(dir.path()));
    size_t seen = 0;
    target.set_fault_rule([&](const StoreOperation&) { return seen++ == k ? EIO : 0; });
    Status st = write_step(target);
    EXPECT_EQ(st.is_ok(), k == kWriteback) << st.to_string();
    if (!st.is_ok()) {
      EXPECT_EQ(st.code(), ErrorCode::kIo);
      EXPECT_TRUE(contains(st.message(), std::strerror(EIO))) << st.message();
    }
    std::vector<StoreOperation> ops = target.operations();
    ASSERT_EQ(ops.size(), k == kWriteback ? kOperations : k + 1);
    EXPECT_EQ(ops[k].kind.rfind("FAILED ", 0), 0u) << ops[k].to_string();
    EXPECT_EQ(fs::exists(dir / "step_1"), k > kRename || k == kWriteback);
  }
}

TEST(FaultStore, AFailedPublishNamesBothPathsAndLeavesTheSource) {
  TempDir dir;
  FaultStore target(make_local_store(dir.path()));
  ASSERT_TRUE(target.make_directory("step_1.tmp", metadata_deadline()).is_ok());
  target.set_fault_rule([](const StoreOperation& op) { return op.kind == "publish" ? EIO : 0; });
  Status st = target.publish("step_1.tmp", "step_1", metadata_deadline());
  EXPECT_EQ(st.code(), ErrorCode::kIo);
  EXPECT_TRUE(contains(st.message(), std::strerror(EIO))) << st.message();
  EXPECT_TRUE(contains(st.message(), dir / "step_1.tmp")) << st.message();
  EXPECT_TRUE(contains(st.message(), "-> " + dir / "step_1")) << st.message();
  EXPECT_TRUE(fs::is_directory(dir / "step_1.tmp"));
  EXPECT_FALSE(fs::exists(dir / "step_1"));
  EXPECT_EQ(recorded(target),
            (std::vector<std::string>{"mkdir step_1.tmp", "FAILED publish step_1.tmp -> step_1"}));
}

}  // namespace
}  // namespace zerowait
