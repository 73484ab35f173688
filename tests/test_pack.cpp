// pack() end to end: grouping, ImageFolder, quarantine, determinism, shard rolling, tar inputs,
// and a pack killed part-way (fault injection in a real `zerowait pack` process).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "testing/testing.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/pack.hpp"

namespace zerowait {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

std::string str(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// key -> field -> bytes, for every sample of a dataset.
std::map<std::string, std::map<std::string, std::string>> read_all(const std::string& path) {
  std::map<std::string, std::map<std::string, std::string>> out;
  auto ds = Dataset::open(path);
  EXPECT_TRUE(ds.is_ok()) << ds.status().to_string();
  if (!ds.is_ok()) return out;
  for (uint64_t i = 0; i < (*ds)->size(); ++i) {
    auto s = (*ds)->read(i, {.verify = true});
    EXPECT_TRUE(s.is_ok()) << s.status().to_string();
    if (!s.is_ok()) continue;
    std::string key(s->view.key);
    EXPECT_EQ(out.count(key), 0u) << "sample " << key << " packed twice";
    for (const auto& f : s->view.fields) out[key][std::string(f.name)] = str(f.bytes);
  }
  return out;
}

std::map<std::string, std::string> shard_bytes(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    out[e.path().filename().string()] = testing::read_file(e.path().string());
  }
  return out;
}

TEST(Pack, GroupsFilesByBasename) {
  TempDir dir;
  testing::write_file(dir / "src/a/0001.jpg", testing::make_jpeg(16, 16, 1));
  testing::write_file(dir / "src/a/0001.json", "{\"x\":1}");
  testing::write_file(dir / "src/a/0002.jpg", testing::make_jpeg(16, 16, 2));
  testing::write_file(dir / "src/b/0001.seg.png.txt", "nested extension");
  testing::write_file(dir / "src/README", "no extension: not a sample file");
  PackOptions options{.sources = {dir / "src"}, .out_dir = dir / "out"};
  auto report = pack(options);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->samples, 3u);
  EXPECT_EQ(report->files, 4u);
  EXPECT_EQ(report->ignored, 1u);
  EXPECT_TRUE(report->quarantined.empty());
  auto all = read_all(dir / "out");
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all["a/0001"]["jpg"], testing::read_file(dir / "src/a/0001.jpg"));
  EXPECT_EQ(all["a/0001"]["json"], "{\"x\":1}");
  EXPECT_EQ(all["b/0001"]["seg.png.txt"], "nested extension");
  auto ds = *Dataset::open(dir / "out");
  EXPECT_EQ(ds->fields(), (std::vector<std::string>{"jpg", "json", "seg.png.txt"}));
}

TEST(Pack, ImageFolderWithCorruptFilesQuarantined) {
  TempDir dir;
  std::map<std::string, std::string> good;  // key -> bytes
  std::set<std::string> corrupt_paths;
  const std::vector<std::string> classes = {"cat", "dog", "zebra"};
  for (size_t c = 0; c < classes.size(); ++c) {
    for (int i = 0; i < 40; ++i) {
      const std::string key = classes[c] + "/img" + std::to_string(i);
      std::string jpeg = testing::make_jpeg(32 + i, 24, c * 100 + i);
      if (i % 7 == 3) {  // truncated at various points
        jpeg.resize(jpeg.size() * (i % 5 + 1) / 7);
        corrupt_paths.insert(dir / ("src/" + key + ".jpg"));
      } else {
        good[key] = jpeg;
      }
      testing::write_file(dir / ("src/" + key + ".jpg"), jpeg);
    }
  }
  testing::write_file(dir / "src/cat/notes.txt", "ignored: not an image extension");
  auto report = pack({.sources = {dir / "src"}, .out_dir = dir / "out", .imagefolder = true});
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->samples, good.size());
  std::set<std::string> quarantined;
  for (const auto& q : report->quarantined) {
    quarantined.insert(q.path);
    const bool says_truncated = q.reason.find("truncated") != std::string::npos ||
                                q.reason.find("end of file") != std::string::npos;
    EXPECT_TRUE(says_truncated) << q.path << ": " << q.reason;
  }
  EXPECT_EQ(quarantined, corrupt_paths);
  auto all = read_all(dir / "out");
  ASSERT_EQ(all.size(), good.size());
  for (const auto& [key, bytes] : good) {
    EXPECT_EQ(all[key]["jpg"], bytes) << key;
    const std::string cls = key.substr(0, key.find('/'));
    const auto idx = std::find(classes.begin(), classes.end(), cls) - classes.begin();
    EXPECT_EQ(all[key]["cls"], std::to_string(idx)) << key;
  }
  auto ds = *Dataset::open(dir / "out/manifest.json");
  EXPECT_EQ(ds->classes(), classes);
  const std::string q = testing::read_file(dir / "out/quarantine.json");
  EXPECT_NE(q.find("\"count\": " + std::to_string(corrupt_paths.size())), std::string::npos) << q;
}

