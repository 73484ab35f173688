// "float": a field holding a number as ASCII decimal text ("0.75", "-3e-2", "nan") into a
// float64 column: regression targets and scores stored as text, as "int" does for labels.
#include <cstring>

#include "loader/decode/common.hpp"
#include "zerowait/loader/field_decoder.hpp"

namespace zerowait {

namespace {

class FloatDecoder final : public FieldDecoder {
 public:
  FieldLayout layout() const override {
    return {.byte_rows = false, .columns = {{"", DType::kFloat64, {}, true}}};
  }

  Status decode(std::optional<std::span<const std::byte>> field, DecodeOutput& out,
                DecodeScratch*) const override {
    if (!field) return missing_field();
    ZW_ASSIGN_OR_RETURN(const double value,
                        internal::parse_ascii_number<double>(*field, "a decimal number"));
    std::memcpy(out.rows[0], &value, sizeof value);
    return Status::ok();
  }
};

}  // namespace

Result<std::unique_ptr<FieldDecoder>> make_float_decoder(const std::any&) {
  return std::unique_ptr<FieldDecoder>(std::make_unique<FloatDecoder>());
}

}  // namespace zerowait
