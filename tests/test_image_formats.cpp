// PNG and WebP through the image transforms: decoded whole, then cropped and resampled exactly as
// the reference resample of the same pixels (what PIL + torchvision compute); palettes, grey and
// alpha as Pillow's convert("RGB"); damaged, truncated and oversized files fail cleanly.
#include <gtest/gtest.h>
#include <png.h>
#include <sys/resource.h>
#include <webp/encode.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "loader/decode/image/resample.hpp"
#include "testing/testing.hpp"
#include "zerowait/loader/image_transform.hpp"

namespace zerowait {
namespace {

using Bytes = std::vector<std::byte>;
using Mode = ImageTransform::Mode;

// A picture with detail in both directions, so crops and flips show.
std::vector<uint8_t> picture(int width, int height) {
  std::vector<uint8_t> rgb(size_t(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &rgb[(size_t(y) * width + x) * 3];
      p[0] = uint8_t(x * 255 / width);
      p[1] = uint8_t(y * 255 / height);
      p[2] = uint8_t((x * 7 + y * 13) % 256);
    }
  }
  return rgb;
}

Bytes to_bytes(const void* data, size_t size) {
  Bytes out(size);
  std::memcpy(out.data(), data, size);
  return out;
}

// Writes `pixels` (channels per `format`: PNG_FORMAT_RGB, _RGBA, _GRAY...) with libpng's
// simplified API.
Bytes png(const std::vector<uint8_t>& pixels, int width, int height, uint32_t format) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = uint32_t(width);
  image.height = uint32_t(height);
  image.format = format;
  png_alloc_size_t size = 0;
  EXPECT_TRUE(png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr));
  Bytes out(size);
  EXPECT_TRUE(png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr));
  out.resize(size);
  return out;
}

Bytes webp(const std::vector<uint8_t>& rgb, int width, int height, bool lossless) {
  uint8_t* encoded = nullptr;
  const size_t size = lossless
                          ? WebPEncodeLosslessRGB(rgb.data(), width, height, width * 3, &encoded)
                          : WebPEncodeRGB(rgb.data(), width, height, width * 3, 90, &encoded);
  EXPECT_GT(size, 0u);
  Bytes out = to_bytes(encoded, size);
  WebPFree(encoded);
  return out;
}

std::vector<uint8_t> decode_ok(ImageDecoder& decoder, const Bytes& bytes, const ImageTransform& t,
                               uint64_t seed) {
  std::vector<uint8_t> out(size_t(t.size) * t.size * 3);
  const Status s = decoder.decode(bytes, t, seed, out);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

// What PIL + torchvision compute from the decoded pixels: the crop, then one resample.
std::vector<uint8_t> reference(const std::vector<uint8_t>& rgb, int width, int height,
                               const ImageTransform& t, uint64_t seed) {
  std::vector<uint8_t> out(size_t(t.size) * t.size * 3);
  const CropBox c = random_resized_crop_box(width, height, t, seed);
  internal::resample_rgb(&rgb[(size_t(c.y) * width + c.x) * 3], c.width, c.height,
                         size_t(width) * 3, {0, 0, double(c.width), double(c.height)}, t.size,
                         t.size, c.flip, out);
  return out;
}

TEST(ImageFormats, PngAndLosslessWebpGiveTheReferenceCropOfTheirPixels) {
  const int w = 300, h = 200;
  const std::vector<uint8_t> rgb = picture(w, h);
  const Bytes as_png = png(rgb, w, h, PNG_FORMAT_RGB);
  const Bytes as_webp = webp(rgb, w, h, /*lossless=*/true);
  ImageDecoder decoder;
  const ImageTransform t{.size = 64, .random_flip = true};
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const std::vector<uint8_t> expected = reference(rgb, w, h, t, seed);
    EXPECT_EQ(decode_ok(decoder, as_png, t, seed), expected) << "seed " << seed;
    EXPECT_EQ(decode_ok(decoder, as_webp, t, seed), expected) << "seed " << seed;
  }
  // Resize + CenterCrop resamples the centre box of the whole image.
  const ImageTransform centre{.mode = Mode::kResizeCenterCrop, .size = 64};
  const std::vector<uint8_t> from_png = decode_ok(decoder, as_png, centre, 0);
  EXPECT_EQ(decode_ok(decoder, as_webp, centre, 0), from_png);
  // A lossy WebP of the same picture is close to it.
  const std::vector<uint8_t> lossy = decode_ok(decoder, webp(rgb, w, h, false), centre, 0);
  double diff = 0;
  for (size_t i = 0; i < lossy.size(); ++i) diff += std::abs(int(lossy[i]) - int(from_png[i]));
  EXPECT_LT(diff / double(lossy.size()), 6.0);
}

