// WebDataset tars read in place: naming rule, index built from real GNU tar archives (ustar, gnu,
// pax), samples read back through ShardReader, the sidecar cache, and damaged archives.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <set>

#include "shard/tar/tar_stream.hpp"
#include "testing/testing.hpp"
#include "zerowait/shard/webdataset.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using Fields = std::vector<std::pair<std::string, std::string>>;
using Samples = std::vector<std::pair<std::string, Fields>>;

struct Entry {
  Entry(std::string n, std::string d = "", std::string link = "")
      : name(std::move(n)), data(std::move(d)), symlink(std::move(link)) {}
  std::string name;  // a trailing '/' makes a directory
  std::string data;
  std::string symlink;  // when set, a symbolic link to this target
};

// Creates `entries` under <dir>/src and archives them, in this order, with the system GNU tar.
void make_tar(const TempDir& dir, const std::string& tar, const std::vector<Entry>& entries,
              std::vector<std::string> options = {"--format=gnu"}) {
  std::vector<std::string> argv = {"/usr/bin/tar", "-cf",       dir / tar,
                                   "-C",           dir / "src", "--no-recursion"};
  fs::create_directories(dir / "src");
  argv.insert(argv.end(), options.begin(), options.end());
  for (const Entry& e : entries) {
    const std::string path = dir / ("src/" + e.name);
    if (e.name.back() == '/') {
      fs::create_directories(path);
    } else if (!e.symlink.empty()) {
      fs::create_directories(fs::path(path).parent_path());
      fs::create_symlink(e.symlink, path);
    } else {
      testing::write_file(path, e.data);
    }
    argv.push_back(e.name);
  }
  auto r = testing::run_command(argv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
}

Samples read_all(const ShardReader& reader) {
  Samples out;
  for (uint64_t i = 0; i < reader.size(); ++i) {
    auto sample = reader.read_sample(i);
    EXPECT_TRUE(sample.is_ok()) << sample.status().to_string();
    if (!sample.is_ok()) return out;
    Fields fields;
    for (const FieldView& f : sample->view.fields) {
      fields.emplace_back(
          f.name, testing::to_string(f.bytes));
    }
    out.emplace_back(sample->view.key, std::move(fields));
  }
  return out;
}

Samples open_and_read(const std::string& tar) {
  auto reader = open_tar_shard(tar);
  EXPECT_TRUE(reader.is_ok()) << reader.status().to_string();
  if (!reader.is_ok()) return {};
  EXPECT_EQ((*reader)->kind(), ShardKind::kTar);
  EXPECT_FALSE((*reader)->has_checksums());
  return read_all(**reader);
}

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s)); }

// An index built from damaged bytes must still describe bytes that exist: it survives the same
// validation as a sidecar load, and every sample reads back.
void expect_consistent(const std::string& tar, format::ShardIndex index) {
  auto reparsed = format::ShardIndex::parse(bytes_of(index.serialize()), 0, tar.size(), "mem");
  ASSERT_TRUE(reparsed.is_ok()) << reparsed.status().to_string();
  ShardReader reader(make_memory_source("mem", bytes_of(tar)), std::move(index),
                     format::kNoChecksums, ShardKind::kTar);
  EXPECT_EQ(read_all(reader).size(), reader.size());
}

Result<format::ShardIndex> index_bytes(const std::string& tar) {
  return build_tar_index(*make_memory_source("mem.tar", bytes_of(tar)));
}

TEST(WebDataset, SplitSampleName) {
  const std::vector<std::tuple<std::string, std::string, std::string>> good = {
      {"a/b/0001.seg.png", "a/b/0001", "seg.png"},
      {"0001.jpg", "0001", "jpg"},
      {"dir.v2/0001.jpg", "dir.v2/0001", "jpg"},
      {"./0001.cls", "./0001", "cls"},
      {"../up.jpg", "../up", "jpg"}};
  for (const auto& [path, key, field] : good) {
    std::string_view k, f;
    ASSERT_TRUE(split_sample_name(path, &k, &f)) << path;
    EXPECT_EQ(k, key);
    EXPECT_EQ(f, field);
  }
  for (const char* bad : {"noext", "dir.x/noext", ".hidden", "dir/.jpg", "0001.", "dir/", ""}) {
    std::string_view k, f;
    EXPECT_FALSE(split_sample_name(bad, &k, &f)) << bad;
  }
}

