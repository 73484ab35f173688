#include "loader/decode/image/rgb_decode.hpp"

#include <png.h>
#include <webp/decode.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>

namespace zerowait::internal {
namespace {

bool starts_with(std::span<const std::byte> bytes, const void* prefix, size_t n, size_t at = 0) {
  return bytes.size() >= at + n && std::memcmp(bytes.data() + at, prefix, n) == 0;
}

// libpng reports errors through a callback that must not return: ours records the message and
// longjmps to the setjmp of the PngSteps function that called libpng, whose frame holds nothing
// with a destructor.
struct PngRead {
  std::span<const std::byte> bytes;
  size_t position = 0;
  char message[160] = {};
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* read = static_cast<PngRead*>(png_get_error_ptr(png));
  std::snprintf(read->message, sizeof read->message, "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}  // Pillow ignores them too

void read_png_bytes(png_structp png, png_bytep out, png_size_t length) {
  auto* read = static_cast<PngRead*>(png_get_io_ptr(png));
  if (length > read->bytes.size() - read->position) png_error(png, "truncated: data ends early");
  std::memcpy(out, read->bytes.data() + read->position, length);
  read->position += length;
}

// The steps of a PNG read, each under the setjmp of its caller. png_ptr and info are freed by
// the caller whatever happens.
struct PngSteps {
  // Reads the header and sets the transforms to 8-bit RGB. False on a libpng error.
  static bool header(png_structp png, png_infop info, png_uint_32* width, png_uint_32* height) {
    if (setjmp(png_jmpbuf(png))) return false;
    png_read_info(png, info);
    int bit_depth = 0, color_type = 0;
    png_get_IHDR(png, info, width, height, &bit_depth, &color_type, nullptr, nullptr, nullptr);
    png_set_strip_16(png);  // Pillow keeps the high byte of 16-bit samples
    png_set_packing(png);
    if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) {
      png_set_gray_to_rgb(png);
    }
    // Alpha, and the alpha that expanding a palette makes of a tRNS chunk, are dropped.
    if ((color_type & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) {
      png_set_strip_alpha(png);
    }
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    return true;
  }
  static bool rows(png_structp png, png_bytepp rows) {
    if (setjmp(png_jmpbuf(png))) return false;
    png_read_image(png, rows);
    return true;
  }
  // Reads rows 0 .. end - 1 of a non-interlaced image into `buffer` one at a time, handing rows
  // from `first` on to `take`.
  static bool some_rows(png_structp png, png_bytep buffer, int first, int end,
                        const std::function<void(const uint8_t*)>& take) {
    if (setjmp(png_jmpbuf(png))) return false;
    for (int y = 0; y < end; ++y) {
      png_read_row(png, buffer, nullptr);
      if (y >= first) take(buffer);
    }
    return true;
  }
};

}  // namespace

ImageFormat sniff_image_format(std::span<const std::byte> bytes) {
  static constexpr unsigned char kJpeg[3] = {0xff, 0xd8, 0xff};
  if (starts_with(bytes, kJpeg, sizeof kJpeg)) return ImageFormat::kJpeg;
  constexpr size_t kPngSignatureSize = 8;
  if (bytes.size() >= kPngSignatureSize &&
      png_sig_cmp(reinterpret_cast<png_const_bytep>(bytes.data()), 0, kPngSignatureSize) == 0) {
    return ImageFormat::kPng;
  }
  if (starts_with(bytes, "RIFF", 4) && starts_with(bytes, "WEBP", 4, 8)) return ImageFormat::kWebp;
  return ImageFormat::kUnknown;
}

uint8_t* RgbDecoder::rgb_buffer(size_t bytes) {
  if (bytes > rgb_capacity_) {
    rgb_.reset();  // the old one goes first: two huge buffers at once are not needed
    rgb_.reset(new uint8_t[bytes]);  // default-initialized: not zeroed
    rgb_capacity_ = bytes;
  }
  return rgb_.get();
}

Status RgbDecoder::decode_rows(std::span<const std::byte> bytes, ImageFormat format,
                               uint64_t max_pixels,
                               const std::function<Result<RowRange>(int width, int height)>& need,
                               const std::function<void(const uint8_t* rgb)>& row) {
  if (format == ImageFormat::kPng) return decode_png_rows(bytes, max_pixels, need, row);
  if (format == ImageFormat::kWebp) return decode_webp_rows(bytes, max_pixels, need, row);
  return invalid_argument("RgbDecoder decodes PNG and WebP only");
}

Status RgbDecoder::decode_png_rows(
    std::span<const std::byte> bytes, uint64_t max_pixels,
    const std::function<Result<RowRange>(int width, int height)>& need,
    const std::function<void(const uint8_t* rgb)>& row) {
  PngRead read{bytes};
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &read, on_png_error, on_png_warning);
  if (png == nullptr) return Status(ErrorCode::kInternal, "libpng: cannot create a reader");
  png_infop info = png_create_info_struct(png);
  struct Free {
    png_structp* png;
    png_infop* info;
    ~Free() { png_destroy_read_struct(png, info, nullptr); }
  } free_on_exit{&png, &info};
  if (info == nullptr) return Status(ErrorCode::kInternal, "libpng: cannot create an info struct");
  png_set_read_fn(png, &read, read_png_bytes);
  // Ancillary chunks (text, ICC profiles) are read up to 8 MiB, as Pillow allows.
  png_set_chunk_malloc_max(png, 8 << 20);