TEST(ImageFormats, GreyPaletteAndAlphaPngsComeOutAsPillowsRgb) {
  const int w = 120, h = 90;
  const std::vector<uint8_t> rgb = picture(w, h);
  const ImageTransform t{.size = 32};
  ImageDecoder decoder;

  // RGBA: the alpha channel is dropped, not composited.
  std::vector<uint8_t> rgba;
  for (size_t i = 0; i < rgb.size(); i += 3) {
    rgba.insert(rgba.end(), {rgb[i], rgb[i + 1], rgb[i + 2], uint8_t(i % 251)});
  }
  EXPECT_EQ(decode_ok(decoder, png(rgba, w, h, PNG_FORMAT_RGBA), t, 1), reference(rgb, w, h, t, 1));

  // Grey: three equal channels.
  std::vector<uint8_t> grey(size_t(w) * h);
  std::vector<uint8_t> grey_rgb;
  for (size_t i = 0; i < grey.size(); ++i) {
    grey[i] = rgb[i * 3];
    grey_rgb.insert(grey_rgb.end(), {grey[i], grey[i], grey[i]});
  }
  EXPECT_EQ(decode_ok(decoder, png(grey, w, h, PNG_FORMAT_GRAY), t, 2),
            reference(grey_rgb, w, h, t, 2));

  // A palette image (colour-mapped, with transparency in its palette) expands to its colours.
  std::vector<uint8_t> few = rgba;
  for (size_t i = 0; i < few.size(); i += 4) {
    few[i] &= 0xc0, few[i + 1] &= 0xc0, few[i + 2] &= 0x80, few[i + 3] = i % 8 ? 255 : 0;
  }
  std::vector<uint8_t> few_rgb;
  for (size_t i = 0; i < few.size(); i += 4) {
    few_rgb.insert(few_rgb.end(), {few[i], few[i + 1], few[i + 2]});
  }
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = uint32_t(w);
  image.height = uint32_t(h);
  image.format = PNG_FORMAT_RGBA | PNG_FORMAT_FLAG_COLORMAP;
  image.colormap_entries = 256;
  std::vector<uint8_t> indices(size_t(w) * h), colormap(256 * 4);
  int used = 0;
  for (size_t p = 0; p < indices.size(); ++p) {
    int found = -1;
    for (int c = 0; c < used && found < 0; ++c) {
      if (std::memcmp(&colormap[size_t(c) * 4], &few[p * 4], 4) == 0) found = c;
    }
    if (found < 0) {
      ASSERT_LT(used, 256);
      std::memcpy(&colormap[size_t(used) * 4], &few[p * 4], 4);
      found = used++;
    }
    indices[p] = uint8_t(found);
  }
  image.colormap_entries = uint32_t(used);
  png_alloc_size_t size = 0;
  ASSERT_TRUE(png_image_write_to_memory(&image, nullptr, &size, 0, indices.data(), 0,
                                        colormap.data()));
  Bytes palette(size);
  ASSERT_TRUE(png_image_write_to_memory(&image, palette.data(), &size, 0, indices.data(), 0,
                                        colormap.data()));
  palette.resize(size);
  EXPECT_EQ(decode_ok(decoder, palette, t, 3), reference(few_rgb, w, h, t, 3));
}

TEST(ImageFormats, DamagedTruncatedAndOversizedFilesFailCleanly) {
  const int w = 160, h = 120;
  const std::vector<uint8_t> rgb = picture(w, h);
  // The whole image (its 4:3 ratio at scale 1): every row is needed.
  const ImageTransform t{
      .size = 48, .scale_min = 1, .scale_max = 1, .ratio_min = 4.0 / 3, .ratio_max = 4.0 / 3};
  ImageDecoder decoder;
  std::vector<uint8_t> out(48 * 48 * 3);
  for (const Bytes& image : {png(rgb, w, h, PNG_FORMAT_RGB), webp(rgb, w, h, true),
                             webp(rgb, w, h, false)}) {
    const bool is_png = image[1] == std::byte('P');
    // Cut short anywhere past the signature: corrupt, naming the format.
    for (size_t n = 12; n < image.size(); n += std::max<size_t>(1, image.size() / 40)) {
      const Bytes cut(image.begin(), image.begin() + long(n));
      const Status s = decoder.decode(cut, t, n, out);
      EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << n << ": " << s.to_string();
      EXPECT_NE(s.message().find(is_png ? "PNG" : "WebP"), std::string::npos) << s.message();
    }
    // Bytes overwritten with noise: decoded or refused, never a crash.
    const std::string noise = testing::random_bytes(image.size(), 3);
    for (size_t at = 16; at + 8 < image.size(); at += 37) {
      Bytes damaged = image;
      for (size_t i = 0; i < 8; ++i) damaged[at + i] = std::byte(noise[at + i]);
      const Status s = decoder.decode(damaged, t, at, out);
      EXPECT_TRUE(s.is_ok() || s.code() == ErrorCode::kCorrupt ||
                  s.code() == ErrorCode::kUnsupported)
          << s.to_string();
    }
  }
  // A PNG header that claims 60000 x 60000 pixels is refused before decoding.
  Bytes huge = png(rgb, w, h, PNG_FORMAT_RGB);
  const uint8_t big[8] = {0, 0, 0xea, 0x60, 0, 0, 0xea, 0x60};  // IHDR width, height
  std::memcpy(huge.data() + 16, big, 8);
  const uint32_t crc = uint32_t(crc32(0, reinterpret_cast<const Bytef*>(huge.data() + 12), 17));
  const uint8_t crc_bytes[4] = {uint8_t(crc >> 24), uint8_t(crc >> 16), uint8_t(crc >> 8),
                                uint8_t(crc)};
  std::memcpy(huge.data() + 29, crc_bytes, 4);
  const Status s = decoder.decode(huge, t, 0, out);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find("60000x60000"), std::string::npos) << s.message();
  // And the decoder goes on decoding.
  EXPECT_EQ(decode_ok(decoder, png(rgb, w, h, PNG_FORMAT_RGB), t, 5), reference(rgb, w, h, t, 5));
}

