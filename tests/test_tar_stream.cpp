// The tar header parser and the streaming reader (plain and gzip), on archives built byte by byte
// for the cases GNU tar never writes, and by the system tar and gzip for the real thing.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "shard/tar/tar_header.hpp"
#include "shard/tar/tar_stream.hpp"
#include "testing/testing.hpp"

namespace zerowait::internal {
namespace {

using testing::TempDir;

enum class Magic { kUstar, kGnu, kV7 };

void set_checksum(std::string& block) {
  std::fill(block.begin() + 148, block.begin() + 156, ' ');
  unsigned sum = 0;
  for (unsigned char c : block) sum += c;
  std::snprintf(block.data() + 148, 8, "%06o", sum);
}

std::string header_block(std::string_view name, uint64_t size, char type = '0',
                         Magic magic = Magic::kUstar, std::string_view prefix = "") {
  std::string b(512, '\0');
  b.replace(0, std::min<size_t>(name.size(), 100), name.substr(0, 100));
  std::snprintf(b.data() + 100, 8, "%07o", 0644);
  std::snprintf(b.data() + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  b[156] = type;
  if (magic == Magic::kUstar)
    b.replace(257, 8,
              std::string("ustar\0"
                          "00",
                          8));
  if (magic == Magic::kGnu) b.replace(257, 8, std::string("ustar  \0", 8));
  b.replace(345, std::min<size_t>(prefix.size(), 155), prefix.substr(0, 155));
  set_checksum(b);
  return b;
}

std::string padded(std::string data) {
  data.resize((data.size() + 511) / 512 * 512, '\0');
  return data;
}

// Archives built block by block.
struct TarBuilder {
  std::string bytes;
  TarBuilder& raw(const std::string& s) {
    bytes += s;
    return *this;
  }
  TarBuilder& file(std::string_view name, const std::string& data, char type = '0') {
    return raw(header_block(name, data.size(), type)).raw(padded(data));
  }
  TarBuilder& gnu_long_name(const std::string& name) {
    return raw(header_block("././@LongLink", name.size() + 1, 'L', Magic::kGnu))
        .raw(padded(name + '\0'));
  }
  TarBuilder& pax(char type, const std::map<std::string, std::string>& records) {
    std::string data;
    for (const auto& [key, value] : records) {
      const std::string body = " " + key + "=" + value + "\n";
      size_t len = body.size() + 1;
      while (std::to_string(len).size() + body.size() != len) ++len;
      data += std::to_string(len) + body;
    }
    return raw(header_block("PaxHeaders/x", data.size(), type)).raw(padded(data));
  }
  TarBuilder& end() { return raw(std::string(1024, '\0')); }
};

Result<bool> parse(const std::string& block, TarHeader* h) {
  return parse_tar_header(
      std::span<const std::byte, 512>(reinterpret_cast<const std::byte*>(block.data()), 512), h);
}

struct Read {
  TarMember member;
  std::string data;
};

// Streams the archive at `path`; stops at the first error and returns it in `status`.
std::vector<Read> stream_all(const std::string& path, Status* status, bool read = true) {
  std::vector<Read> out;
  auto stream = TarStream::open(path);
  if (!stream.is_ok()) {
    *status = stream.status();
    return out;
  }
  *status = Status::ok();
  for (;;) {
    TarMember m;
    auto more = (*stream)->next(&m);
    if (!more.is_ok()) *status = more.status();
    if (!more.is_ok() || !*more) return out;
    internal::ByteBuffer data;
    if (read) *status = (*stream)->read_data(&data);
    if (!status->is_ok()) return out;
    out.push_back({m, testing::to_string(data)});
  }
}

TEST(TarHeader, ZeroBlockEndsTheArchive) {
  TarHeader h;
  auto r = parse(std::string(512, '\0'), &h);
  ASSERT_TRUE(r.is_ok());
  EXPECT_FALSE(*r);
}

TEST(TarHeader, UstarPrefixIsJoinedAndGnuAreaIsNot) {
  TarHeader h;
  ASSERT_TRUE(*parse(header_block("file.jpg", 5, '0', Magic::kUstar, "some/dir"), &h));
  EXPECT_EQ(h.name, "some/dir/file.jpg");
  EXPECT_EQ(h.size, 5u);
  ASSERT_TRUE(*parse(header_block("file.jpg", 5, '0', Magic::kGnu, "garbage"), &h));
  EXPECT_EQ(h.name, "file.jpg");
  ASSERT_TRUE(*parse(header_block("old.txt", 7, '\0', Magic::kV7, "garbage"), &h));
  EXPECT_EQ(h.name, "old.txt");
  EXPECT_EQ(h.type, '\0');
}

TEST(TarHeader, AcceptsSignedChecksumAndRejectsBadOnes) {
  std::string b = header_block("caf\xc3\xa9.jpg", 1);
  int sum = 0;
  std::fill(b.begin() + 148, b.begin() + 156, ' ');
  for (char c : b) sum += static_cast<signed char>(c);
  std::snprintf(b.data() + 148, 8, "%06o", sum);
  TarHeader h;
  ASSERT_TRUE(parse(b, &h).is_ok()) << parse(b, &h).status().to_string();
  EXPECT_EQ(h.name, "caf\xc3\xa9.jpg");

  b[0] = 'x';
  auto r = parse(b, &h);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(r.status().message().find("bad header checksum"), std::string::npos);
}

TEST(TarHeader, NumericFields) {
  TarHeader h;
  std::string b = header_block("big.bin", 0);
  // GNU base-256: 0x80 then the value big-endian (5 GiB does not fit 11 octal digits).
  std::string field(12, '\0');
  field[0] = '\x80';
  const uint64_t five_gib = 5ull << 30;
  for (int i = 0; i < 8; ++i) field[11 - i] = static_cast<char>((five_gib >> (8 * i)) & 0xff);
  b.replace(124, 12, field);
  set_checksum(b);
  ASSERT_TRUE(*parse(b, &h));
  EXPECT_EQ(h.size, five_gib);

  b[124] = '\xff';  // negative
  set_checksum(b);
  EXPECT_EQ(parse(b, &h).status().code(), ErrorCode::kCorrupt);

  b.replace(124, 12, std::string("   17 \0\0\0\0\0\0", 12));  // spaces around, NUL padded
  set_checksum(b);
  ASSERT_TRUE(*parse(b, &h));
  EXPECT_EQ(h.size, 15u);

  b.replace(124, 12, std::string("0000000009\0\0", 12));
  set_checksum(b);
  auto r = parse(b, &h);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("size field"), std::string::npos);
}

TEST(PaxRecords, PathSizeAndErrors) {
  PaxOverrides pax;
  ASSERT_TRUE(
      parse_pax_records("30 mtime=1700000000.123456789\n14 path=a/b.c\n10 size=7\n", &pax).is_ok());
  EXPECT_EQ(pax.path, "a/b.c");
  EXPECT_EQ(pax.size, 7u);
  ASSERT_TRUE(parse_pax_records("8 path=\n", &pax).is_ok());
  EXPECT_FALSE(pax.path.has_value());
  ASSERT_TRUE(parse_pax_records(std::string("11 path=xy\n\0\0\0", 14), &pax).is_ok());
  EXPECT_EQ(pax.path, "xy");
  for (const char* bad : {"x path=a\n", "99 path=a\n", "3 path=a\n", "11 path=xyz", "9 pathx\n",
                          "12 size=1x1\n", "1", "0 \n"}) {
    Status st = parse_pax_records(bad, &pax);
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << bad;
    EXPECT_NE(st.message().find("bad pax record at byte"), std::string::npos) << st.message();
  }
}

TEST(TarStream, ReadsEveryKindOfHeader) {
  TempDir dir;
  const std::string long_gnu = std::string(150, 'g') + "/" + std::string(150, 'h') + ".jpg";
  const std::string long_pax = std::string(200, 'p') + "/\xe6\x97\xa5\xe6\x9c\xac.txt";
  const std::string big = testing::random_bytes(3 << 20, 7);  // larger than the read buffer
  TarBuilder t;
  t.pax('g', {{"comment", "ignored"}})
      .file("a.txt", "hello")
      .raw(header_block("dir/", 0, '5'))
      .raw(header_block("link.txt", 100, '2'))  // a link's size field carries no data
      .gnu_long_name(long_gnu)
      .file("ignored-short-name", "gnu")
      .pax('x', {{"path", long_pax}, {"size", "4"}})
      .raw(header_block("short", 0))
      .raw(padded("paxd"))
      .raw(header_block("b.jpg", 0, '0', Magic::kUstar, "pre/fix"))
      .file("big.bin", big)
      .end();
  testing::write_file(dir / "x.tar", t.bytes);
  ASSERT_EQ(std::system(("gzip -c " + dir / "x.tar" + " > " + dir / "gz.tar").c_str()), 0);

  for (const std::string name : {"x.tar", "gz.tar"}) {
    Status st;
    std::vector<Read> got = stream_all(dir / name, &st);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(got.size(), 7u) << name;
    EXPECT_EQ(got[0].member.path, "a.txt");
    EXPECT_EQ(got[0].data, "hello");
    EXPECT_EQ(got[0].member.header_offset, 1024u);  // after the global pax header
    EXPECT_EQ(got[0].member.data_offset, 1536u);
    EXPECT_EQ(got[1].member.type, '5');
    EXPECT_FALSE(got[1].member.is_regular());
    EXPECT_EQ(got[2].member.size, 0u);
    EXPECT_EQ(got[3].member.path, long_gnu);
    EXPECT_EQ(got[3].data, "gnu");
    EXPECT_EQ(got[3].member.header_offset, got[2].member.data_offset);  // at its 'L' record
    EXPECT_EQ(got[4].member.path, long_pax);
    EXPECT_EQ(got[4].data, "paxd");
    EXPECT_EQ(got[5].member.path, "pre/fix/b.jpg");
    EXPECT_EQ(got[5].data, "");
    EXPECT_TRUE(got[6].data == big);
  }
}

TEST(TarStream, SkipsUnreadDataAndReadsDataOnce) {
  TempDir dir;
  testing::write_file(
      dir / "x.tar",
      TarBuilder().file("a.bin", std::string(5000, 'a')).file("b.bin", "b").end().bytes);
  Status st;
  std::vector<Read> got = stream_all(dir / "x.tar", &st, /*read=*/false);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].member.path, "b.bin");

