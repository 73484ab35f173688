// pack() end to end: grouping, ImageFolder, quarantine, determinism, shard rolling, tar inputs,
// a pack killed part-way (fault injection in a real `zerowait pack` process), and packing in
// parts (`--part I/N`) joined by merge_parts().
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "testing/http_server.hpp"
#include "testing/testing.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/manifest.hpp"
#include "zerowait/shard/pack.hpp"

namespace zerowait {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

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
    for (const auto& f : s->view.fields) out[key][std::string(f.name)] = testing::to_string(f.bytes);
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

// A tree of two samples, a.tar holding both and b.tgz (gzip) holding the first under other/.
void write_tree_and_tars(const testing::TempDir& dir) {
  testing::write_file(dir / "tree/000.jpg", testing::make_jpeg(8, 8, 1));
  testing::write_file(dir / "tree/000.cls", "3");
  testing::write_file(dir / "tree/001.jpg", testing::make_jpeg(8, 8, 2));
  testing::write_file(dir / "tree/001.cls", "4");
  EXPECT_EQ(testing::run_command({"/bin/tar", "-cf", dir / "a.tar", "-C", dir / "tree", "000.jpg",
                                  "000.cls", "001.jpg", "001.cls"})
                .exit_code,
            0);
  EXPECT_EQ(testing::run_command({"/bin/tar", "-czf", dir / "b.tgz", "-C", dir / "tree",
                                  "--transform", "s,^,other/,", "000.jpg", "000.cls"})
                .exit_code,
            0);
}

TEST(Pack, TarAndTarGzSources) {
  TempDir dir;
  write_tree_and_tars(dir);
  auto report = pack({.sources = {dir / "a.tar", dir / "b.tgz"}, .out_dir = dir / "out"});
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->samples, 3u);
  auto all = read_all(dir / "out");
  EXPECT_EQ(all["000"]["jpg"], testing::read_file(dir / "tree/000.jpg"));
  EXPECT_EQ(all["001"]["cls"], "4");
  EXPECT_EQ(all["other/000"]["cls"], "3");
}