// A WebP of 154 bytes whose header claims 10,751 x 10,094 pixels (under the limit; found by
// fuzz_image) is corrupt, and costs the decoder only what it decodes: the 325 MB buffer such an
// image needs is not touched before the data turns out short (it was zeroed first: 1.8 s and
// 700 MB of resident memory for 154 bytes).
TEST(ImageFormats, AWebpClaimingFarMorePixelsThanItsBytesHoldTouchesNoBufferForThem) {
  const uint8_t claimed[] = {
      0x52, 0x49, 0x46, 0x46, 0x7c, 0x00, 0x00, 0x00, 0x57, 0x45, 0x42, 0x50, 0x56, 0x50, 0x38,
      0x20, 0x70, 0x00, 0x00, 0x00, 0x50, 0x02, 0x00, 0x9d, 0x01, 0x2a, 0xff, 0xe9, 0x6e, 0xe7,
      0xd6, 0xb2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0xff, 0xff, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0xff, 0x40, 0xe2, 0x25, 0xb0, 0x02, 0x74, 0x30, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf8,
      0xfe, 0x67, 0x15, 0xe1, 0x5f, 0xb3, 0xd1, 0xab, 0xe2, 0x01, 0x6c, 0xd1, 0xa1, 0x55, 0xfa,
      0xa4, 0xb6, 0x9b, 0x64, 0xfe, 0x13, 0x80, 0xff, 0x92, 0xc1, 0xec, 0xb7, 0x0d, 0xe2, 0x2d,
      0xeb, 0x0d, 0x00, 0xa0, 0x61, 0x00, 0x00, 0x60, 0x02, 0xb9, 0xd6, 0x3a, 0x0f, 0x48, 0x00,
      0xe2, 0xfe, 0x13, 0x80, 0xff, 0x92, 0xc1, 0xec, 0xb7, 0x0d, 0xe2, 0x2d, 0xb2, 0x89, 0x44,
      0x54, 0xbf, 0x55, 0x02};
  const ImageTransform t{.size = 48};
  ImageDecoder decoder;
  std::vector<uint8_t> out(48 * 48 * 3);
  const Status s = decoder.decode(to_bytes(claimed, sizeof claimed), t, 0, out);
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  EXPECT_NE(s.message().find("WebP"), std::string::npos) << s.message();
  rusage usage{};
  ASSERT_EQ(getrusage(RUSAGE_SELF, &usage), 0);
  EXPECT_LT(usage.ru_maxrss, 256L << 10) << "KiB resident at most: the claimed pixels' buffer "
                                            "was touched";
}

// A PNG is read no further than the last row the crop needs: cut short after it, it still
// decodes for that crop, and for one that needs the missing rows it is corrupt.
TEST(ImageFormats, APngCutShortAfterTheRowsACropNeedsStillDecodesForIt) {
  const int w = 200, h = 600;
  std::vector<uint8_t> noise(size_t(w) * h * 3);
  const std::string random = testing::random_bytes(noise.size(), 11);
  std::memcpy(noise.data(), random.data(), noise.size());  // incompressible: IDAT ~ the rows
  const Bytes whole = png(noise, w, h, PNG_FORMAT_RGB);
  const Bytes cut(whole.begin(), whole.begin() + long(whole.size() * 8 / 10));
  ImageDecoder decoder;
  // Resize + CenterCrop of a tall image shows rows 200..400 of 600.
  const ImageTransform centre{.mode = Mode::kResizeCenterCrop, .size = 32};
  EXPECT_EQ(decode_ok(decoder, cut, centre, 0), decode_ok(decoder, whole, centre, 0));
  const ImageTransform all{
      .size = 32, .scale_min = 1, .scale_max = 1, .ratio_min = 1.0 / 3, .ratio_max = 1.0 / 3};
  std::vector<uint8_t> out(32 * 32 * 3);
  const Status s = decoder.decode(cut, all, 0, out);
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace zerowait
