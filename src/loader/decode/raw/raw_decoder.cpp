// "raw" (and "text", "json"): a field's bytes as they are stored, in byte rows. A sample without
// the field gets an empty row.
#include <cstring>

#include "zerowait/loader/field_decoder.hpp"

namespace zerowait {

namespace {

class RawDecoder final : public FieldDecoder {
 public:
  FieldLayout layout() const override { return {.byte_rows = true, .columns = {}}; }

  Status decode(std::optional<std::span<const std::byte>> field, DecodeOutput& out,
                DecodeScratch*) const override {
    out.bytes_written = field ? field->size() : 0;
    if (out.bytes_written > 0) std::memcpy(out.bytes.data(), field->data(), field->size());
    return Status::ok();
  }
};

}  // namespace

Result<std::unique_ptr<FieldDecoder>> make_raw_decoder(const std::any&) {
  return std::unique_ptr<FieldDecoder>(std::make_unique<RawDecoder>());
}

}  // namespace zerowait