// The same archives served over HTTP pack to the same shards: pack reads a URL through the
// storage layer's registry, gzip included, as it reads a local file.
TEST(Pack, TarsAtAnHttpURLPackAsTheLocalFilesDo) {
  TempDir dir;
  write_tree_and_tars(dir);
  testing::TestHttpServer server;
  server.put("/tars/a.tar", testing::read_file(dir / "a.tar"));
  server.put("/tars/b.tgz", testing::read_file(dir / "b.tgz"));
  auto local = pack({.sources = {dir / "a.tar", dir / "b.tgz"}, .out_dir = dir / "local"});
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  auto remote = pack({.sources = {server.url("/tars/a.tar"), server.url("/tars/b.tgz")},
                      .out_dir = dir / "remote"});
  ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
  EXPECT_EQ(remote->samples, 3u);
  size_t shards = 0;
  for (const auto& entry : fs::directory_iterator(dir / "local")) {
    if (entry.path().extension() != ".zws") continue;
    ++shards;
    EXPECT_EQ(testing::read_file(entry.path()),
              testing::read_file(dir / ("remote/" + entry.path().filename().string())))
        << entry.path();
  }
  EXPECT_GT(shards, 0u);
  // A URL that names a tree rather than an archive is refused by name.
  auto tree = pack({.sources = {server.url("/tars/")}, .out_dir = dir / "none"});
  EXPECT_EQ(tree.status().code(), ErrorCode::kInvalidArgument) << tree.status().to_string();
  EXPECT_NE(tree.status().message().find(server.url("/tars/")), std::string::npos);
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

// A pack that dies part-way (the process exits abruptly at its output's N-th mutating operation:
// a FaultStore under the output, set up by $ZEROWAIT_FAULT_EXIT_AT_OPERATION) leaves no manifest:
// nothing can open the partial output as a dataset. Re-running completes it. Dying at the first
// operation, before the old manifest is removed, leaves an existing dataset as it was.
TEST(Pack, InterruptedPackLeavesNoManifest) {
  TempDir dir;
  for (int i = 0; i < 300; ++i) {
    testing::write_file(dir / ("src/f" + std::to_string(i) + ".bin"),
                        testing::random_bytes(20000, i));
  }
  for (const std::string crash_at : {"1", "3", "10", "20", "35"}) {
    for (bool existing : {false, true}) {
      const std::string out = dir / ("out-" + crash_at + (existing ? "-e" : ""));
      if (existing) {
        ASSERT_EQ(
            testing::run_cli({"pack", dir / "src", "-o", out, "--shard-size", "1M"}).exit_code, 0);
      }
      auto r =
          testing::run_cli({"pack", dir / "src", "-o", out, "--shard-size", "1M", "--overwrite"},
                           {"ZEROWAIT_FAULT_EXIT_AT_OPERATION=" + crash_at});
      ASSERT_EQ(r.exit_code, 86) << r.err;
      if (existing && crash_at == "1") {
        EXPECT_EQ(read_all(out).size(), 300u) << out;
        continue;
      }
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

// Every sample key of a dataset, in its global order.
std::vector<std::string> keys_of(const std::string& path) {
  std::vector<std::string> keys;
  auto ds = Dataset::open(path);
  EXPECT_TRUE(ds.is_ok()) << ds.status().to_string();
  if (!ds.is_ok()) return keys;
  for (size_t s = 0; s < (*ds)->shard_count(); ++s) {
    auto shard = (*ds)->shard(s);
    EXPECT_TRUE(shard.is_ok()) << shard.status().to_string();
    if (!shard.is_ok()) return keys;
    for (uint64_t i = 0; i < (*shard)->size(); ++i) keys.emplace_back((*shard)->key(i));
  }
  return keys;
}

// Samples of one to three fields with sizes from 0 to 6 KB in a few directories.
void write_sample_tree(const std::string& root, int samples, uint64_t seed) {
  for (int i = 0; i < samples; ++i) {
    const std::string key = root + "/d" + std::to_string(i % 3) + "/s" + std::to_string(i);
    testing::write_file(key + ".bin", testing::random_bytes((i * 997 + seed) % 6000, seed + i));
    if (i % 2 == 0) testing::write_file(key + ".json", "{\"i\":" + std::to_string(i) + "}");
    if (i % 5 == 0) testing::write_file(key + ".seg.txt", std::string(i * 40, 'x'));
  }
}

// Packs `options` in `count` parts into options.out_dir, one call per part as N machines would.
void pack_in_parts(PackOptions options, uint32_t count) {
  options.part_count = count;
  for (uint32_t i = 0; i < count; ++i) {
    options.part_index = i;
    auto report = pack(options);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    EXPECT_EQ(report->manifest_path,
              options.out_dir + "/" + pack_part_dir_name(i, count) + "/manifest.json");
  }
}

Status merge_in(const std::string& out, std::vector<std::string> parts = {},
                bool overwrite = false) {
  return merge_parts({.out_dir = out, .parts = std::move(parts), .overwrite = overwrite}).status();
}

void expect_error(const Status& status, ErrorCode code, const std::vector<std::string>& words) {
  EXPECT_EQ(status.code(), code) << status.to_string();
  for (const std::string& w : words) {
    EXPECT_NE(status.message().find(w), std::string::npos)
        << "'" << w << "' not in: " << status.to_string();
  }
}

TEST(PackParts, FourPartsMergeIntoTheSamplesOfOnePack) {
  TempDir dir;
  write_sample_tree(dir / "tree", 150, 1);
  for (const char* name : {"t0", "t1", "t2"}) {
    write_sample_tree(dir / ("tars/" + std::string(name)), 9, name[1]);
    ASSERT_EQ(testing::run_command(
                  {"/bin/tar", "-cf", dir / (std::string(name) + ".tar"), "-C", dir / "tars", name})
                  .exit_code,
              0);
  }
  const PackOptions whole{.sources = {dir / "tree", dir / "t0.tar", dir / "t1.tar", dir / "t2.tar"},
                          .out_dir = dir / "whole",
                          .shard_size = 32 << 10,
                          .sync = false};
  ASSERT_TRUE(pack(whole).is_ok());
  PackOptions parts = whole;
  parts.out_dir = dir / "parts";
  pack_in_parts(parts, 4);

  auto report = merge_parts({.out_dir = dir / "parts", .sync = false});
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->part_count, 4u);
  EXPECT_EQ(report->manifest_path, dir / "parts/manifest.json");
  // Same samples, same bytes, and even the same order: parts are contiguous ranges.
  EXPECT_EQ(read_all(dir / "parts"), read_all(dir / "whole"));
  EXPECT_EQ(keys_of(dir / "parts"), keys_of(dir / "whole"));
  EXPECT_EQ(report->samples, keys_of(dir / "whole").size());

  std::set<std::string> fingerprints;
  for (uint32_t i = 0; i < 4; ++i) {
    const std::string part_dir = pack_part_dir_name(i, 4);
    auto m = Manifest::load(dir / ("parts/" + part_dir + "/manifest.json"));
    ASSERT_TRUE(m.is_ok()) << m.status().to_string();
    ASSERT_TRUE(m->part.has_value());
    EXPECT_EQ(m->part->index, i);
    EXPECT_EQ(m->part->count, 4u);
    fingerprints.insert(m->part->input);
    EXPECT_GT(m->samples, 0u) << part_dir;  // bytes are spread over all four
    EXPECT_EQ(report->parts[i].dir, part_dir);
    EXPECT_EQ(report->parts[i].samples, m->samples);
  }
  EXPECT_EQ(fingerprints.size(), 1u);
  auto merged = *Manifest::load(dir / "parts/manifest.json");
  EXPECT_FALSE(merged.part.has_value());
  EXPECT_EQ(merged.fields, (*Dataset::open(dir / "whole"))->fields());
  EXPECT_EQ(merged.shards.front().path, "part-0000-of-0004/shard-000000.zws");
  EXPECT_EQ(merged.shards.back().path.substr(0, 18), "part-0003-of-0004/");
}

// Each part assigns class ids from the class list of the whole input: the last part below holds
// only "zebra" images, which must still be class 2, not class 0 of a one-class list.
TEST(PackParts, ImageFolderPartsUseTheClassListOfTheWholeInput) {
  TempDir dir;
  const std::vector<std::string> classes = {"cat", "dog", "zebra"};
  for (size_t c = 0; c < classes.size(); ++c) {
    for (int i = 0; i < 12; ++i) {
      testing::write_file(dir / ("src/" + classes[c] + "/img" + std::to_string(i) + ".jpg"),
                          testing::make_jpeg(24, 16 + i, c * 100 + i));
    }
  }
  PackOptions options{
      .sources = {dir / "src"}, .out_dir = dir / "whole", .imagefolder = true, .sync = false};
  ASSERT_TRUE(pack(options).is_ok());
  options.out_dir = dir / "parts";
  pack_in_parts(options, 4);
  ASSERT_TRUE(merge_in(dir / "parts").is_ok());

  auto last = read_all(dir / ("parts/" + pack_part_dir_name(3, 4)));
  ASSERT_FALSE(last.empty());
  for (const auto& [key, fields] : last) {
    EXPECT_EQ(key.substr(0, 6), "zebra/");
    EXPECT_EQ(fields.at("cls"), "2") << key;
  }
  EXPECT_EQ((*Dataset::open(dir / "parts"))->classes(), classes);
  EXPECT_EQ(read_all(dir / "parts"), read_all(dir / "whole"));
}

TEST(PackParts, PartZeroOfOneIsAPlainPack) {
  TempDir dir;
  write_sample_tree(dir / "src", 40, 2);
  ASSERT_TRUE(pack({.sources = {dir / "src"}, .out_dir = dir / "a"}).is_ok());
  ASSERT_TRUE(
      pack({.sources = {dir / "src"}, .out_dir = dir / "b", .part_index = 0, .part_count = 1})
          .is_ok());
  EXPECT_EQ(shard_bytes(dir / "a"), shard_bytes(dir / "b"));
  EXPECT_EQ(testing::read_file(dir / "a/manifest.json").find("\"part\""), std::string::npos);
}

TEST(PackParts, BadPartValuesAreClearErrors) {
  uint32_t index = 9, count = 9;
  ASSERT_TRUE(parse_pack_part("3/4", &index, &count).is_ok());
  EXPECT_EQ(index, 3u);
  EXPECT_EQ(count, 4u);
  for (const char* text : {"3/3", "0/0", "5/2"}) {
    expect_error(parse_pack_part(text, &index, &count), ErrorCode::kInvalidArgument,
                 {std::string("part ") + text + " does not exist", "0 <= I < N"});
  }
  for (const char* text : {"x", "", "1/", "/2", "-1/4", "1/2/3", " 1/2", "1/x", "1.0/2"}) {
    expect_error(parse_pack_part(text, &index, &count), ErrorCode::kInvalidArgument,
                 {"I/N", "'" + std::string(text) + "'"});
  }
  TempDir dir;
  testing::write_file(dir / "src/a.txt", "a");
  expect_error(
      pack({.sources = {dir / "src"}, .out_dir = dir / "out", .part_index = 3, .part_count = 3})
          .status(),
      ErrorCode::kInvalidArgument, {"part 3/3 does not exist"});
  EXPECT_FALSE(fs::exists(dir / "out"));
  for (const char* text : {"3/3", "0/0", "x"}) {
    auto r = testing::run_cli({"pack", dir / "src", "-o", dir / "out", "--part", text});
    EXPECT_EQ(r.exit_code, 2) << text << ": " << r.err;
    EXPECT_NE(r.err.find("--part"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
  }
}

TEST(PackParts, MergeRefusesMissingDuplicatedAndForeignParts) {
  TempDir dir;
  write_sample_tree(dir / "src", 60, 3);
  const PackOptions options{.sources = {dir / "src"}, .out_dir = dir / "out", .sync = false};
  pack_in_parts(options, 4);
  const auto part = [&](uint32_t i) { return dir / ("out/" + pack_part_dir_name(i, 4)); };

  expect_error(merge_in(dir / "out", {part(0), part(1), part(3)}), ErrorCode::kNotFound,
               {"1 of 4 parts missing (2)", "--part 2/4,", "part-0002-of-0004"});
  fs::copy(part(1), dir / "out/copy-of-1", fs::copy_options::recursive);
  expect_error(merge_in(dir / "out", {part(0), part(1), dir / "out/copy-of-1", part(2), part(3)}),
               ErrorCode::kInvalidArgument, {"part 1/4 is given twice", "copy-of-1/manifest.json"});
  fs::create_directories(dir / "elsewhere");
  fs::copy(part(2), dir / "elsewhere/p2", fs::copy_options::recursive);
  expect_error(merge_in(dir / "out", {part(0), part(1), dir / "elsewhere/p2", part(3)}),
               ErrorCode::kInvalidArgument, {"not inside the merge output", "-o"});
  ASSERT_TRUE(
      pack({.sources = {dir / "src"}, .out_dir = dir / "out/plain", .sync = false}).is_ok());
  expect_error(merge_in(dir / "out", {part(0), dir / "out/plain"}), ErrorCode::kInvalidArgument,
               {"out/plain/manifest.json", "not the manifest of a part", "--part I/N"});
  // A part whose pack has not finished: its directory has no manifest yet.
  fs::create_directories(dir / "out/part-0004-of-0008");
  expect_error(merge_in(dir / "out"), ErrorCode::kNotFound,
               {"part-0004-of-0008", "holds no manifest.json", "--overwrite"});
  fs::remove(dir / "out/part-0004-of-0008");
  ASSERT_TRUE(merge_in(dir / "out").is_ok());
  expect_error(merge_in(dir / "out"), ErrorCode::kAlreadyExists, {"manifest.json", "--overwrite"});
  EXPECT_TRUE(merge_in(dir / "out", {}, /*overwrite=*/true).is_ok());

  // Parts of another run: another part count, other options, an input that changed.
  PackOptions other = options;
  other.out_dir = dir / "mixed";
  pack_in_parts(other, 2);
  other.part_index = 1;
  other.part_count = 3;
  ASSERT_TRUE(pack(other).is_ok());
  expect_error(merge_in(dir / "mixed"), ErrorCode::kInvalidArgument,
               {"different part counts", "part 0/2", "part 1/3"});

  other.out_dir = dir / "aligned";
  pack_in_parts(other, 2);
  other.part_index = 1;
  other.part_count = 2;
  other.align = true;
  other.overwrite = true;
  ASSERT_TRUE(pack(other).is_ok());
  expect_error(merge_in(dir / "aligned"), ErrorCode::kInvalidArgument, {"--align", "part 1/2"});

  other.out_dir = dir / "changed";
  other.align = false;
  pack_in_parts(other, 2);
  testing::write_file(dir / "src/d0/s0.bin", "one file of the input changed in between");
  ASSERT_TRUE(pack(other).is_ok());
  expect_error(merge_in(dir / "changed"), ErrorCode::kInvalidArgument,
               {"another input listing or other options", "part 1/2", "part 0/2"});
}

TEST(PackParts, MergeRefusesPartsWithDifferentClassLists) {
  TempDir dir;
  for (const char* cls : {"ant", "bee", "cow"}) {
    testing::write_file(dir / ("three/" + std::string(cls) + "/x.jpg"),
                        testing::make_jpeg(8, 8, 1));
  }
  fs::copy(dir / "three", dir / "two", fs::copy_options::recursive);
  fs::remove_all(dir / "two/bee");
  PackOptions options{.sources = {dir / "three"},
                      .out_dir = dir / "out",
                      .imagefolder = true,
                      .sync = false,
                      .part_index = 0,
                      .part_count = 2};
  ASSERT_TRUE(pack(options).is_ok());
  options.sources = {dir / "two"};
  options.part_index = 1;
  ASSERT_TRUE(pack(options).is_ok());
  expect_error(merge_in(dir / "out"), ErrorCode::kInvalidArgument,
               {"class lists differ", "class 1 is 'bee'", "'cow'", "part 1/2"});
}

// A key that two sources hold is packed once: a later directory's copy is quarantined by the
// part that meets it, as one pack would; a copy inside tars of two parts (keys in a tar are
// not known before it is read) is refused by merge.
TEST(PackParts, DuplicateKeysAcrossParts) {
  TempDir dir;
  for (int i = 0; i < 20; ++i) {
    testing::write_file(dir / ("a/k" + std::to_string(i) + ".bin"), testing::random_bytes(900, i));
    testing::write_file(dir / ("b/k" + std::to_string(i + 15) + ".bin"),
                        testing::random_bytes(900, 100 + i));
  }
  PackOptions options{.sources = {dir / "a", dir / "b"}, .out_dir = dir / "whole", .sync = false};
  auto whole = pack(options);
  ASSERT_TRUE(whole.is_ok());
  ASSERT_EQ(whole->quarantined.size(), 5u);  // k15..k19 of b
  options.out_dir = dir / "parts";
  options.part_count = 2;
  std::vector<QuarantineEntry> quarantined;
  for (uint32_t i = 0; i < 2; ++i) {
    options.part_index = i;
    auto report = pack(options);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    quarantined.insert(quarantined.end(), report->quarantined.begin(), report->quarantined.end());
  }
  ASSERT_EQ(quarantined.size(), whole->quarantined.size());
  for (size_t i = 0; i < quarantined.size(); ++i) {
    EXPECT_EQ(quarantined[i].path, whole->quarantined[i].path);
    EXPECT_EQ(quarantined[i].reason, whole->quarantined[i].reason);
  }
  ASSERT_TRUE(merge_in(dir / "parts").is_ok());
  EXPECT_EQ(read_all(dir / "parts"), read_all(dir / "whole"));

  // Two tars of the same size, one per part, both holding "dup/0".
  for (const char* t : {"x", "y"}) {
    testing::write_file(dir / ("t" + std::string(t) + "/dup/0.txt"), std::string("copy ") + t);
    ASSERT_EQ(testing::run_command({"/bin/tar", "-cf", dir / (std::string(t) + ".tar"), "-C",
                                    dir / ("t" + std::string(t)), "dup"})
                  .exit_code,
              0);
  }
  pack_in_parts({.sources = {dir / "x.tar", dir / "y.tar"}, .out_dir = dir / "tars", .sync = false},
                2);
  expect_error(merge_in(dir / "tars"), ErrorCode::kInvalidArgument,
               {"sample key 'dup/0'", "part 0/2", "part 1/2", "pack those parts again"});
  EXPECT_FALSE(fs::exists(dir / "tars/manifest.json"));
}

// Packing a part again would change shards that a merged manifest lists: the merged manifest is
// refused, or removed first with overwrite, and merging again publishes the new part.
TEST(PackParts, RepackingAPartUnpublishesTheMergedManifest) {
  TempDir dir;
  write_sample_tree(dir / "src", 30, 4);
  PackOptions options{.sources = {dir / "src"}, .out_dir = dir / "out", .sync = false};
  pack_in_parts(options, 2);
  ASSERT_TRUE(merge_in(dir / "out").is_ok());
  options.part_index = 1;
  options.part_count = 2;
  options.shard_size = 4096;
  expect_error(pack(options).status(), ErrorCode::kAlreadyExists,
               {dir / "out/manifest.json", "--overwrite"});
  EXPECT_TRUE(fs::exists(dir / "out/manifest.json"));
  options.overwrite = true;
  ASSERT_TRUE(pack(options).is_ok());
  EXPECT_FALSE(fs::exists(dir / "out/manifest.json"));
  ASSERT_TRUE(merge_in(dir / "out").is_ok());
  EXPECT_EQ(read_all(dir / "out").size(), 30u);
  EXPECT_GT((*Dataset::open(dir / "out"))->shard_count(), 3u);
}

}  // namespace
}  // namespace zerowait
