// Shard format v1 through the public writer and reader: round trips, alignment, corruption of
// every footer and index byte, truncation.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <filesystem>
#include <map>
#include <random>

#include "common/endian.hpp"
#include "testing/testing.hpp"
#include "zerowait/storage/byte_source.hpp"
#include "zerowait/shard/reader.hpp"
#include "zerowait/shard/writer.hpp"

namespace zerowait {
namespace {

using testing::TempDir;

struct TestSample {
  std::string key;
  std::map<std::string, std::string> fields;
};

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

void write_shard(const std::string& path, const std::vector<TestSample>& samples,
                 ShardWriterOptions options = {}) {
  auto writer = ShardWriter::create(path, options);
  ASSERT_TRUE(writer.is_ok()) << writer.status().to_string();
  for (const auto& s : samples) {
    std::vector<FieldData> fields;
    for (const auto& [name, value] : s.fields) fields.push_back({name, bytes_of(value)});
    ASSERT_TRUE(writer->add_sample(s.key, fields).is_ok());
  }
  auto summary = writer->finish();
  ASSERT_TRUE(summary.is_ok()) << summary.status().to_string();
  EXPECT_EQ(summary->samples, samples.size());
  EXPECT_EQ(summary->file_bytes, std::filesystem::file_size(path));
}

void expect_same(const ShardReader& reader, const std::vector<TestSample>& samples) {
  ASSERT_EQ(reader.size(), samples.size());
  for (uint64_t i = 0; i < samples.size(); ++i) {
    auto sample = reader.read_sample(i, ReadOptions{.verify = true});
    ASSERT_TRUE(sample.is_ok()) << sample.status().to_string();
    EXPECT_EQ(sample->view.key, samples[i].key);
    ASSERT_EQ(sample->view.fields.size(), samples[i].fields.size());
    for (const auto& [name, value] : samples[i].fields) {
      const FieldView* f = sample->view.field(name);
      ASSERT_NE(f, nullptr) << name;
      EXPECT_EQ(testing::to_string(f->bytes), value) << samples[i].key << "." << name;
    }
  }
}

// Random samples with field sets drawn from several names and sizes from 0 B up to `max_size`.
std::vector<TestSample> random_samples(size_t count, size_t max_size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> names = {"jpg", "cls", "json", "seg.png", "txt", "npy"};
  std::vector<TestSample> out;
  for (size_t i = 0; i < count; ++i) {
    TestSample s;
    s.key = "dir" + std::to_string(i % 3) + "/sample" + std::to_string(i);
    const size_t nfields = rng() % 4;  // samples with no field are valid too
    for (size_t f = 0; f < nfields; ++f) {
      const std::string& name = names[rng() % names.size()];
      // Sizes spread over orders of magnitude: 0, tiny, KiB, up to max_size.
      size_t size = rng() % 5 == 0 ? 0 : rng() % (1u << (rng() % 20));
      size = std::min(size, max_size);
      s.fields[name] = testing::random_bytes(size, rng());
    }
    out.push_back(std::move(s));
  }
  return out;
}

TEST(Shard, RoundTripRandomSamples) {
  TempDir dir;
  for (bool align : {false, true}) {
    for (auto backend : {IoBackend::kPread, IoBackend::kMmap}) {
      const auto samples = random_samples(300, 1 << 20, align ? 7 : 11);
      const std::string path = dir / "s.zws";
      write_shard(path, samples, {.align_samples = align});
      auto reader = ShardReader::open_path(path, backend);
      ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
      EXPECT_EQ(((*reader)->flags() & format::kAligned) != 0, align);
      expect_same(**reader, samples);
      if (align) {
        for (const auto& e : (*reader)->index().samples) EXPECT_EQ(e.offset % 4096, 0u);
      }
      uint64_t bad = 0;
      auto verified = (*reader)->verify([&](const BadSample&) { ++bad; });
      ASSERT_TRUE(verified.is_ok());
      EXPECT_EQ(*verified, 0u);
    }
  }
}

TEST(Shard, LargeFieldsUpTo64MiB) {
  TempDir dir;
  std::vector<TestSample> samples;
  for (size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097},
                      size_t{5} << 20, size_t{64} << 20}) {
    samples.push_back({"k" + std::to_string(size), {{"bin", testing::random_bytes(size, size)}}});
  }
  write_shard(dir / "big.zws", samples);
  auto reader = ShardReader::open_path(dir / "big.zws");
  ASSERT_TRUE(reader.is_ok());
  expect_same(**reader, samples);
}

