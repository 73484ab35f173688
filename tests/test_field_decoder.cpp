// The field decoder registry: decoders found by name, their options checked, their columns as
// the batch lays them out, and a field that does not decode reported in a line to follow
// "field 'x' ".
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "zerowait/loader/field_decoder.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/loader/token_window.hpp"

namespace zerowait {
namespace {

std::span<const std::byte> bytes_of(const std::string& text) {
  return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

TEST(FieldDecoderRegistry, FindsEveryDecoderByNameAndListsThemForAnUnknownOne) {
  const std::vector<std::string> names = field_decoder_names();
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  for (const char* name :
       {"raw", "text", "json", "int", "image", "image_device", "tokens", "array", "npy", "audio"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  const auto unknown = make_field_decoder({"jpeg2000", {}});
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("no decoder is named 'jpeg2000'"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("image_device"), std::string::npos);
}

TEST(FieldDecoderRegistry, RefusesOptionsOfAnotherDecoderAndInvalidOnes) {
  const auto mismatched = make_field_decoder({"image", TokenWindow{}});
  ASSERT_FALSE(mismatched.is_ok());
  EXPECT_NE(mismatched.status().message().find("'image' takes ImageTransform options"),
            std::string::npos);
  // TokenWindow's defaults have no seq_len: "tokens" without options is refused, and the
  // loader's options name the field.
  LoaderOptions options;
  options.decode["doc"] = {"tokens", {}};
  const Status status = options.validate();
  EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(status.message().find("decode of field 'doc'"), std::string::npos);
}

TEST(FieldDecoderRegistry, ATokensDecoderLaysOutRowsAndLengths) {
  TokenWindow window;
  window.seq_len = 4;
  window.int32_rows = true;
  auto decoder = make_field_decoder({"tokens", window});
  ASSERT_TRUE(decoder.is_ok()) << decoder.status().to_string();
  const FieldLayout layout = (*decoder)->layout();
  EXPECT_FALSE(layout.byte_rows);
  ASSERT_EQ(layout.columns.size(), 2u);
  EXPECT_EQ(layout.columns[0].dtype, DType::kInt32);
  EXPECT_EQ(layout.columns[0].row_bytes(), 16u);
  EXPECT_EQ(layout.columns[1].suffix, ".lengths");
  EXPECT_TRUE(layout.columns[1].small_rows);

  const uint16_t tokens[] = {7, 8};  // two tokens of four: padded
  std::byte row[16], length[8];
  std::byte* rows[] = {row, length};
  DecodeOutput out;
  out.rows = rows;
  const auto scratch = (*decoder)->make_scratch();
  ASSERT_TRUE((*decoder)
                  ->decode(std::span<const std::byte>(reinterpret_cast<const std::byte*>(tokens),
                                                      sizeof tokens),
                           out, scratch.get())
                  .is_ok());
  int32_t values[4];
  int64_t taken = 0;
  std::memcpy(values, row, sizeof values);
  std::memcpy(&taken, length, sizeof taken);
  EXPECT_EQ(values[0], 7);
  EXPECT_EQ(values[1], 8);
  EXPECT_EQ(taken, 2);
}

TEST(FieldDecoderRegistry, AFieldThatDoesNotDecodeOrIsMissingIsCorrupt) {
  auto decoder = make_field_decoder({"int", {}});
  ASSERT_TRUE(decoder.is_ok());
  std::byte value[8];
  std::byte* rows[] = {value};
  DecodeOutput out;
  out.rows = rows;
  ASSERT_TRUE((*decoder)->decode(bytes_of(" 42\n"), out, nullptr).is_ok());
  int64_t label = 0;
  std::memcpy(&label, value, sizeof label);
  EXPECT_EQ(label, 42);
  const Status bad = (*decoder)->decode(bytes_of("4x2"), out, nullptr);
  EXPECT_EQ(bad.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(bad.message(), "is not a decimal integer ('4x2')");
  const Status missing = (*decoder)->decode(std::nullopt, out, nullptr);
  EXPECT_EQ(missing.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(missing.message(), "is missing");
}

}  // namespace
}  // namespace zerowait
