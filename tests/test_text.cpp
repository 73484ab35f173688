// The text helpers every component prints with (common/text.hpp), by hand-written cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "common/text.hpp"

namespace zerowait {
namespace {

using internal::ascii_lower;
using internal::format_bytes;
using internal::format_number;

TEST(Text, BytesInBinaryUnitsWithThreeSignificantDigits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(uint64_t{57} << 20), "57.0 MiB");
  EXPECT_EQ(format_bytes(uint64_t{512} << 20), "512 MiB");
  EXPECT_EQ(format_bytes(uint64_t{2} << 30), "2.00 GiB");
  EXPECT_EQ(format_bytes(UINT64_MAX), "16.0 EiB");
}

TEST(Text, NumbersGroupTheirThousands) {
  EXPECT_EQ(format_number(0), "0");
  EXPECT_EQ(format_number(999), "999");
  EXPECT_EQ(format_number(34000), "34,000");
  EXPECT_EQ(format_number(1234.5), "1,234") << "rounded half to even by printf";
  EXPECT_EQ(format_number(1234567.891, 2), "1,234,567.89");
  EXPECT_EQ(format_number(-1234.5, 1), "-1,234.5");
  EXPECT_EQ(format_number(-0.001, 2), "0.00") << "no sign on a value that prints as zero";
  EXPECT_EQ(format_number(std::nan("")), "-");
  EXPECT_EQ(format_number(INFINITY), "-");
}

TEST(Text, AsciiLowerLeavesOtherBytes) {
  EXPECT_EQ(ascii_lower("Content-TYPE"), "content-type");
  EXPECT_EQ(ascii_lower("\xC3\x89t\xC3\xA9"), "\xC3\x89t\xC3\xA9");
}

}  // namespace
}  // namespace zerowait