  png_uint_32 width = 0, height = 0;
  if (!PngSteps::header(png, info, &width, &height)) {
    return corrupt(std::string("PNG decode failed (header): ") + read.message);
  }
  if (uint64_t(width) * height > max_pixels) {
    return unsupported("PNG of " + std::to_string(width) + "x" + std::to_string(height) +
                       " pixels is over the limit of " + std::to_string(max_pixels) + " pixels");
  }
  const size_t row_bytes = png_get_rowbytes(png, info);
  if (row_bytes != size_t(width) * 3) {
    return Status(ErrorCode::kInternal, "libpng: rows of " + std::to_string(row_bytes) +
                                            " bytes after the RGB transforms, not " +
                                            std::to_string(size_t(width) * 3));
  }
  ZW_ASSIGN_OR_RETURN(const RowRange wanted, need(int(width), int(height)));
  if (png_get_interlace_type(png, info) == PNG_INTERLACE_NONE) {
    if (!PngSteps::some_rows(png, rgb_buffer(row_bytes), wanted.first, wanted.end, row)) {
      return corrupt(std::string("PNG decode failed (image data): ") + read.message);
    }
    return Status::ok();
  }
  uint8_t* rgb = rgb_buffer(row_bytes * height);
  rows_.resize(height);
  for (png_uint_32 y = 0; y < height; ++y) rows_[y] = rgb + y * row_bytes;
  if (!PngSteps::rows(png, rows_.data())) {
    return corrupt(std::string("PNG decode failed (image data): ") + read.message);
  }
  for (int y = wanted.first; y < wanted.end; ++y) row(rows_[size_t(y)]);
  return Status::ok();
}

Status RgbDecoder::decode_webp_rows(
    std::span<const std::byte> bytes, uint64_t max_pixels,
    const std::function<Result<RowRange>(int width, int height)>& need,
    const std::function<void(const uint8_t* rgb)>& row) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  WebPBitstreamFeatures features;
  const VP8StatusCode status = WebPGetFeatures(data, bytes.size(), &features);
  if (status == VP8_STATUS_NOT_ENOUGH_DATA) return corrupt("WebP decode failed: truncated header");
  if (status != VP8_STATUS_OK) {
    return corrupt("WebP decode failed (header): libwebp status " + std::to_string(status));
  }
  if (features.has_animation) {
    return unsupported("animated WebP: store the frame to train on as a still image");
  }
  const uint64_t width = uint64_t(features.width), height = uint64_t(features.height);
  if (width * height > max_pixels) {
    return unsupported("WebP of " + std::to_string(width) + "x" + std::to_string(height) +
                       " pixels is over the limit of " + std::to_string(max_pixels) + " pixels");
  }
  uint8_t* rgb = rgb_buffer(width * height * 3);
  if (WebPDecodeRGBInto(data, bytes.size(), rgb, width * height * 3, int(width * 3)) == nullptr) {
    return corrupt("WebP decode failed: the image data is truncated or damaged");
  }
  ZW_ASSIGN_OR_RETURN(const RowRange wanted, need(int(width), int(height)));
  for (int y = wanted.first; y < wanted.end; ++y) row(rgb + size_t(y) * width * 3);
  return Status::ok();
}

}  // namespace zerowait::internal
