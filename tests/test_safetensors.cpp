// The safetensors header: what the encoder writes reads back, and the decoder refuses every way a
// header can disagree with itself or with the file, naming the tensor or field at fault.
#include <gtest/gtest.h>

#include "checkpoint/safetensors.hpp"
#include "common/endian.hpp"
#include "testing/testing.hpp"

namespace zerowait::internal::safetensors {
namespace {

const std::string kPath = "/ckpt/step_1/model.safetensors";

using ::zerowait::testing::contains;

// A file of `json` as its header and `data_bytes` bytes of data; returns its first bytes (the
// length and the header) and sets `file_size`.
std::string file_with_header(const std::string& json, uint64_t data_bytes, uint64_t* file_size) {
  std::string out;
  put_u64(out, json.size());
  out += json;
  *file_size = out.size() + data_bytes;
  return out;
}

Result<Header> decode_json(const std::string& json, uint64_t data_bytes) {
  uint64_t file_size = 0;
  std::string prefix = file_with_header(json, data_bytes, &file_size);
  return decode_header(prefix, file_size, kPath);
}

// Expects kCorrupt whose message names the file and each of `needles`.
void expect_corrupt(const Status& status, const std::vector<std::string>& needles) {
  EXPECT_EQ(status.code(), ErrorCode::kCorrupt) << status.to_string();
  EXPECT_TRUE(contains(status.message(), kPath)) << status.message();
  for (const std::string& needle : needles) {
    EXPECT_TRUE(contains(status.message(), needle))
        << "'" << needle << "' not in: " << status.message();
  }
}
template <typename T>
void expect_corrupt(const Result<T>& result, const std::vector<std::string>& needles) {
  expect_corrupt(result.status(), needles);
}

std::vector<TensorEntry> sample_tensors() {
  return {
      {.name = "model.embed.weight", .dtype = "BF16", .shape = {4, 8}, .begin = 0, .end = 64},
      {.name = "model.norm.scale", .dtype = "F32", .shape = {3}, .begin = 64, .end = 76},
      {.name = "step", .dtype = "I64", .shape = {}, .begin = 76, .end = 84},
      {.name = "empty", .dtype = "U8", .shape = {0, 5}, .begin = 84, .end = 84},
      {.name = "mask", .dtype = "BOOL", .shape = {2}, .begin = 84, .end = 86},
  };
}

TEST(Safetensors, DtypeSizes) {
  EXPECT_EQ(dtype_size("BOOL"), 1u);
  EXPECT_EQ(dtype_size("F8_E4M3"), 1u);
  EXPECT_EQ(dtype_size("F8_E8M0"), 1u);
  EXPECT_EQ(dtype_size("BF16"), 2u);
  EXPECT_EQ(dtype_size("U16"), 2u);
  EXPECT_EQ(dtype_size("F32"), 4u);
  EXPECT_EQ(dtype_size("C64"), 8u);
  EXPECT_EQ(dtype_size("U64"), 8u);
  EXPECT_EQ(dtype_size("float32"), 0u);
  EXPECT_EQ(dtype_size("bf16"), 0u) << "names are case-sensitive";
}

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "1000"}};
  auto encoded = encode_header(sample_tensors(), metadata);
  ASSERT_TRUE(encoded.is_ok()) << encoded.status().to_string();
  EXPECT_EQ(encoded->size() % 4096, 0u) << "the data area starts on a 4096-byte boundary";
  EXPECT_EQ(get_u64(reinterpret_cast<const std::byte*>(encoded->data())), encoded->size() - 8);
  EXPECT_EQ(encoded->back(), ' ') << "padded with spaces";

  auto decoded = decode_header(*encoded, encoded->size() + 86, kPath);
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  EXPECT_EQ(decoded->data_start, encoded->size());
  EXPECT_EQ(decoded->metadata, metadata);
  const std::vector<TensorEntry> expected = sample_tensors();
  ASSERT_EQ(decoded->tensors.size(), expected.size());
  // Data order; the zero-byte tensor sorts before the one that shares its begin offset.
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(decoded->tensors[i].name, expected[i].name);
    EXPECT_EQ(decoded->tensors[i].dtype, expected[i].dtype);
    EXPECT_EQ(decoded->tensors[i].shape, expected[i].shape);
    EXPECT_EQ(decoded->tensors[i].begin, expected[i].begin);
    EXPECT_EQ(decoded->tensors[i].end, expected[i].end);
  }
}