TEST(Pack, DeterministicAcrossThreadCounts) {
  TempDir dir;
  for (int i = 0; i < 200; ++i) {
    testing::write_file(dir / ("src/d" + std::to_string(i % 7) + "/f" + std::to_string(i) + ".bin"),
                        testing::random_bytes(i * 37 % 5000, i));
  }
  PackOptions a{
      .sources = {dir / "src"}, .out_dir = dir / "a", .shard_size = 64 << 10, .threads = 1};
  PackOptions b = a;
  b.out_dir = dir / "b";
  b.threads = 4;
  ASSERT_TRUE(pack(a).is_ok());
  ASSERT_TRUE(pack(b).is_ok());
  auto sa = shard_bytes(dir / "a"), sb = shard_bytes(dir / "b");
  EXPECT_GT(sa.size(), 4u);  // several shards, a manifest and a quarantine file
  EXPECT_EQ(sa, sb);
}

TEST(Pack, RollsShardsAtTargetSize) {
  TempDir dir;
  for (int i = 0; i < 100; ++i) {
    testing::write_file(dir / ("src/s" + std::to_string(1000 + i) + ".bin"),
                        testing::random_bytes(10000, i));
  }
  auto report = pack({.sources = {dir / "src"}, .out_dir = dir / "out", .shard_size = 100000});
  ASSERT_TRUE(report.is_ok());
  EXPECT_GE(report->shards, 9u);
  auto ds = *Dataset::open(dir / "out");
  EXPECT_EQ(ds->shard_count(), report->shards);
  ASSERT_EQ(ds->size(), 100u);
  for (uint64_t i = 0; i < 100; ++i) {
    auto s = ds->read(i, {.verify = true});
    ASSERT_TRUE(s.is_ok());
    EXPECT_EQ(s->view.key, "s" + std::to_string(1000 + i));  // global order is key order
  }
  EXPECT_EQ(ds->locate(100).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Pack, AlignedSamples) {
  TempDir dir;
  for (int i = 0; i < 20; ++i) {
    testing::write_file(dir / ("src/x" + std::to_string(i) + ".bin"),
                        testing::random_bytes(i * 1000 + 1, i));
  }
  ASSERT_TRUE(pack({.sources = {dir / "src"}, .out_dir = dir / "out", .align = true}).is_ok());
  auto ds = *Dataset::open(dir / "out");
  EXPECT_TRUE(ds->manifest().aligned);
  auto shard = *ds->shard(0);
  for (const auto& e : shard->index().samples) EXPECT_EQ(e.offset % format::kAlignment, 0u);
  EXPECT_EQ(read_all(dir / "out").size(), 20u);
}

TEST(Pack, TarAndTarGzSources) {
  TempDir dir;
  testing::write_file(dir / "tree/000.jpg", testing::make_jpeg(8, 8, 1));
  testing::write_file(dir / "tree/000.cls", "3");
  testing::write_file(dir / "tree/001.jpg", testing::make_jpeg(8, 8, 2));
  testing::write_file(dir / "tree/001.cls", "4");
  ASSERT_EQ(testing::run_command({"/bin/tar", "-cf", dir / "a.tar", "-C", dir / "tree", "000.jpg",
                                  "000.cls", "001.jpg", "001.cls"})
                .exit_code,
            0);
  ASSERT_EQ(testing::run_command({"/bin/tar", "-czf", dir / "b.tgz", "-C", dir / "tree",
                                  "--transform", "s,^,other/,", "000.jpg", "000.cls"})
                .exit_code,
            0);
  auto report = pack({.sources = {dir / "a.tar", dir / "b.tgz"}, .out_dir = dir / "out"});
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->samples, 3u);
  auto all = read_all(dir / "out");
  EXPECT_EQ(all["000"]["jpg"], testing::read_file(dir / "tree/000.jpg"));
  EXPECT_EQ(all["001"]["cls"], "4");
  EXPECT_EQ(all["other/000"]["cls"], "3");
}

