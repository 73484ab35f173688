// "array" (and "npy"): one NumPy array a sample (an ArrayField) into [*shape] rows of its dtype.
// Without a dtype, dtype and shape come from the first sample that has the field.
#include "loader/decode/common.hpp"
#include "zerowait/loader/array_field.hpp"
#include "zerowait/loader/field_decoder.hpp"

namespace zerowait {

namespace {

class ArrayDecoder final : public FieldDecoder {
 public:
  explicit ArrayDecoder(const ArrayField& array) : array_(array) {}

  FieldLayout layout() const override {
    return {.byte_rows = false, .columns = {{"", *array_.dtype, array_.shape, false}}};
  }

  bool needs_first_sample() const override { return !array_.dtype.has_value(); }

  Status take_layout(std::span<const std::byte> field) override {
    ZW_ASSIGN_OR_RETURN(const NpyHeader header, parse_npy_header(field));
    array_.dtype = header.dtype;
    array_.shape = header.shape;
    return array_.validate();
  }

  Status decode(std::optional<std::span<const std::byte>> field, DecodeOutput& out,
                DecodeScratch*) const override {
    if (!field) return missing_field();
    return array_.decode(*field, out.rows[0]);
  }

 private:
  ArrayField array_;
};

}  // namespace

Result<std::unique_ptr<FieldDecoder>> make_array_decoder(const std::any& options) {
  return internal::make_decoder<ArrayDecoder, ArrayField>(options, "array", "Array");
}

}  // namespace zerowait
