// `zerowait bench files`: listing a tree, reading every file whole, evicting files from the page
// cache, and the comparison with the dataset packed from the tree, through the library and the
// command.
#include <gtest/gtest.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <filesystem>
#include <linux/magic.h>
#include <nlohmann/json.hpp>

#include "testing/testing.hpp"
#include "zerowait/diagnose/files_bench.hpp"
#include "zerowait/diagnose/cold_cache.hpp"
#include "zerowait/host/page_cache.hpp"
#include "zerowait/shard/pack.hpp"
#include "zerowait/shard/synthetic.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using testing::run_cli;
using testing::TempDir;
using testing::write_file;

uint64_t total_size(const std::vector<std::string>& paths) {
  uint64_t bytes = 0;
  for (const std::string& p : paths) bytes += fs::file_size(p);
  return bytes;
}

TEST(ListFiles, FindsRegularFilesRecursivelySorted) {
  TempDir dir;
  write_file(dir / "b/2.jpg", "22");
  write_file(dir / "a/1.jpg", "1");
  write_file(dir / "a/deeper/3.jpg", "333");
  fs::create_directories(dir / "empty");
  fs::create_symlink(dir / "a/1.jpg", dir / "link.jpg");  // not followed, not counted
  Result<ListedFiles> listed = list_files(dir.path());
  ASSERT_TRUE(listed.is_ok()) << listed.status().to_string();
  const std::vector<std::string> expected = {dir / "a/1.jpg", dir / "a/deeper/3.jpg",
                                             dir / "b/2.jpg"};
  EXPECT_EQ(listed->paths, expected);
  EXPECT_GE(listed->seconds, 0);
}

TEST(ListFiles, MissingDirectoryIsNotFound) {
  TempDir dir;
  const Status s = list_files(dir / "missing").status();
  EXPECT_EQ(s.code(), ErrorCode::kNotFound) << s.to_string();
  EXPECT_NE(s.message().find(dir / "missing"), std::string::npos) << s.message();
}

TEST(ReadFiles, ReadsEveryByteOnAnyThreadCount) {
  TempDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < 40; ++i) {
    paths.push_back(dir / ("f" + std::to_string(i)));
    write_file(paths.back(), testing::random_bytes(size_t(i) * 997, uint64_t(i)));
  }
  for (unsigned threads : {1u, 3u}) {
    Result<ReadPass> pass = read_files(paths, threads);
    ASSERT_TRUE(pass.is_ok()) << pass.status().to_string();
    EXPECT_EQ(pass->items, paths.size());
    EXPECT_EQ(pass->bytes, total_size(paths)) << threads << " threads";
    EXPECT_GT(pass->seconds, 0);
  }
}

TEST(ReadFiles, AMissingFileIsNamed) {
  TempDir dir;
  write_file(dir / "here", "x");
  const Status s = read_files({dir / "here", dir / "gone"}, 2).status();
  EXPECT_EQ(s.code(), ErrorCode::kNotFound) << s.to_string();
  EXPECT_NE(s.message().find(dir / "gone"), std::string::npos) << s.message();
  EXPECT_EQ(read_files({dir / "here"}, 0).status().code(), ErrorCode::kInvalidArgument);
}

TEST(EvictFromPageCache, DropsTheFilesPages) {
  TempDir dir;
  struct statfs info {};
  ASSERT_EQ(::statfs(dir.path().c_str(), &info), 0);
  if (info.f_type == TMPFS_MAGIC) GTEST_SKIP() << "tmpfs pages are the file: nothing to evict";
  const std::string path = dir / "data";
  write_file(path, testing::random_bytes(1 << 20, 3));
  ASSERT_TRUE(read_files({path}, 1).is_ok());  // now cached
  ASSERT_TRUE(evict_from_page_cache({path}).is_ok());
  Result<FileResidency> after = file_residency(path);
  ASSERT_TRUE(after.is_ok()) << after.status().to_string();
  EXPECT_EQ(after->resident_bytes, 0u);
}

// A small ImageFolder tree of real JPEGs and the dataset packed from it.
class PackedTree : public ::testing::Test {
 protected:
  static constexpr uint64_t kFiles = 60;

  void SetUp() override {
    SyntheticImageFolderOptions generate;
    generate.out_dir = tree_;
    generate.files = kFiles;
    generate.classes = 3;
    generate.min_bytes = 2000;
    generate.max_bytes = 6000;
    generate.threads = 1;
    ASSERT_TRUE(generate_imagefolder(generate).is_ok());
    PackOptions pack_options;
    pack_options.sources = {tree_};
    pack_options.out_dir = shards_;
    pack_options.imagefolder = true;
    pack_options.sync = false;
    pack_options.threads = 1;
    pack_options.shard_size = 64 << 10;  // several shards
    Result<PackReport> packed = pack(pack_options);
    ASSERT_TRUE(packed.is_ok()) << packed.status().to_string();
    ASSERT_EQ(packed->samples, kFiles);
    tree_bytes_ = total_size(list_files(tree_)->paths);
  }