TEST(Shard, ReadSamplesContiguous) {
  TempDir dir;
  const auto samples = random_samples(50, 10000, 3);
  write_shard(dir / "c.zws", samples);
  auto reader = *ShardReader::open_path(dir / "c.zws");
  std::vector<std::byte> buffer(reader->span_bytes(10, 20));
  auto views = reader->read_samples(10, 20, buffer, {.verify = true});
  ASSERT_TRUE(views.is_ok()) << views.status().to_string();
  ASSERT_EQ(views->size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ((*views)[i].key, samples[10 + i].key);
    for (const auto& [name, value] : samples[10 + i].fields) {
      EXPECT_EQ(testing::to_string((*views)[i].field(name)->bytes), value);
    }
  }
  EXPECT_EQ(reader->read_samples(40, 11, buffer).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(reader->read_sample(50).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Shard, EmptyShard) {
  TempDir dir;
  write_shard(dir / "e.zws", {});
  auto reader = ShardReader::open_path(dir / "e.zws");
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  EXPECT_EQ((*reader)->size(), 0u);
}

TEST(Shard, WriterRejectsBadInput) {
  TempDir dir;
  auto writer = ShardWriter::create(dir / "w.zws");
  ASSERT_TRUE(writer.is_ok());
  std::string v = "x";
  std::vector<FieldData> dup = {{"a", bytes_of(v)}, {"a", bytes_of(v)}};
  EXPECT_EQ(writer->add_sample("k", dup).code(), ErrorCode::kInvalidArgument);
  std::vector<FieldData> slash = {{"a/b", bytes_of(v)}};
  EXPECT_EQ(writer->add_sample("k", slash).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(writer->add_sample("", {}).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ShardWriter::create(dir / "missing/dir/w.zws").status().code(), ErrorCode::kNotFound);
}

TEST(Shard, DeterministicBytes) {
  TempDir dir;
  const auto samples = random_samples(100, 5000, 5);
  write_shard(dir / "a.zws", samples);
  write_shard(dir / "b.zws", samples);
  EXPECT_EQ(testing::read_file(dir / "a.zws"), testing::read_file(dir / "b.zws"));
}

// Opens `bytes` as a shard and reads every sample with verification; returns the first error.
Status open_and_read_all(const std::string& bytes) {
  auto reader = ShardReader::open(make_memory_source("mutated.zws", bytes_of(bytes)));
  if (!reader.is_ok()) return reader.status();
  for (uint64_t i = 0; i < (*reader)->size(); ++i) {
    auto s = (*reader)->read_sample(i, {.verify = true});
    if (!s.is_ok()) return s.status();
  }
  return Status::ok();
}

TEST(Shard, EveryFooterAndIndexByteCorrupted) {
  TempDir dir;
  const auto samples = random_samples(20, 300, 9);
  write_shard(dir / "x.zws", samples);
  const std::string original = testing::read_file(dir / "x.zws");
  auto reader = *ShardReader::open_path(dir / "x.zws");
  const uint64_t index_offset =
      reader->index().samples.empty()
          ? 4096
          : reader->index().samples.back().offset + reader->index().samples.back().size;
  size_t errors = 0;
  for (size_t pos = index_offset; pos < original.size(); ++pos) {
    for (unsigned char flip : {0x01, 0x80, 0xff}) {
      std::string mutated = original;
      mutated[pos] = static_cast<char>(mutated[pos] ^ flip);
      Status st = open_and_read_all(mutated);
      // The index and footer are checksummed: every single-byte change must be caught.
      ASSERT_FALSE(st.is_ok()) << "byte " << pos << " flip " << int(flip) << " went unnoticed";
      EXPECT_TRUE(st.code() == ErrorCode::kCorrupt || st.code() == ErrorCode::kUnsupported)
          << st.to_string();
      EXPECT_NE(st.message().find("mutated.zws"), std::string::npos) << st.message();
      ++errors;
    }
  }
  EXPECT_GT(errors, 0u);
}

// --- Structure rules under valid checksums --------------------------------------------------
// Every corrupted byte above trips the index or footer checksum first. These tests break one
// structure rule of docs/format.md at a time and re-seal the index and footer with the format's
// own checksum and footer encoder, so the checksums pass and only the rule under test can reject
// the shard.

// A shard cut at its index: the bytes before it (header + data region), the index, the footer.
struct ShardParts {
  std::string before_index;
  std::string index;
  format::Footer footer;

  // The file with `index` at its place and a footer re-sealed around it (index size, offset and
  // checksum, footer checksum), exactly as the writer seals one.
  std::string seal() const {
    format::Footer f = footer;
    f.index_offset = before_index.size();
    f.index_size = index.size();
    f.index_checksum = format::checksum(bytes_of(index));
    return before_index + index + format::encode_footer(f);
  }
};

ShardParts split_shard(const std::string& file) {
  auto footer = format::decode_footer(bytes_of(file).last(format::kFooterSize), file.size(), "x");
  EXPECT_TRUE(footer.is_ok()) << footer.status().to_string();
  return {file.substr(0, footer->index_offset),
          file.substr(footer->index_offset, footer->index_size), *footer};
}

// Three samples of two fields each ("cls" then "txt"): keys a/one, a/two, b/three.
const std::vector<TestSample>& small_samples() {
  static const std::vector<TestSample> samples = {{"a/one", {{"cls", "0"}, {"txt", "hello"}}},
                                                  {"a/two", {{"cls", "1"}, {"txt", "world!!"}}},
                                                  {"b/three", {{"cls", "2"}, {"txt", "x"}}}};
  return samples;
}

// Byte positions of the index's entries, from the counts in its header.
struct IndexLayout {
  uint64_t samples = 0, fields = 0, names = 0;
  explicit IndexLayout(const std::string& index) {
    const auto* p = reinterpret_cast<const std::byte*>(index.data());
    samples = internal::get_u64(p + format::index_header_at::kSampleCount);
    fields = internal::get_u64(p + format::index_header_at::kFieldCount);
    names = internal::get_u32(p + format::index_header_at::kNameCount);
  }
  static uint64_t sample(uint64_t i, uint64_t at) {
    return format::kIndexHeaderSize + i * format::kSampleEntrySize + at;
  }
  uint64_t field(uint64_t i, uint64_t at) const {
    return format::kIndexHeaderSize + samples * format::kSampleEntrySize +
           i * format::kFieldEntrySize + at;
  }
  uint64_t name(uint64_t i, uint64_t at) const {
    return field(fields, 0) + i * format::kNameEntrySize + at;
  }
  uint64_t strings() const { return name(names, 0); }
};

uint64_t get64(const std::string& s, uint64_t at) {
  return internal::get_u64(reinterpret_cast<const std::byte*>(s.data()) + at);
}

class ShardStructure : public ::testing::Test {
 protected:
  void SetUp() override {
    write_shard(dir_ / "s.zws", small_samples());
    original_ = testing::read_file(dir_ / "s.zws");
    parts_ = split_shard(original_);
    reader_ = *ShardReader::open_path(dir_ / "s.zws");
  }

  // Opens the re-sealed shard and reads every sample: the first error, which must be kCorrupt and
  // name the shard and `expected`.
  void expect_rejected(const ShardParts& parts, const std::string& expected,
                       ErrorCode code = ErrorCode::kCorrupt) {
    Status st = open_and_read_all(parts.seal());
    ASSERT_FALSE(st.is_ok()) << "accepted; expected: " << expected;
    EXPECT_EQ(st.code(), code) << st.to_string();
    EXPECT_NE(st.message().find("shard 'mutated.zws'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(expected), std::string::npos)
        << "message: " << st.message() << "\nexpected to contain: " << expected;
    EXPECT_EQ(st.message().find("checksum"), std::string::npos) << st.message();
  }
  // The index with one 64-bit / 32-bit value replaced, re-sealed.
  ShardParts with_u64(uint64_t at, uint64_t value) const {
    ShardParts p = parts_;
    internal::set_u64(p.index, at, value);
    return p;
  }
  ShardParts with_u32(uint64_t at, uint32_t value) const {
    ShardParts p = parts_;
    internal::set_u32(p.index, at, value);
    return p;
  }
  const format::SampleEntry& sample(uint64_t i) const { return reader_->index().samples[i]; }
  const format::FieldEntry& field(uint64_t i) const { return reader_->index().fields[i]; }
  uint64_t strings_size() const {
    return get64(parts_.index, format::index_header_at::kStringsSize);
  }

  TempDir dir_;
  std::string original_;
  ShardParts parts_;
  std::shared_ptr<ShardReader> reader_;
};

namespace field_entry_at = format::field_entry_at;
namespace name_entry_at = format::name_entry_at;
namespace sample_entry_at = format::sample_entry_at;

TEST_F(ShardStructure, ResealingTheUnchangedIndexGivesTheWritersBytes) {
  // The re-sealing is the writer's own: any rejection below is the broken rule, not the seal.
  EXPECT_EQ(parts_.seal(), original_);
  EXPECT_TRUE(open_and_read_all(parts_.seal()).is_ok());
  const IndexLayout at(parts_.index);
  EXPECT_EQ(at.samples, 3u);
  EXPECT_EQ(at.fields, 6u);
  EXPECT_EQ(at.names, 2u);
  EXPECT_EQ(reader_->index().names, (std::vector<std::string>{"cls", "txt"}));
}

TEST_F(ShardStructure, IndexSizesMustAddUp) {
  const uint64_t strings = strings_size();
  const std::string sizes = std::to_string(parts_.index.size());
  expect_rejected(with_u64(format::index_header_at::kStringsSize, strings + 1),
                  "index counts (3 samples, 6 fields, 2 names, " + std::to_string(strings + 1) +
                      " string bytes) do not add up to the index size " + sizes);
  // A count so large that 48 * count overflows is caught before any multiplication.
  expect_rejected(with_u64(format::index_header_at::kSampleCount, uint64_t{1} << 61),
                  "index counts (2305843009213693952 samples, 6 fields");
  expect_rejected(with_u32(format::index_header_at::kNameCount, 3),
                  "index counts (3 samples, 6 fields, 3 names");
  // More field entries and a string size that wraps around 2^64 by as much: the sum still comes
  // to the index size, but the string table cannot be larger than the index (found by fuzzing).
  const uint64_t more = strings / format::kFieldEntrySize + 1;
  ShardParts wrapped = with_u64(format::index_header_at::kFieldCount, 6 + more);
  internal::set_u64(wrapped.index, format::index_header_at::kStringsSize,
                    strings - more * format::kFieldEntrySize);
  expect_rejected(wrapped, "index counts (3 samples, " + std::to_string(6 + more) + " fields");
  ShardParts bad_magic = parts_;
  bad_magic.index[0] = 'X';
  expect_rejected(bad_magic, "index does not start with its magic");
}

TEST_F(ShardStructure, SampleRangesMustLieInsideTheDataRegion) {
  // Into the header.
  expect_rejected(with_u64(IndexLayout::sample(0, sample_entry_at::kOffset), 4095),
                  "index entry of sample 0: byte range [4095, +6) lies outside the data region");
  // Past the data region's end (the index starts there).
  const uint64_t data_end = parts_.before_index.size();
  const uint64_t too_long = data_end - sample(2).offset + 1;
  expect_rejected(with_u64(IndexLayout::sample(2, sample_entry_at::kSize), too_long),
                  "index entry of sample 2: byte range [" + std::to_string(sample(2).offset) +
                      ", +" + std::to_string(too_long) + ") lies outside the data region");
  // offset + size wraps around 2^64.
  expect_rejected(with_u64(IndexLayout::sample(1, sample_entry_at::kSize), ~uint64_t{0}),
                  "index entry of sample 1: byte range [" + std::to_string(sample(1).offset) +
                      ", +18446744073709551615) lies outside the data region");
}

TEST_F(ShardStructure, FieldListsMustFollowEachOtherInOrder) {
  expect_rejected(with_u64(IndexLayout::sample(1, sample_entry_at::kFirstField), 0),
                  "index entry of sample 1: field list is out of order or out of range");
  expect_rejected(with_u32(IndexLayout::sample(2, sample_entry_at::kFieldCount), 3),
                  "index entry of sample 2: field list is out of order or out of range");
  expect_rejected(with_u32(IndexLayout::sample(2, sample_entry_at::kFieldCount), 1),
                  "index has 1 field entries that belong to no sample");
}

TEST_F(ShardStructure, KeysMustLieInsideTheStringTable) {
  expect_rejected(with_u64(IndexLayout::sample(1, sample_entry_at::kKeyOffset), strings_size()),
                  "index entry of sample 1: key lies outside the string table");
  expect_rejected(with_u32(IndexLayout::sample(0, sample_entry_at::kKeySize), 0),
                  "index entry of sample 0: key lies outside the string table");
}

TEST_F(ShardStructure, FieldsMustLieInsideTheirSample) {
  const IndexLayout at(parts_.index);
  // Sample 1's first field ("cls") pointed at sample 0's bytes: inside the data region, but not
  // inside its own sample.
  expect_rejected(with_u64(at.field(2, field_entry_at::kOffset), sample(0).offset),
                  "index entry of sample 1: field 'cls' lies outside its sample's bytes");
  // Sample 1's "txt" one byte longer than the sample.
  expect_rejected(with_u64(at.field(3, field_entry_at::kSize), field(3).size + 1),
                  "index entry of sample 1: field 'txt' lies outside its sample's bytes");
  expect_rejected(with_u64(at.field(5, field_entry_at::kOffset), ~uint64_t{0}),
                  "index entry of sample 2: field 'txt' lies outside its sample's bytes");
}

TEST_F(ShardStructure, FieldNamesMustBeInTheirTableAndDistinct) {
  const IndexLayout at(parts_.index);
  expect_rejected(with_u32(at.field(4, field_entry_at::kNameId), 2),
                  "field entry 4 has name id 2 of 2");
  expect_rejected(with_u32(at.name(1, name_entry_at::kOffset), strings_size()),
                  "field name 1 lies outside the string table");
  expect_rejected(with_u32(at.name(0, name_entry_at::kSize), 0),
                  "field name 0 lies outside the string table");
  // Name 1 ("txt") spelled "t/t" in the string table.
  ShardParts slash = parts_;
  const uint64_t txt =
      at.strings() + internal::get_u32(reinterpret_cast<const std::byte*>(
                         parts_.index.data() + at.name(1, name_entry_at::kOffset)));
  ASSERT_EQ(slash.index.substr(txt, 3), "txt");
  slash.index[txt + 1] = '/';
  expect_rejected(slash, "field name 1 ('t/t') contains '/'");
  // Name 1 pointing at name 0's bytes: two names "cls".
  ShardParts twice = parts_;
  internal::set_u32(twice.index, at.name(1, name_entry_at::kOffset),
                    internal::get_u32(reinterpret_cast<const std::byte*>(
                        parts_.index.data() + at.name(0, name_entry_at::kOffset))));
  expect_rejected(twice, "field name 1 ('cls') repeats field name 0");
}

TEST_F(ShardStructure, FooterMustAgreeWithHeaderAndIndex) {
  ShardParts count = parts_;
  count.footer.sample_count = 4;
  expect_rejected(count, "footer says 4 samples, the index holds 3");

  ShardParts flags = parts_;
  flags.footer.flags = format::kAligned;
  expect_rejected(flags, "header flags 0 differ from footer flags 1");

  ShardParts unknown = parts_;
  unknown.footer.flags = 1u << 4;
  const uint64_t footer_at = original_.size() - format::kFooterSize;
  expect_rejected(
      unknown,
      "unknown flags 16 (offset " + std::to_string(footer_at + format::footer_at::kFlags) + ")",
      ErrorCode::kUnsupported);

  ShardParts data_offset = parts_;
  data_offset.footer.data_offset = 8192;
  expect_rejected(data_offset, "footer data offset (offset " +
                                   std::to_string(footer_at + format::footer_at::kDataOffset) +
                                   ") is 8192, not 4096");
}

// The footer's index location, re-sealed: the footer checksum passes, the location does not.
TEST_F(ShardStructure, IndexMustLieBetweenHeaderAndFooter) {
  const uint64_t footer_at = original_.size() - format::kFooterSize;
  for (auto [offset, size] : {std::pair<uint64_t, uint64_t>{100, parts_.index.size()},
                              {parts_.footer.index_offset, parts_.index.size() + 1},
                              {parts_.footer.index_offset, ~uint64_t{0}}}) {
    format::Footer f = parts_.footer;
    f.index_offset = offset;
    f.index_size = size;
    const std::string file = parts_.before_index + parts_.index + format::encode_footer(f);
    Status st = open_and_read_all(file);
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
    EXPECT_NE(st.message().find("shard 'mutated.zws': footer points at index [" +
                                std::to_string(offset) + ", +" + std::to_string(size) +
                                "), which is not between the header (ends at 4096) and the "
                                "footer (at " +
                                std::to_string(footer_at) + ")"),
              std::string::npos)
        << st.message();
  }
}

TEST(ShardStructureAligned, SamplesMustBeAlignedInAnAlignedShard) {
  TempDir dir;
  write_shard(dir / "a.zws", small_samples(), {.align_samples = true});
  ShardParts parts = split_shard(testing::read_file(dir / "a.zws"));
  const IndexLayout at(parts.index);
  // Sample 1 and both its fields moved one byte on (into the zero padding after it): every other
  // rule still holds, only the alignment does not.
  for (uint64_t pos :
       {IndexLayout::sample(1, sample_entry_at::kOffset), at.field(2, field_entry_at::kOffset),
        at.field(3, field_entry_at::kOffset)}) {
    internal::set_u64(parts.index, pos, get64(parts.index, pos) + 1);
  }
  // The checksum of the moved sample's bytes is not what this test is about: verify=false.
  auto reader = ShardReader::open(make_memory_source("mutated.zws", bytes_of(parts.seal())));
  ASSERT_FALSE(reader.is_ok());
  EXPECT_EQ(reader.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(reader.status().message().find(
                "shard 'mutated.zws': sample 1 is not 4 KiB aligned in an aligned shard"),
            std::string::npos)
      << reader.status().message();
}

TEST(Shard, DataCorruptionNamesSample) {
  TempDir dir;
  const std::vector<TestSample> samples = {{"a/one", {{"txt", "hello"}}},
                                           {"a/two", {{"txt", "world"}}}};
  write_shard(dir / "d.zws", samples);
  std::string bytes = testing::read_file(dir / "d.zws");
  bytes[4096 + 5] ^= 0x20;  // first byte of sample 1
  testing::write_file(dir / "d.zws", bytes);
  auto reader = *ShardReader::open_path(dir / "d.zws");
  auto s = reader->read_sample(1, {.verify = true});
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(s.status().message().find("sample 1"), std::string::npos);
  EXPECT_NE(s.status().message().find("a/two"), std::string::npos);
  std::vector<BadSample> bad;
  ASSERT_TRUE(reader->verify([&](const BadSample& b) { bad.push_back(b); }).is_ok());
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].index, 1u);
  EXPECT_EQ(bad[0].key, "a/two");
}

TEST(Shard, TruncatedShardsAreCleanErrors) {
  TempDir dir;
  write_shard(dir / "t.zws", random_samples(10, 2000, 13));
  const std::string original = testing::read_file(dir / "t.zws");
  for (size_t len = 0; len < original.size(); len += (len < 5000 ? 97 : 1013)) {
    Status st = open_and_read_all(original.substr(0, len));
    EXPECT_FALSE(st.is_ok()) << "truncated at " << len;
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
  }
  // Same through a real file: the message names the path.
  testing::write_file(dir / "cut.zws", original.substr(0, original.size() - 1));
  auto reader = ShardReader::open_path(dir / "cut.zws");
  ASSERT_FALSE(reader.is_ok());
  EXPECT_NE(reader.status().message().find("cut.zws"), std::string::npos);
}

TEST(Shard, UnknownVersionIsClearError) {
  TempDir dir;
  write_shard(dir / "v.zws", random_samples(3, 10, 1));
  std::string bytes = testing::read_file(dir / "v.zws");
  bytes[8] = 2;  // header version
  Status st = open_and_read_all(bytes);
  EXPECT_EQ(st.code(), ErrorCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("version 2"), std::string::npos);
}

TEST(Shard, NotAShard) {
  Status st = open_and_read_all(std::string(10000, 'x'));
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
  EXPECT_NE(st.message().find("not a zerowait shard"), std::string::npos) << st.message();
}

// A shard whose offsets pass 4 GiB: a 4.5 GiB field of zeros is written as a hole (the writer
// skips zero blocks), so the file is sparse and the test costs no disk space.
TEST(Shard, OffsetsPast4GiBInSparseFile) {
  TempDir dir;
  const size_t big = (size_t{9} << 29);  // 4.5 GiB
  void* zeros = mmap(nullptr, big, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(zeros, MAP_FAILED);
  const std::string tail = testing::random_bytes(10000, 42);
  {
    auto writer = ShardWriter::create(dir / "huge.zws");
    ASSERT_TRUE(writer.is_ok());
    const std::string head = "first";
    std::vector<FieldData> f0 = {{"txt", bytes_of(head)}};
    ASSERT_TRUE(writer->add_sample("s0", f0).is_ok());
    std::vector<FieldData> f1 = {
        {"bin", std::span<const std::byte>(static_cast<const std::byte*>(zeros), big)}};
    ASSERT_TRUE(writer->add_sample("s1", f1).is_ok());
    std::vector<FieldData> f2 = {{"bin", bytes_of(tail)}};
    ASSERT_TRUE(writer->add_sample("s2", f2).is_ok());
    ASSERT_TRUE(writer->finish().is_ok());
  }
  munmap(zeros, big);
  EXPECT_GT(std::filesystem::file_size(dir / "huge.zws"), big);
  auto reader = ShardReader::open_path(dir / "huge.zws");
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  ASSERT_EQ((*reader)->size(), 3u);
  EXPECT_GT((*reader)->index().samples[2].offset, uint64_t{1} << 32);
  EXPECT_EQ((*reader)->index().samples[1].size, big);
  auto s2 = (*reader)->read_sample(2, {.verify = true});
  ASSERT_TRUE(s2.is_ok()) << s2.status().to_string();
  EXPECT_EQ(testing::to_string(s2->view.field("bin")->bytes), tail);
  auto s0 = (*reader)->read_sample(0, {.verify = true});
  ASSERT_TRUE(s0.is_ok());
  EXPECT_EQ(testing::to_string(s0->view.fields[0].bytes), "first");
}

}  // namespace
}  // namespace zerowait