TEST(WebDataset, IsSafeRelativePath) {
  for (const char* ok : {"a", "a/b", "./a", "a.b/c", "..a/b..", "\xe6\x97\xa5/x"}) {
    EXPECT_TRUE(is_safe_relative_path(ok)) << ok;
  }
  for (std::string bad : {"", "/a", "../a", "a/../b", "a//b", "a/", "..", "a/..", "/"}) {
    EXPECT_FALSE(is_safe_relative_path(bad)) << bad;
  }
  EXPECT_FALSE(is_safe_relative_path(std::string("a\0b", 3)));
}

TEST(WebDataset, ReadsUstarGnuAndPaxArchives) {
  const std::string jpg = testing::make_jpeg(16, 16, 1);
  const std::string blob = testing::random_bytes(70000, 2);  // spans several index windows
  // The last: pax headers larger than the index builder's read after a large member.
  const std::vector<std::vector<std::string>> formats = {
      {"--format=ustar"},
      {"--format=gnu"},
      {"--format=pax"},
      {"--format=pax", "--pax-option=comment=" + std::string(6000, 'c')}};
  for (const std::vector<std::string>& format : formats) {
    TempDir dir;
    make_tar(dir, "x.tar",
             {{"0001.jpg", jpg},
              {"0001.cls", "3"},
              {"0001.meta.json", "{}"},
              {"d/"},
              {"d/0002.bin", blob},
              {"d/0002.txt", ""},
              {"README", "no dot: not a sample"},
              {"d/0003.jpg", jpg},
              {"d/link.jpg", "", "0003.jpg"}},
             format);
    const Samples expected = {{"0001", {{"jpg", jpg}, {"cls", "3"}, {"meta.json", "{}"}}},
                              {"d/0002", {{"bin", blob}, {"txt", ""}}},
                              {"d/0003", {{"jpg", jpg}}}};
    EXPECT_EQ(open_and_read(dir / "x.tar"), expected) << format.back().substr(0, 20);

    // Field offsets are absolute: they point at the member data inside the tar itself.
    const std::string tar = testing::read_file(dir / "x.tar");
    auto index = index_bytes(tar);
    ASSERT_TRUE(index.is_ok()) << index.status().to_string();
    const format::FieldEntry& bin = index->fields_of(1)[0];
    EXPECT_TRUE(tar.substr(bin.offset, bin.size) == blob);
    EXPECT_EQ(index->samples[1].offset, bin.offset);
    EXPECT_EQ(index->names[bin.name_id], "bin");
  }
}

TEST(WebDataset, LongAndUnicodeNames) {
  const std::string d100 = std::string(60, 'a') + "/" + std::string(60, 'b');  // > 100
  const std::string d255 = d100 + "/" + std::string(120, 'c') + "/" + std::string(30, 'd');
  const std::string uni = "\xe6\x97\xa5\xe6\x9c\xac/\xc3\xbc\xc3\xb1\xc3\xaf.\xc3\xa7";
  for (const std::string format : {"gnu", "pax"}) {
    TempDir dir;
    make_tar(dir, "x.tar",
             {{d100 + "/0001.jpg", "one"},
              {d255 + "/0002.jpg", "two"},
              {d255 + "/" + std::string(150, 'k') + ".x" + std::string(90, 'y'), "long"},
              {uni, "u"}},
             {"--format=" + format});
    const Samples expected = {
        {d100 + "/0001", {{"jpg", "one"}}},
        {d255 + "/0002", {{"jpg", "two"}}},
        {d255 + "/" + std::string(150, 'k'), {{"x" + std::string(90, 'y'), "long"}}},
        {"\xe6\x97\xa5\xe6\x9c\xac/\xc3\xbc\xc3\xb1\xc3\xaf", {{"\xc3\xa7", "u"}}}};
    EXPECT_EQ(open_and_read(dir / "x.tar"), expected) << format;
  }
  TempDir dir;  // ustar stores up to 255 bytes split into prefix and name
  make_tar(dir, "x.tar", {{d100 + "/0001.jpg", "one"}}, {"--format=ustar"});
  EXPECT_EQ(open_and_read(dir / "x.tar"), (Samples{{d100 + "/0001", {{"jpg", "one"}}}}));
}