  auto stream = TarStream::open(dir / "x.tar");
  ASSERT_TRUE(stream.is_ok());
  TarMember m;
  internal::ByteBuffer data;
  EXPECT_EQ((*stream)->read_data(&data).code(), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(*(*stream)->next(&m));
  ASSERT_TRUE((*stream)->read_data(&data).is_ok());
  EXPECT_EQ(data.size(), 5000u);
  EXPECT_EQ((*stream)->read_data(&data).code(), ErrorCode::kInvalidArgument);
}

TEST(TarStream, EndOfArchiveForms) {
  TempDir dir;
  const std::string one = TarBuilder().file("a.txt", "1").bytes;
  const std::vector<std::string> ends = {"", std::string(512, '\0'), std::string(1024, '\0'),
                                         std::string(512, '\0') + "trailing garbage"};
  for (const std::string& end : ends) {
    testing::write_file(dir / "x.tar", one + end);
    Status st;
    EXPECT_EQ(stream_all(dir / "x.tar", &st).size(), 1u);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  testing::write_file(dir / "empty.tar", "");
  Status st;
  EXPECT_TRUE(stream_all(dir / "empty.tar", &st).empty());
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

TEST(TarStream, ErrorsNameArchiveAndOffset) {
  TempDir dir;
  struct Case {
    std::string bytes;
    std::string message;
  };
  const std::string a = TarBuilder().file("a.txt", std::string(700, 'a')).bytes;  // 1536 bytes
  std::string oversized = header_block("././@LongLink", 2 << 20, 'L', Magic::kGnu);
  const std::vector<Case> cases = {
      {a.substr(0, 1000),
       "at offset 0: member data truncated: needs 700 bytes, archive ends at 1000"},
      {a.substr(0, 1300), "at offset 0: archive ends at 1300 inside the padding"},
      {a + a.substr(0, 100), "at offset 1536: archive truncated inside a header (100 of 512"},
      {a + std::string(512, 'x'), "at offset 1536: bad header checksum"},
      {TarBuilder().gnu_long_name("n.txt").bytes, "at offset 0: archive ends after a metadata"},
      {TarBuilder().gnu_long_name("n.txt").end().bytes, "at offset 1024: end of archive after"},
      {oversized, "at offset 0: metadata record of 2097152 bytes"},
      {TarBuilder().pax('x', {{"size", "z"}}).bytes, "at offset 0: bad pax record at byte 0"},
  };
  for (const Case& c : cases) {
    testing::write_file(dir / "bad.tar", c.bytes);
    Status st;
    stream_all(dir / "bad.tar", &st);
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << c.message;
    EXPECT_NE(st.message().find("tar '" + dir / "bad.tar" + "' " + c.message), std::string::npos)
        << st.message();
  }
  Status st;
  stream_all(dir / "missing.tar", &st);
  EXPECT_EQ(st.code(), ErrorCode::kNotFound);
}

TEST(TarStream, GzipFromSystemTar) {
  TempDir dir;
  const std::string jpg = testing::make_jpeg(32, 16, 3);
  testing::write_file(dir / "src/0001.jpg", jpg);
  testing::write_file(dir / "src/0001.cls", "7");
  testing::write_file(dir / "src/0002.jpg", "");
  auto r = testing::run_command({"/usr/bin/tar", "-czf", dir / "d.tar.gz", "-C", dir / "src",
                                 "0001.jpg", "0001.cls", "0002.jpg"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Status st;
  std::vector<Read> got = stream_all(dir / "d.tar.gz", &st);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0].data == jpg);
  EXPECT_EQ(got[1].data, "7");
  EXPECT_EQ(got[2].member.path, "0002.jpg");
  EXPECT_EQ(got[2].data, "");
}

TEST(TarStream, DamagedGzipIsCorruptNeverACrash) {
  TempDir dir;
  TarBuilder t;
  for (int i = 0; i < 20; ++i) t.file(std::to_string(i) + ".bin", testing::random_bytes(900, i));
  testing::write_file(dir / "x.tar", t.end().bytes);
  ASSERT_EQ(std::system(("gzip -c " + dir / "x.tar" + " > " + dir / "x.tar.gz").c_str()), 0);
  const std::string gz = testing::read_file(dir / "x.tar.gz");
  // Every strict prefix ends the deflate stream or its CRC trailer early.
  for (size_t cut = 0; cut < gz.size(); cut += (cut < 64 ? 1 : 97)) {
    testing::write_file(dir / "cut.tar.gz", gz.substr(0, cut));
    Status st;
    stream_all(dir / "cut.tar.gz", &st);
    if (cut == 0) continue;  // an empty file is an empty archive
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << "cut at " << cut << ": " << st.to_string();
  }
  for (size_t at = 20; at < gz.size(); at += 301) {
    std::string bad = gz;
    bad[at] = static_cast<char>(bad[at] ^ 0x55);
    testing::write_file(dir / "bad.tar.gz", bad);
    Status st;
    stream_all(dir / "bad.tar.gz", &st);
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << "byte " << at << ": " << st.to_string();
  }
}

}  // namespace
}  // namespace zerowait::internal