// Tar member names come from the data: one that escapes the output (`..`, absolute) must never
// become a key, and a key or field that repeats must not shadow what was packed first. Each is
// quarantined with its reason; everything else is packed.
TEST(Pack, UnsafeTarNamesAndDuplicateKeysAreQuarantined) {
  TempDir dir;
  testing::write_file(dir / "tree/ok/0001.txt", "first");
  testing::write_file(dir / "tree/ok/0001.cls", "1");
  testing::write_file(dir / "tree/x/evil.txt", "escaped");
  testing::write_file(dir / "tree/x/evil.cls", "2");
  testing::write_file(dir / "tree/ok2/0002.txt", "second");
  testing::write_file(dir / "again/ok/0001.txt", "a later copy");
  auto tar = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "/bin/tar");
    testing::CommandResult r = testing::run_command(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  };
  // -P keeps the names as the transform writes them: "../evil.txt", "/abs/evil.txt".
  tar({"-P", "-cf", dir / "dotdot.tar", "-C", dir / "tree", "--transform", "s,^x/,../,",
       "ok/0001.txt", "ok/0001.cls", "x/evil.txt", "x/evil.cls"});
  tar({"-P", "-cf", dir / "absolute.tar", "-C", dir / "tree", "--transform", "s,^x/,/abs/,",
       "x/evil.txt"});
  // The same member twice in one sample: a repeated field.
  tar({"-cf", dir / "repeat.tar", "-C", dir / "tree", "ok2/0002.txt"});
  tar({"-rf", dir / "repeat.tar", "-C", dir / "tree", "ok2/0002.txt"});

  auto report = pack(
      {.sources = {dir / "dotdot.tar", dir / "absolute.tar", dir / "again", dir / "repeat.tar"},
       .out_dir = dir / "out"});
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  std::map<std::string, std::string> reasons;  // path -> reason
  for (const auto& q : report->quarantined) reasons[q.path] = q.reason;
  const std::string unsafe = "unsafe member name (absolute or contains '..')";
  EXPECT_EQ(reasons,
            (std::map<std::string, std::string>{
                {dir / "dotdot.tar:../evil.txt", unsafe},
                {dir / "dotdot.tar:../evil.cls", unsafe},
                {dir / "absolute.tar:/abs/evil.txt", unsafe},
                {dir / "again/ok/0001.txt",
                 "duplicate sample key 'ok/0001' (already packed from an earlier file "
                 "or source)"},
                {dir / "repeat.tar:ok2/0002.txt", "duplicate field 'txt' in sample 'ok2/0002'"}}));
  // What was packed first stays; nothing quarantined was written.
  auto all = read_all(dir / "out");
  EXPECT_EQ(all,
            (std::map<std::string, std::map<std::string, std::string>>{
                {"ok/0001", {{"txt", "first"}, {"cls", "1"}}}, {"ok2/0002", {{"txt", "second"}}}}));
  const std::string q = testing::read_file(dir / "out/quarantine.json");
  EXPECT_NE(q.find("\"count\": 5"), std::string::npos) << q;
  EXPECT_NE(q.find("dotdot.tar:../evil.txt"), std::string::npos) << q;
}

TEST(Pack, RefusesExistingDatasetUnlessOverwrite) {
  TempDir dir;
  testing::write_file(dir / "src/a.txt", "a");
  ASSERT_TRUE(pack({.sources = {dir / "src"}, .out_dir = dir / "out"}).is_ok());
  auto again = pack({.sources = {dir / "src"}, .out_dir = dir / "out"});
  EXPECT_EQ(again.status().code(), ErrorCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("--overwrite"), std::string::npos);
  EXPECT_TRUE(pack({.sources = {dir / "src"}, .out_dir = dir / "out", .overwrite = true}).is_ok());
  EXPECT_EQ(pack({.sources = {dir / "nope"}, .out_dir = dir / "o2"}).status().code(),
            ErrorCode::kNotFound);
}

// A pack that dies part-way (the process exits abruptly after writing some bytes) leaves no
// manifest: nothing can open the partial output as a dataset. Re-running completes it.
TEST(Pack, InterruptedPackLeavesNoManifest) {
  TempDir dir;
  for (int i = 0; i < 300; ++i) {
    testing::write_file(dir / ("src/f" + std::to_string(i) + ".bin"),
                        testing::random_bytes(20000, i));
  }
  for (const char* crash_after : {"1", "100000", "3000000", "5900000"}) {
    for (bool existing : {false, true}) {
      const std::string out = dir / ("out-" + std::string(crash_after) + (existing ? "-e" : ""));
      if (existing) {
        ASSERT_EQ(
            testing::run_cli({"pack", dir / "src", "-o", out, "--shard-size", "1M"}).exit_code, 0);
      }
      auto r =
          testing::run_cli({"pack", dir / "src", "-o", out, "--shard-size", "1M", "--overwrite"},
                           {std::string("ZEROWAIT_FAULT_EXIT_AFTER_WRITE_BYTES=") + crash_after});
      ASSERT_EQ(r.exit_code, 86) << r.err;
      EXPECT_FALSE(fs::exists(out + "/manifest.json")) << out;
      auto ds = Dataset::open(out);
      EXPECT_FALSE(ds.is_ok() && (*ds)->size() > 0 && (*ds)->manifest().shards.size() > 0 &&
                   fs::exists(out + "/manifest.json"));
      auto redo =
          testing::run_cli({"pack", dir / "src", "-o", out, "--shard-size", "1M", "--overwrite"});
      ASSERT_EQ(redo.exit_code, 0) << redo.err;
      EXPECT_EQ(read_all(out).size(), 300u);
    }
  }
}

}  // namespace
}  // namespace zerowait