  TempDir dir_;
  std::string tree_ = dir_ / "tree";
  std::string shards_ = dir_ / "shards";
  uint64_t tree_bytes_ = 0;
};

TEST_F(PackedTree, ComparesEveryFileWithEverySample) {
  FilesBenchOptions options;
  options.dir = tree_;
  options.dataset = shards_;
  options.threads = 2;
  Result<FilesBenchReport> report = run_files_bench(options);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->files_listed, kFiles);
  EXPECT_EQ(report->files_read, kFiles);
  for (const ReadPass* pass : {&report->cold, &report->warm}) {
    EXPECT_EQ(pass->items, kFiles);
    EXPECT_EQ(pass->bytes, tree_bytes_);
    EXPECT_GT(pass->items_per_s(), 0);
  }
  ASSERT_TRUE(report->packed.has_value());
  const PackedFilesBench& packed = *report->packed;
  EXPECT_EQ(packed.dataset_samples, kFiles);
  // Read the way zerowait.Loader does by default: io "auto", named.
  EXPECT_EQ(packed.io, io_uring_available() ? "io_uring" : "pread");
  for (const ReadPass* pass : {&packed.cold, &packed.warm}) {
    EXPECT_EQ(pass->items, kFiles);
    // Known by construction: every JPEG's bytes, and each sample's class number as text ("0" to
    // "2": one byte).
    EXPECT_EQ(pass->bytes, tree_bytes_ + kFiles * 1);
    EXPECT_GT(pass->items_per_s(), 0);
  }
  EXPECT_DOUBLE_EQ(packed.speedup_cold, packed.cold.items_per_s() / report->cold.items_per_s());
  EXPECT_DOUBLE_EQ(packed.speedup_warm, packed.warm.items_per_s() / report->warm.items_per_s());
  // The warm pass found what the cold pass read in the page cache.
  EXPECT_GT(report->warm.resident_before, 0.5);
  EXPECT_GT(packed.warm.resident_before, 0.5);
}

TEST_F(PackedTree, EachSideIsColdForEachOfItsColdPassesInEitherOrder) {
  struct statfs info {};
  ASSERT_EQ(::statfs(tree_.c_str(), &info), 0);
  if (info.f_type == TMPFS_MAGIC) GTEST_SKIP() << "tmpfs pages are the file: nothing to evict";
  FilesBenchOptions options;
  options.dir = tree_;
  options.dataset = shards_;
  options.threads = 2;
  options.repeats = 2;  // the second repeat follows both sides' warm passes: all cached
  options.packed_first = true;
  Result<FilesBenchReport> report = run_files_bench(options);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->repeats, 2u);
  ASSERT_TRUE(report->packed.has_value());
  // The highest residency of a side's cold passes: each side evicted right before its own.
  EXPECT_LE(report->cold.resident_before, 0.01);
  EXPECT_LE(report->packed->cold.resident_before, 0.01);
  EXPECT_GT(report->warm.resident_before, 0.5);
  EXPECT_GT(report->packed->warm.resident_before, 0.5);
  for (const ReadPass* pass : {&report->cold, &report->warm}) EXPECT_EQ(pass->items, kFiles);
  for (const ReadPass* pass : {&report->packed->cold, &report->packed->warm}) {
    EXPECT_EQ(pass->items, kFiles);
  }
  options.repeats = 0;
  EXPECT_EQ(run_files_bench(options).status().code(), ErrorCode::kInvalidArgument);
}

TEST_F(PackedTree, WithoutIoUringThePackedSideReadsWithPreadAndSaysSo) {
  const testing::CommandResult r = run_cli(
      {"bench", "files", tree_, "--dataset", shards_, "--json"}, {"ZEROWAIT_DISABLE_IO_URING=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["packed"]["io"], "pread");
  EXPECT_EQ(out["packed"]["cold"]["items"], kFiles);
  const testing::CommandResult table = run_cli({"bench", "files", tree_, "--dataset", shards_});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  const std::string named =
      std::string("io \"auto\": ") + (io_uring_available() ? "io_uring" : "pread") + " here";
  EXPECT_NE(table.out.find(named), std::string::npos) << table.out;
}

TEST_F(PackedTree, MaxFilesReadsASubsetOnBothSides) {
  FilesBenchOptions options;
  options.dir = tree_;
  options.dataset = shards_;
  options.max_files = 25;
  options.threads = 1;
  Result<FilesBenchReport> report = run_files_bench(options);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->files_listed, kFiles);
  EXPECT_EQ(report->files_read, 25u);
  EXPECT_EQ(report->cold.items, 25u);
  EXPECT_LT(report->cold.bytes, tree_bytes_);
  ASSERT_TRUE(report->packed.has_value());
  EXPECT_GE(report->packed->cold.items, 25u) << "whole batches: at least the files' count";
  EXPECT_GE(report->packed->warm.items, 25u);
}

TEST_F(PackedTree, DifferentSampleCountIsNoted) {
  write_file(tree_ + "/class_000/extra.jpg", testing::make_jpeg(8, 8, 1));
  FilesBenchOptions options;
  options.dir = tree_;
  options.dataset = shards_;
  Result<FilesBenchReport> report = run_files_bench(options);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->files_read, kFiles + 1);
  // The dataset has one sample fewer than the files read: its epoch ends first.
  EXPECT_EQ(report->packed->cold.items, kFiles);
  ASSERT_FALSE(report->notes.empty());
  EXPECT_NE(report->notes[0].find("per-sample"), std::string::npos) << report->notes[0];
}

