// Byte grouping and chunked zstd compression of tensor bytes: exact round trips, damaged frames
// refused by name, and the reason grouping exists (bf16 weights compress better grouped).
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>

#include "checkpoint/tensor_codec.hpp"
#include "testing/testing.hpp"

namespace zerowait::internal {
namespace {

using ::zerowait::testing::contains;

std::vector<std::byte> random_data(size_t size, uint64_t seed) {
  if (size == 0) return {};  // to_bytes would memcpy from null, which UBSan reports
  return testing::to_bytes(testing::random_bytes(size, seed));
}

// bf16 weights as a model's would look: normal, stddev 0.02, rounded to nearest even.
std::vector<std::byte> bf16_weights(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::byte> out(count * 2);
  for (size_t i = 0; i < count; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(normal(rng));
    const uint16_t bf16 = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
    out[2 * i] = static_cast<std::byte>(bf16 & 0xff);  // little-endian, as on disk
    out[2 * i + 1] = static_cast<std::byte>(bf16 >> 8);
  }
  return out;
}

// Compresses `raw` chunk by chunk; returns the frames.
std::vector<std::vector<std::byte>> compress_all(const std::vector<std::byte>& raw,
                                                 const CodecOptions& options) {
  std::vector<std::vector<std::byte>> frames;
  std::vector<std::byte> scratch;
  uint64_t offset = 0;
  for (uint64_t i = 0; i < chunk_count(raw.size(), options.chunk_bytes); ++i) {
    const uint64_t size = chunk_raw_size(raw.size(), options.chunk_bytes, i);
    std::vector<std::byte> frame = {std::byte{0xaa}};  // compress_chunk appends
    auto written = compress_chunk(std::span(raw).subspan(offset, size), options, frame, scratch);
    EXPECT_TRUE(written.is_ok()) << written.status().to_string();
    EXPECT_EQ(*written + 1, frame.size());
    frame.erase(frame.begin());
    frames.push_back(std::move(frame));
    offset += size;
  }
  return frames;
}

uint64_t total_size(const std::vector<std::vector<std::byte>>& frames) {
  uint64_t total = 0;
  for (const auto& frame : frames) total += frame.size();
  return total;
}

TEST(TensorCodec, GroupsIntoBytePlanes) {
  // Two 4-byte elements: every byte 0, then every byte 1, ...
  std::vector<std::byte> raw(8), grouped(8);
  for (int i = 0; i < 8; ++i) raw[i] = std::byte(i);
  group_bytes(raw, 4, grouped);
  const std::vector<std::byte> expected = {std::byte{0}, std::byte{4}, std::byte{1}, std::byte{5},
                                           std::byte{2}, std::byte{6}, std::byte{3}, std::byte{7}};
  EXPECT_EQ(grouped, expected);
}

TEST(TensorCodec, GroupingRoundTripsForEveryElementSizeAndLength) {
  for (uint32_t element_size : {1u, 2u, 3u, 4u, 8u}) {
    for (size_t count : {0u, 1u, 7u, 33u, 1001u, 65537u}) {
      SCOPED_TRACE(std::to_string(element_size) + " x " + std::to_string(count));
      const std::vector<std::byte> raw = random_data(element_size * count, count);
      std::vector<std::byte> grouped(raw.size()), back(raw.size());
      group_bytes(raw, element_size, grouped);
      if (element_size > 1 && count > 1) {
        EXPECT_EQ(grouped[1], raw[element_size]) << "byte 0 of element 1 comes second";
      }
      ungroup_bytes(grouped, element_size, back);
      EXPECT_EQ(back, raw);
    }
  }
}

TEST(TensorCodec, GroupingKeepsATrailingPartialElement) {
  const std::vector<std::byte> raw = random_data(4 * 5 + 3, 9);
  std::vector<std::byte> grouped(raw.size()), back(raw.size());
  group_bytes(raw, 4, grouped);
  EXPECT_TRUE(std::equal(raw.end() - 3, raw.end(), grouped.end() - 3));
  ungroup_bytes(grouped, 4, back);
  EXPECT_EQ(back, raw);
}

TEST(TensorCodec, CutsChunks) {
  EXPECT_EQ(chunk_count(0, 4096), 0u);
  EXPECT_EQ(chunk_count(1, 4096), 1u);
  EXPECT_EQ(chunk_count(4096, 4096), 1u);
  EXPECT_EQ(chunk_count(4097, 4096), 2u);
  EXPECT_EQ(chunk_raw_size(10000, 4096, 0), 4096u);
  EXPECT_EQ(chunk_raw_size(10000, 4096, 1), 4096u);
  EXPECT_EQ(chunk_raw_size(10000, 4096, 2), 10000u - 8192u);
  EXPECT_EQ(chunk_raw_size(10000, 4096, 3), 0u);
}

TEST(TensorCodec, CompressesAndDecompressesAcrossChunks) {
  const std::vector<std::byte> weights = bf16_weights(50'000, 1);
  for (uint32_t element_size : {1u, 2u, 4u}) {
    for (uint64_t chunk_bytes : {4096u, 65536u, 1u << 20}) {
      SCOPED_TRACE(std::to_string(element_size) + " / " + std::to_string(chunk_bytes));
      const CodecOptions options{.element_size = element_size, .chunk_bytes = chunk_bytes};
      const auto frames = compress_all(weights, options);
      ASSERT_EQ(frames.size(), chunk_count(weights.size(), chunk_bytes));
      std::vector<std::byte> back(weights.size()), scratch;
      uint64_t offset = 0;
      for (size_t i = 0; i < frames.size(); ++i) {
        const uint64_t size = chunk_raw_size(weights.size(), chunk_bytes, i);
        Status st = decompress_chunk(frames[i], options, std::span(back).subspan(offset, size),
                                     scratch, "chunk " + std::to_string(i));
        ASSERT_TRUE(st.is_ok()) << st.to_string();
        offset += size;
      }
      EXPECT_EQ(back, weights);
    }
  }
}

TEST(TensorCodec, CompressesAnEmptyChunk) {
  std::vector<std::byte> frame, scratch, none;
  const CodecOptions options{.element_size = 2};
  ASSERT_TRUE(compress_chunk({}, options, frame, scratch).is_ok());
  EXPECT_TRUE(decompress_chunk(frame, options, none, scratch, "empty").is_ok());
}

TEST(TensorCodec, RefusesDamagedFramesNamingThem) {
  const CodecOptions options{.element_size = 2};
  const std::vector<std::byte> raw = bf16_weights(4096, 2);
  std::vector<std::byte> frame, scratch, back(raw.size());
  ASSERT_TRUE(compress_chunk(raw, options, frame, scratch).is_ok());
  const std::string what = "tensor 'model.embed.weight' chunk 3 of /ckpt/step_1/a.zst";

  auto expect_corrupt = [&](std::span<const std::byte> damaged, std::span<std::byte> into,
                            const std::string& why) {
    Status st = decompress_chunk(damaged, options, into, scratch, what);
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt) << st.to_string();
    EXPECT_TRUE(contains(st.message(), what)) << st.message();
    EXPECT_TRUE(contains(st.message(), why)) << st.message();
  };
  std::vector<std::byte> bad_magic = frame;
  bad_magic[0] ^= std::byte{0xff};
  expect_corrupt(bad_magic, back, "not a zstd frame");
  expect_corrupt(std::span(frame).first(frame.size() - 1), back, "truncated");
  expect_corrupt(std::span(frame).first(3), back, "");
  std::vector<std::byte> trailing = frame;
  trailing.push_back(std::byte{0});
  expect_corrupt(trailing, back, "after its zstd frame");
  expect_corrupt(frame, std::span(back).first(back.size() - 2),
                 "expected " + std::to_string(back.size() - 2));
  ASSERT_TRUE(decompress_chunk(frame, options, back, scratch, what).is_ok());
  EXPECT_EQ(back, raw);
}

TEST(TensorCodec, GroupingMakesBf16WeightsCompressBetter) {
  // The exponent bytes of normally distributed weights take few values; grouped together they
  // compress, interleaved with the near-random mantissa bytes they barely do.
  const std::vector<std::byte> weights = bf16_weights(1 << 20, 3);
  const uint64_t ungrouped = total_size(compress_all(weights, {.element_size = 1}));
  const uint64_t grouped = total_size(compress_all(weights, {.element_size = 2}));
  RecordProperty("raw", std::to_string(weights.size()));
  RecordProperty("ungrouped", std::to_string(ungrouped));
  RecordProperty("grouped", std::to_string(grouped));
  EXPECT_LT(grouped, ungrouped);
  EXPECT_LE(grouped, 0.85 * weights.size())
      << grouped << " of " << weights.size() << " bytes (ungrouped " << ungrouped << ")";
}

}  // namespace
}  // namespace zerowait::internal
