// Shard format v1 through the public writer and reader: round trips, alignment, corruption of
// every footer and index byte, truncation.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <filesystem>
#include <map>
#include <random>

#include "testing/testing.hpp"
#include "zerowait/io/byte_source.hpp"
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

std::string str(std::span<const std::byte> b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
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
      EXPECT_EQ(str(f->bytes), value) << samples[i].key << "." << name;
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
      EXPECT_EQ(str((*views)[i].field(name)->bytes), value);
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
  EXPECT_EQ(ShardWriter::create(dir / "missing/dir/w.zws").status().code(),
            ErrorCode::kNotFound);
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
  const uint64_t index_offset = reader->index().samples.empty()
                                    ? 4096
                                    : reader->index().samples.back().offset +
                                          reader->index().samples.back().size;
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
  EXPECT_EQ(str(s2->view.field("bin")->bytes), tail);
  auto s0 = (*reader)->read_sample(0, {.verify = true});
  ASSERT_TRUE(s0.is_ok());
  EXPECT_EQ(str(s0->view.fields[0].bytes), "first");
}

}  // namespace
}  // namespace zerowait