TEST_F(PackedTree, CommandPrintsJson) {
  const testing::CommandResult r =
      run_cli({"bench", "files", tree_, "--dataset", shards_, "--threads", "2", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  EXPECT_EQ(out["files_listed"], kFiles);
  EXPECT_EQ(out["files_read"], kFiles);
  EXPECT_EQ(out["threads"], 2);
  EXPECT_EQ(out["files"]["cold"]["items"], kFiles);
  EXPECT_EQ(out["files"]["warm"]["bytes"], tree_bytes_);
  EXPECT_EQ(out["packed"]["samples"], kFiles);
  EXPECT_EQ(out["packed"]["cold"]["items"], kFiles);
  EXPECT_GT(out["packed"]["speedup_cold"].get<double>(), 0);
  EXPECT_GT(out["packed"]["speedup_warm"].get<double>(), 0);
  EXPECT_TRUE(r.err.empty()) << "no progress lines with --json: " << r.err;
}

TEST_F(PackedTree, CommandPrintsATable) {
  const testing::CommandResult r = run_cli({"bench", "files", tree_, "--dataset", shards_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("listed 60 files"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("speed-up"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cold"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("files: cold pass"), std::string::npos) << r.err;
}

TEST(BenchFilesCli, WithoutADatasetThePackedSideIsNull) {
  TempDir dir;
  write_file(dir / "a/1.bin", "hello");
  write_file(dir / "b/2.bin", "world!");
  const testing::CommandResult r = run_cli({"bench", "files", dir.path(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json out = nlohmann::json::parse(r.out);
  EXPECT_TRUE(out["packed"].is_null());
  EXPECT_EQ(out["files"]["cold"]["bytes"], 11);
  EXPECT_EQ(out["files"]["warm"]["items"], 2);
}

TEST(BenchFilesCli, AnUnprivilegedUserGetsColdReadsAndIsToldHow) {
  TempDir dir;
  write_file(dir / "a/1.bin", std::string(8192, 'x'));
  write_file(dir / "b/2.bin", std::string(4096, 'y'));
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir.path())) {
    fs::permissions(e.path(), e.is_directory() ? fs::perms(0755) : fs::perms(0644));
  }
  fs::permissions(dir.path(), fs::perms(0755));
  // Really unprivileged: the same wrapper runs `id -u`.
  const testing::CommandResult id =
      testing::run_command(testing::unprivileged({"/usr/bin/id", "-u"}));
  ASSERT_EQ(id.exit_code, 0) << id.err;
  ASSERT_NE(id.out, "0\n") << "the bench must run without root here";

  const testing::CommandResult json =
      testing::run_cli_unprivileged({"bench", "files", dir.path(), "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json out = nlohmann::json::parse(json.out);
  EXPECT_EQ(out["files"]["cold"]["items"], 2);
  const nlohmann::json& cold = out["cold_cache"];
  EXPECT_EQ(cold["method"], kColdByFadvise.method);
  EXPECT_EQ(cold["method"], "posix_fadvise(POSIX_FADV_DONTNEED)");
  EXPECT_EQ(cold["needs_root"], false);
  EXPECT_NE(cold["stays_warm"].get<std::string>().find("dentry and inode caches"),
            std::string::npos)
      << cold;
  // The files are root's when the tests run as root: mincore() does not answer nobody about
  // them, and the bench says "unknown" instead of passing on the kernel's "all resident".
  const nlohmann::json& resident = out["files"]["cold"]["resident_before"];
  if (::geteuid() == 0) {
    EXPECT_TRUE(resident.is_null()) << resident;
  } else {
    EXPECT_GE(resident.get<double>(), 0.0);
    EXPECT_LE(resident.get<double>(), 1.0);
  }

  const testing::CommandResult text = testing::run_cli_unprivileged({"bench", "files", dir.path()});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("cold cache: posix_fadvise(POSIX_FADV_DONTNEED), no root needed"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("not evicted: the kernel's dentry and inode caches"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("in the page cache when the cold pass began: "), std::string::npos)
      << text.out;
  if (::geteuid() == 0) {
    EXPECT_NE(text.out.find("unknown: not measurable as this user: mincore()"), std::string::npos)
        << text.out;
  }
}

TEST(BenchFilesCli, AnEmptyTreeIsAnError) {
  TempDir dir;
  const testing::CommandResult r = run_cli({"bench", "files", dir.path()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no files under"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace zerowait
