// "image": a JPEG, PNG or WebP field decoded and transformed on the loader's threads (an
// ImageTransform) into uint8 [size, size, 3] rows.
#include "loader/decode/common.hpp"
#include "loader/decode/image/image_scratch.hpp"
#include "zerowait/loader/field_decoder.hpp"
#include "zerowait/loader/image_transform.hpp"

namespace zerowait {

namespace {

class CpuImageDecoder final : public FieldDecoder {
 public:
  explicit CpuImageDecoder(const ImageTransform& transform) : transform_(transform) {}

  FieldLayout layout() const override {
    const int64_t side = transform_.size;
    return {.byte_rows = false, .columns = {{"", DType::kUInt8, {side, side, 3}, false}}};
  }

  std::unique_ptr<DecodeScratch> make_scratch() const override {
    return std::make_unique<internal::ImageScratch>();
  }

  Status decode(std::optional<std::span<const std::byte>> field, DecodeOutput& out,
                DecodeScratch* scratch) const override {
    if (!field) return missing_field();
    const uint64_t row_bytes = uint64_t(transform_.size) * transform_.size * 3;
    auto* row = reinterpret_cast<uint8_t*>(out.rows[0]);
    return static_cast<internal::ImageScratch*>(scratch)->decoder.decode(
        *field, transform_, out.seed, {row, row_bytes});
  }

 private:
  const ImageTransform transform_;
};

}  // namespace

Result<std::unique_ptr<FieldDecoder>> make_image_decoder(const std::any& options) {
  return internal::make_decoder<CpuImageDecoder, ImageTransform>(options, "image",
                                                                 "ImageTransform");
}

}  // namespace zerowait
