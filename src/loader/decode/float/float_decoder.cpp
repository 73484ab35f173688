// "float": a field holding a number as ASCII decimal text ("0.75", "-3e-2", "nan") into a
// float64 column: regression targets and scores stored as text, as "int" does for labels.
#include "loader/decode/common.hpp"

namespace zerowait {

Result<std::unique_ptr<FieldDecoder>> make_float_decoder(const std::any&) {
  return std::unique_ptr<FieldDecoder>(
      std::make_unique<internal::TextNumberDecoder<double>>(DType::kFloat64, "a decimal number"));
}

}  // namespace zerowait
