// "int": a field holding an integer as ASCII decimal text (a "cls" label) into an int64 column.
#include <cstring>

#include "loader/decode/common.hpp"
#include "zerowait/loader/field_decoder.hpp"

namespace zerowait {

namespace {

class IntDecoder final : public FieldDecoder {
 public:
  FieldLayout layout() const override {
    return {.byte_rows = false, .columns = {{"", DType::kInt64, {}, true}}};
  }

  Status decode(std::optional<std::span<const std::byte>> field, DecodeOutput& out,
                DecodeScratch*) const override {
    if (!field) return missing_field();
    ZW_ASSIGN_OR_RETURN(const int64_t label,
                        internal::parse_ascii_number<int64_t>(*field, "a decimal integer"));
    std::memcpy(out.rows[0], &label, sizeof label);
    return Status::ok();
  }
};

}  // namespace

Result<std::unique_ptr<FieldDecoder>> make_int_decoder(const std::any&) {
  return std::unique_ptr<FieldDecoder>(std::make_unique<IntDecoder>());
}

}  // namespace zerowait
