// PNG and WebP images decoded into 8-bit RGB for the image transforms: a PNG row by row down to
// the last row a crop needs, a WebP whole (JPEG has its own path in image_transform.cpp, which
// also decodes only the DCT scale a crop needs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

enum class ImageFormat { kJpeg, kPng, kWebp, kUnknown };

// By the file's signature, not its name: a field named "jpg" that holds a PNG decodes as a PNG.
ImageFormat sniff_image_format(std::span<const std::byte> bytes);

// Decodes PNG and WebP as Pillow's Image.open(...).convert("RGB") gives them: palettes and grey
// expanded to RGB, 16-bit samples cut to their high byte, alpha dropped (not composited),
// interlaced PNGs deinterlaced. Reuses its buffers from image to image. Not thread-safe.
class RgbDecoder {
 public:
  // Rows [first, end) of an image, for a caller that needs only some: a crop.
  struct RowRange {
    int first = 0;
    int end = 0;
  };
  // Decodes `bytes` (format kPng or kWebp): `need(width, height)` is called once the size is
  // known and returns the rows wanted; `row(rgb)` then receives each of them in order (width * 3
  // bytes, valid during the call). A non-interlaced PNG is decoded row by row and no further than
  // `end`, so data after the last row needed is never read (a file cut short there decodes);
  // interlaced PNGs and WebPs are decoded whole first. Errors: kCorrupt with the library's reason
  // (a truncated file, a bad checksum); kUnsupported for an animated WebP or an image of more
  // than `max_pixels` pixels (checked before decoding); an error `need` returns.
  Status decode_rows(std::span<const std::byte> bytes, ImageFormat format, uint64_t max_pixels,
                     const std::function<Result<RowRange>(int width, int height)>& need,
                     const std::function<void(const uint8_t* rgb)>& row);

 private:
  Status decode_png_rows(std::span<const std::byte> bytes, uint64_t max_pixels,
                         const std::function<Result<RowRange>(int width, int height)>& need,
                         const std::function<void(const uint8_t* rgb)>& row);
  Status decode_webp_rows(std::span<const std::byte> bytes, uint64_t max_pixels,
                          const std::function<Result<RowRange>(int width, int height)>& need,
                          const std::function<void(const uint8_t* rgb)>& row);

  // At least `bytes` of RGB buffer, contents undefined. Not zeroed: the pages the decoder never
  // writes (an image cut short, a header claiming far more pixels than its data holds) are never
  // touched. A 154-byte WebP claiming 10,751 x 10,094 pixels cost 1.8 s and 700 MB of page
  // faults when the buffer was zeroed first (fuzz_image).
  uint8_t* rgb_buffer(size_t bytes);

  std::unique_ptr<uint8_t[]> rgb_;
  size_t rgb_capacity_ = 0;
  std::vector<uint8_t*> rows_;
};

}  // namespace zerowait::internal
