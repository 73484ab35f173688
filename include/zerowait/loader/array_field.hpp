// NumPy arrays stored in a field, one per sample, become rows of a [batch, *shape] column.
//
// The field holds either the .npy format (numpy.save; zerowait.write_dataset stores arrays and
// tensors so), whose header must match the column's dtype and shape, or, with header = false,
// the bare bytes of an array of that dtype and shape (tensor.numpy().tobytes()). A column with
// no dtype takes dtype and shape from the first sample that has the field (Loader::create reads
// it), so every sample's array must be shaped as that one's. Rows are copied as stored: C order,
// little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/loader/dtype.hpp"

namespace zerowait {

struct ArrayField {
  std::optional<DType> dtype;  // unset: from the first sample (then `shape` is set with it)
  std::vector<int64_t> shape;  // of one sample; {} is a scalar
  bool header = true;          // .npy; false: bare bytes

  // kInvalidArgument: a negative dimension, a row over the limit, or a bare-bytes field with
  // no dtype to read it by.
  Status validate() const;
  uint64_t row_bytes() const;
  // Copies the array in `bytes` into `row` (row_bytes()). kCorrupt saying what differs.
  Status decode(std::span<const std::byte> bytes, std::byte* row) const;
  std::string describe() const;  // "float32 [3, 4]"
};

struct NpyHeader {
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  bool fortran_order = false;
  size_t data_offset = 0;  // where the array's bytes start
};

// The header of a .npy file (format versions 1 to 3). kCorrupt when it is not one; kUnsupported
// for dtypes the loader cannot copy as they are (big-endian, structured, object).
Result<NpyHeader> parse_npy_header(std::span<const std::byte> bytes);

}  // namespace zerowait