TEST(WebDataset, GroupingFollowsWebDataset) {
  TempDir dir;
  make_tar(dir, "x.tar",
           {{"a.jpg", "a1"}, {"a.cls", "1"}, {"b.jpg", "b"}, {"a.txt", "again"}, {"c.jpg", "c"}});
  // Appending c.jpg again makes a repeated field inside sample "c": the first copy wins.
  testing::write_file(dir / "src/c.jpg", "c-second");
  auto r = testing::run_command({"/usr/bin/tar", "-rf", dir / "x.tar", "-C", dir / "src", "c.jpg"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Samples expected = {{"a", {{"jpg", "a1"}, {"cls", "1"}}},
                            {"b", {{"jpg", "b"}}},
                            {"a", {{"txt", "again"}}},
                            {"c", {{"jpg", "c"}}}};
  EXPECT_EQ(open_and_read(dir / "x.tar"), expected);
}

TEST(WebDataset, UnsafeNamesAreReadableKeys) {
  TempDir dir;
  testing::write_file(dir / "abs.cls", "9");
  make_tar(dir, "x.tar", {{"../up.jpg", "up"}, {"ok.jpg", "ok"}},
           {"--format=gnu", "--absolute-names", dir / "abs.cls"});
  const Samples got = open_and_read(dir / "x.tar");
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].first, dir / "abs");
  EXPECT_EQ(got[1], (std::pair<std::string, Fields>{"../up", {{"jpg", "up"}}}));
  EXPECT_FALSE(is_safe_relative_path(got[0].first));
  EXPECT_FALSE(is_safe_relative_path(got[1].first));
  EXPECT_TRUE(is_safe_relative_path(got[2].first));
}

TEST(WebDataset, OpenPathGoesThroughTheTarIndex) {
  TempDir dir;
  make_tar(dir, "x.tar", {{"k.jpg", "jpg"}});
  auto reader = ShardReader::open_path(dir / "x.tar", IoBackend::kMmap);
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  EXPECT_EQ(read_all(**reader), (Samples{{"k", {{"jpg", "jpg"}}}}));
}

struct FileId {
  ino_t ino;
  timespec mtime;
  bool operator==(const FileId& o) const {
    return ino == o.ino && mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec;
  }
};
FileId file_id(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return {st.st_ino, st.st_mtim};
}

