// "int": a field holding an integer as ASCII decimal text (a "cls" label) into an int64 column.
#include "loader/decode/common.hpp"

namespace zerowait {

Result<std::unique_ptr<FieldDecoder>> make_int_decoder(const std::any&) {
  return std::unique_ptr<FieldDecoder>(
      std::make_unique<internal::TextNumberDecoder<int64_t>>(DType::kInt64, "a decimal integer"));
}

}  // namespace zerowait