TEST(Safetensors, WritesTensorsInDataOrderAndNoEmptyMetadata) {
  std::vector<TensorEntry> tensors = {
      {.name = "z", .dtype = "U8", .shape = {1}, .begin = 0, .end = 1},
      {.name = "a", .dtype = "U8", .shape = {1}, .begin = 1, .end = 2},
  };
  auto encoded = encode_header(tensors, {}, 1);
  ASSERT_TRUE(encoded.is_ok()) << encoded.status().to_string();
  const std::string json = encoded->substr(8);
  EXPECT_LT(json.find("\"z\""), json.find("\"a\""));
  EXPECT_FALSE(contains(json, "__metadata__"));
  EXPECT_EQ(json.back(), '}') << "alignment 1 needs no padding";
}

TEST(Safetensors, AlignsTheDataAreaToAnyAlignment) {
  for (uint64_t alignment : {1u, 8u, 64u, 4096u, 65536u}) {
    SCOPED_TRACE(alignment);
    auto encoded = encode_header(sample_tensors(), {{"k", "v"}}, alignment);
    ASSERT_TRUE(encoded.is_ok()) << encoded.status().to_string();
    EXPECT_EQ(encoded->size() % alignment, 0u);
    auto decoded = decode_header(*encoded, encoded->size() + 86, kPath);
    ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
    EXPECT_EQ(decoded->data_start % alignment, 0u);
  }
}

TEST(Safetensors, EncodesAnEmptyFile) {
  auto encoded = encode_header({}, {}, 8);
  ASSERT_TRUE(encoded.is_ok());
  EXPECT_EQ(encoded->substr(8), "{}      ");  // byte for byte what the reference writer produces
  auto with_metadata = encode_header({}, {{"framework", "pt"}}, 8);
  ASSERT_TRUE(with_metadata.is_ok());
  EXPECT_EQ(with_metadata->substr(8), R"({"__metadata__":{"framework":"pt"}}     )");
  auto decoded = decode_header(*encoded, encoded->size(), kPath);
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  EXPECT_TRUE(decoded->tensors.empty());
}

TEST(Safetensors, EncoderRefusesABadLayout) {
  std::vector<TensorEntry> gap = {
      {.name = "a", .dtype = "U8", .shape = {1}, .begin = 0, .end = 1},
      {.name = "b", .dtype = "U8", .shape = {1}, .begin = 2, .end = 3},
  };
  auto st = encode_header(gap, {}).status();
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(st.message(), "'b'")) << st.message();

  std::vector<TensorEntry> twice = {
      {.name = "a", .dtype = "U8", .shape = {1}, .begin = 0, .end = 1},
      {.name = "a", .dtype = "U8", .shape = {1}, .begin = 1, .end = 2},
  };
  EXPECT_EQ(encode_header(twice, {}).status().code(), ErrorCode::kInvalidArgument);
  std::vector<TensorEntry> wrong_span = {
      {.name = "a", .dtype = "F32", .shape = {2}, .begin = 0, .end = 4}};
  EXPECT_EQ(encode_header(wrong_span, {}).status().code(), ErrorCode::kInvalidArgument);
  std::vector<TensorEntry> reserved = {
      {.name = "__metadata__", .dtype = "U8", .shape = {1}, .begin = 0, .end = 1}};
  EXPECT_EQ(encode_header(reserved, {}).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Safetensors, AcceptsHeadersOtherWritersProduce) {
  // Any key order, unpadded, no metadata, a null metadata, unknown extra fields.
  const std::string json =
      R"({"b":{"shape":[2],"data_offsets":[4,8],"dtype":"F16"},)"
      R"("a":{"dtype":"F16","shape":[2],"data_offsets":[0,4],"extra":1},"__metadata__":null})";
  auto decoded = decode_json(json, 8);
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  ASSERT_EQ(decoded->tensors.size(), 2u);
  EXPECT_EQ(decoded->tensors[0].name, "a");
  EXPECT_EQ(decoded->tensors[1].name, "b");
  EXPECT_TRUE(decoded->metadata.empty());
}