TEST(WebDataset, SidecarIsCreatedReusedAndRebuilt) {
  TempDir dir;
  const std::string tar = dir / "x.tar", sidecar = dir / "x.tar.zwidx";
  EXPECT_EQ(tar_index_sidecar_path(tar), sidecar);
  make_tar(dir, "x.tar", {{"a.jpg", "11"}, {"b.jpg", "22"}});
  EXPECT_EQ(open_and_read(tar).size(), 2u);
  ASSERT_TRUE(fs::exists(sidecar));
  EXPECT_EQ(testing::read_file(sidecar).substr(0, 7), "ZWTARIX");
  const FileId first = file_id(sidecar);

  EXPECT_EQ(open_and_read(tar).size(), 2u);
  EXPECT_TRUE(file_id(sidecar) == first) << "the sidecar was rewritten instead of reused";
  for (const auto& e : fs::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  }

  // Same size, new bytes, new mtime: the stale index must not be used.
  make_tar(dir, "x.tar", {{"a.jpg", "33"}, {"c.jpg", "44"}});
  const timespec times[2] = {{0, UTIME_OMIT}, {1'600'000'000, 123}};
  ASSERT_EQ(::utimensat(AT_FDCWD, tar.c_str(), times, 0), 0);
  EXPECT_EQ(open_and_read(tar), (Samples{{"a", {{"jpg", "33"}}}, {"c", {{"jpg", "44"}}}}));
  const FileId second = file_id(sidecar);
  EXPECT_FALSE(second == first);

  // A damaged sidecar is rebuilt, silently.
  std::string bytes = testing::read_file(sidecar);
  bytes[bytes.size() / 2] ^= 1;
  testing::write_file(sidecar, bytes);
  EXPECT_EQ(open_and_read(tar).size(), 2u);
  EXPECT_NE(testing::read_file(sidecar), bytes);
}

// The members of the archive at `path`, and where its end-of-archive blocks start.
std::vector<internal::TarMember> list_members(const std::string& path, uint64_t* end) {
  std::vector<internal::TarMember> members;
  auto stream = internal::TarStream::open(path);
  EXPECT_TRUE(stream.is_ok());
  internal::TarMember m;
  *end = 0;
  while (*(*stream)->next(&m)) {
    members.push_back(m);
    *end = (m.data_offset + m.size + 511) / 512 * 512;
  }
  return members;
}

TEST(WebDataset, EveryCorruptHeaderByteIsCleanError) {
  for (const std::string format : {"gnu", "pax"}) {
    TempDir dir;
    make_tar(
        dir, "x.tar",
        {{std::string(120, 'n') + ".jpg", "long"}, {"a.jpg", "x"}, {"a.cls", ""}, {"b.c", "y"}},
        {"--format=" + format});
    const std::string tar = testing::read_file(dir / "x.tar");
    uint64_t end = 0;
    std::set<uint64_t> headers;  // first (metadata) and member header blocks
    for (const auto& m : list_members(dir / "x.tar", &end)) {
      headers.insert({m.header_offset, m.data_offset - 512});
    }
    for (uint64_t at = 0; at < end + 1024; ++at) {
      for (int mode = 0; mode < 3; ++mode) {
        std::string bad = tar;
        bad[at] = mode == 0 ? static_cast<char>(bad[at] ^ 0xff) : mode == 1 ? '\0' : '\x80';
        if (mode > 0) {  // keep the checksum right, so the other fields get parsed
          const uint64_t block = at / 512 * 512;
          std::fill(bad.begin() + block + 148, bad.begin() + block + 156, ' ');
          unsigned sum = 0;
          for (uint64_t i = block; i < block + 512; ++i) sum += static_cast<unsigned char>(bad[i]);
          std::snprintf(bad.data() + block + 148, 8, "%06o", sum);
        }
        auto index = index_bytes(bad);
        // Byte 155 follows the checksum's NUL terminator: unread, as in GNU tar.
        if (mode == 0 && headers.count(at / 512 * 512) && at % 512 != 155) {
          EXPECT_FALSE(index.is_ok()) << "byte " << at << " of a header flipped unnoticed";
        }
        if (index.is_ok()) {
          expect_consistent(bad, std::move(*index));
        } else {
          EXPECT_EQ(index.status().code(), ErrorCode::kCorrupt) << index.status().to_string();
          EXPECT_NE(index.status().message().find("tar 'mem.tar' at offset "), std::string::npos);
        }
      }
    }
  }
}

TEST(WebDataset, TruncatedArchivesAreCorrupt) {
  TempDir dir;
  make_tar(dir, "x.tar",
           {{std::string(130, 'z') + ".jpg", "long"},
            {"a.jpg", std::string(1500, 'a')},
            {"a.cls", "1"},
            {"b.jpg", "b"}});
  const std::string tar = testing::read_file(dir / "x.tar");
  uint64_t end = 0;
  std::vector<uint64_t> starts;
  for (const auto& m : list_members(dir / "x.tar", &end)) starts.push_back(m.header_offset);
  auto full = index_bytes(tar);
  ASSERT_TRUE(full.is_ok());
  std::vector<uint64_t> cuts;
  for (uint64_t c = 0; c <= tar.size(); c += 512) cuts.push_back(c);
  for (uint64_t c : {1, 100, 511, 513, 700, 1100, 2000, 2600, 3000}) cuts.push_back(c);
  for (uint64_t cut : cuts) {
    auto index = index_bytes(tar.substr(0, cut));
    const bool clean = cut == end || cut >= end + 512 ||
                       std::find(starts.begin(), starts.end(), cut) != starts.end();
    if (!clean) {
      EXPECT_EQ(index.status().code(), ErrorCode::kCorrupt) << "cut at " << cut;
      continue;
    }
    ASSERT_TRUE(index.is_ok()) << "cut at " << cut << ": " << index.status().to_string();
    // A cut between members leaves a prefix of the samples (the last may miss fields).
    ASSERT_LE(index->sample_count(), full->sample_count());
    for (uint64_t i = 0; i < index->sample_count(); ++i) {
      EXPECT_EQ(index->key(i), full->key(i));
      EXPECT_EQ(index->samples[i].offset, full->samples[i].offset);
    }
  }
  testing::write_file(dir / "cut.tar", tar.substr(0, starts[1] + 512 + 1000));
  auto reader = open_tar_shard(dir / "cut.tar");
  ASSERT_FALSE(reader.is_ok());
  EXPECT_EQ(reader.status().message(),
            "tar '" + dir / "cut.tar" + "' at offset " + std::to_string(starts[1]) +
                ": member data truncated: needs 1500 bytes, archive ends at " +
                std::to_string(starts[1] + 1512));
  EXPECT_FALSE(fs::exists(dir / "cut.tar.zwidx"));
}

}  // namespace
}  // namespace zerowait
