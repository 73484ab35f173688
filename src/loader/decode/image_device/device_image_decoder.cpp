// "image_device": an image for the GPU stage (python/zerowait/gpu_decode.py). Each row of the
// byte rows is the JPEG, or, where ImageDecoder::prepare_for_device decoded the image here, its
// size * size * 3 output pixels; "<field>.crop" float64 [n, kDeviceCropColumns] says which, and
// what to show (DeviceCropColumn).
#include <algorithm>
#include <cstring>

#include "loader/decode/common.hpp"
#include "loader/decode/image/image_scratch.hpp"
#include "zerowait/loader/field_decoder.hpp"
#include "zerowait/loader/image_transform.hpp"

namespace zerowait {

namespace {

class DeviceImageDecoder final : public FieldDecoder {
 public:
  explicit DeviceImageDecoder(const ImageTransform& transform) : transform_(transform) {}

  FieldLayout layout() const override {
    return {.byte_rows = true, .columns = {{".crop", DType::kFloat64, {kDeviceCropColumns}, true}}};
  }

  // An image the GPU decoder would not take is decoded into its row instead: room for that.
  uint64_t row_bytes_room(uint64_t field_bytes) const override {
    return std::max(field_bytes, pixel_bytes());
  }

  std::unique_ptr<DecodeScratch> make_scratch() const override {
    return std::make_unique<internal::ImageScratch>();
  }

  Status decode(std::optional<std::span<const std::byte>> field, DecodeOutput& out,
                DecodeScratch* scratch) const override {
    if (!field) return missing_field();
    auto* pixels = reinterpret_cast<uint8_t*>(out.bytes.data());
    ZW_ASSIGN_OR_RETURN(const DeviceCrop crop,
                        static_cast<internal::ImageScratch*>(scratch)->decoder.prepare_for_device(
                            *field, transform_, out.seed, {pixels, pixel_bytes()}));
    if (crop.decoded) {
      out.bytes_written = pixel_bytes();  // already in place
    } else {
      std::memcpy(out.bytes.data(), field->data(), field->size());
      out.bytes_written = field->size();
    }
    double row[kDeviceCropColumns];
    row[kDeviceCropX0] = crop.area.x0;
    row[kDeviceCropY0] = crop.area.y0;
    row[kDeviceCropX1] = crop.area.x1;
    row[kDeviceCropY1] = crop.area.y1;
    row[kDeviceCropFlip] = crop.area.flip ? 1.0 : 0.0;
    row[kDeviceCropWidth] = crop.width;
    row[kDeviceCropHeight] = crop.height;
    row[kDeviceCropDecoded] = crop.decoded ? 1.0 : 0.0;
    std::memcpy(out.rows[0], row, sizeof row);
    return Status::ok();
  }

 private:
  uint64_t pixel_bytes() const { return uint64_t(transform_.size) * transform_.size * 3; }

  const ImageTransform transform_;
};

}  // namespace

Result<std::unique_ptr<FieldDecoder>> make_device_image_decoder(const std::any& options) {
  return internal::make_decoder<DeviceImageDecoder, ImageTransform>(options, "image_device",
                                                                    "ImageTransform");
}

}  // namespace zerowait
