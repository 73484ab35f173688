// .npy headers as numpy.save writes them (format versions 1 and 2) and the array rows they
// describe: parsed, checked against the column's dtype and shape, refused with what differs.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "zerowait/loader/array_field.hpp"
#include "testing/testing.hpp"

namespace zerowait {
namespace {

// What numpy.save writes: magic, version, header length, a padded dict literal, the data.
std::vector<std::byte> npy(const std::string& dict, const std::vector<std::byte>& data,
                           int major = 1) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(major);
  out += char(0);
  const size_t n = header.size();
  out += char(n & 0xff);
  out += char((n >> 8) & 0xff);
  if (major != 1) out += std::string("\0\0", 2);
  out += header;
  std::vector<std::byte> bytes(out.size());
  std::memcpy(bytes.data(), out.data(), out.size());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

std::vector<std::byte> floats(std::vector<float> values) {
  std::vector<std::byte> out(values.size() * 4);
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

using ::zerowait::testing::contains;

TEST(ArrayFieldTest, ParsesNumpyHeadersOfBothVersions) {
  for (int major : {1, 2}) {
    const auto bytes =
        npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", floats({1, 2}), major);
    Result<NpyHeader> h = parse_npy_header(bytes);
    ASSERT_TRUE(h.is_ok()) << h.status().message();
    EXPECT_EQ(h->dtype, DType::kFloat32);
    EXPECT_EQ(h->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_FALSE(h->fortran_order);
    EXPECT_EQ(h->data_offset % 64, 0u);
  }
  Result<NpyHeader> scalar = parse_npy_header(npy("{'descr': '|b1', 'fortran_order': False, "
                                                  "'shape': (), }", {}));
  ASSERT_TRUE(scalar.is_ok());
  EXPECT_EQ(scalar->dtype, DType::kBool);
  EXPECT_TRUE(scalar->shape.empty());
  Result<NpyHeader> one = parse_npy_header(npy("{'descr': '|u1', 'fortran_order': False, "
                                               "'shape': (7,), }", {}));
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(one->shape, (std::vector<int64_t>{7}));
}

TEST(ArrayFieldTest, RefusesWhatIsNotALittleEndianArrayOfNumbers) {
  auto message = [](const std::vector<std::byte>& bytes) {
    return parse_npy_header(bytes).status().message();
  };
  EXPECT_TRUE(contains(message(floats({1, 2, 3})), "not a .npy array"));
  EXPECT_TRUE(contains(message(npy("{'descr': '>i4', 'fortran_order': False, 'shape': (1,), }",
                                   {})),
                       "big-endian"));
  EXPECT_TRUE(contains(message(npy("{'descr': [('a', '<i4')], 'fortran_order': False, "
                                   "'shape': (1,), }", {})),
                       "structured"));
  EXPECT_TRUE(contains(message(npy("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }",
                                   {})),
                       "numbers and booleans"));
  EXPECT_TRUE(contains(message(npy("{'descr': '<f4', 'shape': (1,), }", {})), "fortran_order"));
  EXPECT_TRUE(contains(message(npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }",
                                   {})),
                       "shape"));
  auto truncated = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", {});
  truncated.resize(30);
  EXPECT_TRUE(contains(message(truncated), "ends inside its .npy header"));
}

TEST(ArrayFieldTest, CopiesRowsThatMatchTheColumnAndNamesWhatDiffers) {
  ArrayField column;
  column.dtype = DType::kFloat32;
  column.shape = {2};
  ASSERT_TRUE(column.validate().is_ok());
  EXPECT_EQ(column.row_bytes(), 8u);
  float row[2] = {0, 0};
  const auto good = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                        floats({1.5f, -2}));
  ASSERT_TRUE(column.decode(good, reinterpret_cast<std::byte*>(row)).is_ok());
  EXPECT_EQ(row[0], 1.5f);
  EXPECT_EQ(row[1], -2.0f);

  const auto other = npy("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", {});
  Status wrong = column.decode(other, reinterpret_cast<std::byte*>(row));
  EXPECT_EQ(wrong.code(), ErrorCode::kCorrupt);
  EXPECT_TRUE(contains(wrong.message(), "float64 [2] array, not the column's float32 [2]"));
  const auto short_data = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                              floats({1}));
  EXPECT_TRUE(contains(column.decode(short_data, reinterpret_cast<std::byte*>(row)).message(),
                       "holds 4 bytes of array data, not 8"));
  Status big = column.decode(npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }",
                                 floats({1, 2})),
                             reinterpret_cast<std::byte*>(row));
  EXPECT_EQ(big.code(), ErrorCode::kCorrupt);  // one sample's fault costs that sample only

  ArrayField bare = column;
  bare.header = false;
  ASSERT_TRUE(bare.decode(floats({3, 4}), reinterpret_cast<std::byte*>(row)).is_ok());
  EXPECT_EQ(row[1], 4.0f);
  EXPECT_FALSE(bare.decode(floats({3}), reinterpret_cast<std::byte*>(row)).is_ok());
}

TEST(ArrayFieldTest, ValidatesLayouts) {
  ArrayField no_dtype;
  no_dtype.header = false;
  EXPECT_FALSE(no_dtype.validate().is_ok());
  ArrayField huge;
  huge.dtype = DType::kFloat64;
  huge.shape = {1 << 20, 1 << 20};
  EXPECT_TRUE(contains(huge.validate().message(), "exceed 1 GiB"));
  ArrayField negative;
  negative.dtype = DType::kInt8;
  negative.shape = {-1};
  EXPECT_FALSE(negative.validate().is_ok());
  EXPECT_EQ(parse_dtype("float16").value(), DType::kFloat16);
  EXPECT_TRUE(contains(parse_dtype("complex64").status().message(), "unknown dtype"));
}

}  // namespace
}  // namespace zerowait
