// The element types of batch columns, named as NumPy names them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "zerowait/common/status.hpp"

namespace zerowait {

enum class DType {
  kUInt8,
  kInt32,
  kInt64,
  kInt8,
  kInt16,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat16,
  kFloat32,
  kFloat64,
  kBool,
};

size_t dtype_size(DType dtype);
// "uint8", "float32", "bool", ...: what numpy.dtype() and torch take.
const char* dtype_name(DType dtype);
// The inverse of dtype_name(); kInvalidArgument listing the names otherwise.
Result<DType> parse_dtype(const std::string& name);
// A .npy header's 'descr' ("<f4", "|u1", "|b1", "<i8", ...). Big-endian and structured types
// are kUnsupported: the loader copies rows as they are stored, and x86/ARM are little-endian.
Result<DType> dtype_from_npy_descr(std::string_view descr);

}  // namespace zerowait