TEST(Safetensors, RejectsATruncatedFile) {
  expect_corrupt(header_length("abc", kPath), {"truncated"});
  expect_corrupt(decode_header(std::string(5, '\0'), 5, kPath), {"truncated"});

  auto encoded = encode_header(sample_tensors(), {});
  ASSERT_TRUE(encoded.is_ok());
  // The header runs past the end of the file.
  expect_corrupt(decode_header(*encoded, encoded->size() - 1, kPath), {"truncated"});
  // The data area is short of what the tensors cover.
  expect_corrupt(decode_header(*encoded, encoded->size() + 85, kPath), {"86", "85"});
}

TEST(Safetensors, RejectsAHeaderLengthPastTheLimit) {
  std::string first8;
  put_u64(first8, 100'000'001);
  expect_corrupt(header_length(first8, kPath), {"100000001"});
  std::string huge;
  put_u64(huge, ~0ull);
  expect_corrupt(decode_header(huge, ~0ull, kPath), {"limit"});
  first8.clear();
  put_u64(first8, 100'000'000);
  EXPECT_TRUE(header_length(first8, kPath).is_ok()) << "the limit itself is allowed";
}

TEST(Safetensors, RejectsOffsetsWithAGap) {
  expect_corrupt(decode_json(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                             R"("b":{"dtype":"U8","shape":[2],"data_offsets":[3,5]}})",
                             5),
                 {"tensor 'b'", "data_offsets", "gap"});
  expect_corrupt(decode_json(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})", 3),
                 {"tensor 'a'", "data_offsets"});
}

TEST(Safetensors, RejectsOverlappingTensors) {
  expect_corrupt(decode_json(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                             6),
                 {"tensor 'a'", "overlaps"});
  expect_corrupt(decode_json(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 0),
                 {"tensor 'a'", "end before"});
}

TEST(Safetensors, RejectsASpanThatDisagreesWithShapeAndDtype) {
  expect_corrupt(decode_json(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12]}})", 12),
                 {"tensor 'w'", "[2, 3]", "24", "12"});
}

TEST(Safetensors, RejectsAShapeWhoseSizeOverflows) {
  expect_corrupt(
      decode_json(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
                  0),
      {"tensor 'w'", "overflow"});
  expect_corrupt(decode_json(R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0),
                 {"tensor 'w'", "shape"});
}

TEST(Safetensors, RejectsUnknownDtypes) {
  expect_corrupt(decode_json(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", 16),
                 {"tensor 'w'", "F128"});
}

TEST(Safetensors, RejectsATotalThatIsNotTheFileSize) {
  const std::string json = R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  expect_corrupt(decode_json(json, 5), {"4", "5"});
  expect_corrupt(decode_json(json, 3), {"4", "3"});
  expect_corrupt(decode_json("{}", 1), {"0", "1"});
}

TEST(Safetensors, RejectsNonStringMetadata) {
  expect_corrupt(decode_json(R"({"__metadata__":{"step":1000}})", 0), {"__metadata__", "'step'"});
  expect_corrupt(decode_json(R"({"__metadata__":["a"]})", 0), {"__metadata__"});
}

TEST(Safetensors, RejectsMalformedEntries) {
  expect_corrupt(decode_json(R"({"w":{"shape":[1],"data_offsets":[0,1]}})", 1),
                 {"tensor 'w'", "dtype"});
  expect_corrupt(decode_json(R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", 1),
                 {"tensor 'w'", "shape"});
  expect_corrupt(decode_json(R"({"w":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}})", 1),
                 {"tensor 'w'", "shape"});
  expect_corrupt(decode_json(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1),
                 {"tensor 'w'", "data_offsets"});
  expect_corrupt(decode_json(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,-1]}})", 1),
                 {"tensor 'w'", "data_offsets"});
  expect_corrupt(decode_json(R"({"w":[1]})", 1), {"tensor 'w'", "not an object"});
}

TEST(Safetensors, RejectsHeadersThatAreNotOneJsonObject) {
  expect_corrupt(decode_json(R"(["w"])", 0), {"'{'"});
  expect_corrupt(decode_json(R"({"w":)", 0), {"JSON"});
  expect_corrupt(decode_json("{}\xff", 0), {"JSON"});
  expect_corrupt(decode_json(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                             2),
                 {"'w'", "twice"});
}

}  // namespace
}  // namespace zerowait::internal::safetensors
