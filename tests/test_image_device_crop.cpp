// ImageDecoder::prepare_for_device: what the loader hands the GPU decode stage per image. A
// colour JPEG comes back undecoded with its header size and decode()'s crop; every image the GPU
// decoder would not decode as libjpeg does comes back decoded here, exactly as decode() gives it;
// errors are decode()'s.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "testing/testing.hpp"
#include "zerowait/loader/image_transform.hpp"

namespace zerowait {
namespace {

using Bytes = std::vector<std::byte>;

// A grayscale JPEG: one component, which the GPU stage leaves to libjpeg.
Bytes gray_jpeg(int width, int height) {
  std::vector<uint8_t> gray(size_t(width) * height);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = uint8_t(i * 7 % 251);
  tjhandle handle = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(handle, gray.data(), width, 0, height, TJPF_GRAY, &jpeg, &size, TJSAMP_GRAY,
                        90, 0),
            0);
  Bytes out(size);
  std::memcpy(out.data(), jpeg, size);
  tjFree(jpeg);
  tjDestroy(handle);
  return out;
}

struct Prepared {
  Result<DeviceCrop> crop;
  std::vector<uint8_t> pixels;
};

constexpr uint8_t kUntouched = 0xAB;

Prepared prepare(const Bytes& bytes, const ImageTransform& t, uint64_t seed) {
  ImageDecoder decoder;
  std::vector<uint8_t> pixels(size_t(t.size) * t.size * 3, kUntouched);
  Result<DeviceCrop> crop = decoder.prepare_for_device(bytes, t, seed, pixels);
  return {std::move(crop), std::move(pixels)};
}

TEST(PrepareForDevice, AColourJpegComesBackUndecodedWithDecodesCrop) {
  const Bytes jpeg = testing::to_bytes(testing::make_jpeg(500, 375, 3));
  const ImageTransform t{.size = 64, .random_flip = true};
  bool flipped = false, unflipped = false;
  for (uint64_t seed = 0; seed < 16; ++seed) {
    const Prepared p = prepare(jpeg, t, seed);
    ASSERT_TRUE(p.crop.is_ok()) << p.crop.status().to_string();
    EXPECT_FALSE(p.crop->decoded);
    EXPECT_EQ(p.crop->width, 500);
    EXPECT_EQ(p.crop->height, 375);
    const CropBox box = random_resized_crop_box(500, 375, t, seed);
    EXPECT_EQ(p.crop->area.x0, box.x);
    EXPECT_EQ(p.crop->area.y0, box.y);
    EXPECT_EQ(p.crop->area.x1, box.x + box.width);
    EXPECT_EQ(p.crop->area.y1, box.y + box.height);
    EXPECT_EQ(p.crop->area.flip, box.flip);
    (box.flip ? flipped : unflipped) = true;
    for (uint8_t v : p.pixels) ASSERT_EQ(v, kUntouched);  // nothing decoded
  }
  EXPECT_TRUE(flipped && unflipped);
}

TEST(PrepareForDevice, CentreCropAreaIsTheResizedCentreMappedBack) {
  const Bytes jpeg = testing::to_bytes(testing::make_jpeg(500, 375, 4));
  const ImageTransform t{.mode = ImageTransform::Mode::kResizeCenterCrop, .size = 224};
  const Prepared p = prepare(jpeg, t, 0);
  ASSERT_TRUE(p.crop.is_ok()) << p.crop.status().to_string();
  // Resize(256): 375 -> 256, 500 -> int(256 * 500 / 375) = 341; CenterCrop(224) from (58, 16).
  EXPECT_DOUBLE_EQ(p.crop->area.x0, 58 * 500.0 / 341);
  EXPECT_DOUBLE_EQ(p.crop->area.y0, 16 * 375.0 / 256);
  EXPECT_DOUBLE_EQ(p.crop->area.x1, (58 + 224) * 500.0 / 341);
  EXPECT_DOUBLE_EQ(p.crop->area.y1, (16 + 224) * 375.0 / 256);
  const CropArea area = crop_area(500, 375, t, 0);
  EXPECT_EQ(area.x0, p.crop->area.x0);
  EXPECT_EQ(area.y1, p.crop->area.y1);
}

TEST(PrepareForDevice, GrayscaleIsDecodedHereExactlyAsDecodeDoes) {
  const Bytes jpeg = gray_jpeg(320, 240);
  const ImageTransform t{.size = 48, .random_flip = true};
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const Prepared p = prepare(jpeg, t, seed);
    ASSERT_TRUE(p.crop.is_ok()) << p.crop.status().to_string();
    EXPECT_TRUE(p.crop->decoded);
    EXPECT_EQ(p.crop->width, 320);
    ImageDecoder decoder;
    std::vector<uint8_t> expected(p.pixels.size());
    ASSERT_TRUE(decoder.decode(jpeg, t, seed, expected).is_ok());
    EXPECT_EQ(p.pixels, expected);
  }
}

// Without its EOI marker a JPEG goes to libjpeg, which decides: here the crop needs rows the
// data no longer has, and the error is decode()'s.
TEST(PrepareForDevice, ATruncatedJpegGetsDecodesVerdict) {
  const Bytes jpeg = testing::to_bytes(testing::make_jpeg(256, 256, 5));
  const Bytes cut(jpeg.begin(), jpeg.begin() + long(jpeg.size() / 3));
  const ImageTransform t{.mode = ImageTransform::Mode::kResizeCenterCrop, .size = 200};
  const Prepared p = prepare(cut, t, 0);
  ASSERT_FALSE(p.crop.is_ok());
  EXPECT_EQ(p.crop.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(p.crop.status().message().find("truncated"), std::string::npos)
      << p.crop.status().message();
}

TEST(PrepareForDevice, GarbageAndBadHeadersAreCorrupt) {
  const ImageTransform t{.size = 32};
  const Prepared garbage = prepare(testing::to_bytes(testing::random_bytes(3000, 1)), t, 0);
  ASSERT_FALSE(garbage.crop.is_ok());
  EXPECT_EQ(garbage.crop.status().code(), ErrorCode::kCorrupt);
  // A JPEG cut inside its header: SOI and the first bytes of the next segment.
  const Bytes jpeg = testing::to_bytes(testing::make_jpeg(64, 64, 6));
  const Prepared header = prepare(Bytes(jpeg.begin(), jpeg.begin() + 30), t, 0);
  ASSERT_FALSE(header.crop.is_ok());
  EXPECT_EQ(header.crop.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(header.crop.status().message().find("header"), std::string::npos)
      << header.crop.status().message();
}

TEST(PrepareForDevice, AWrongPixelBufferIsInvalidArgumentOnlyWhenDecodingHere) {
  ImageDecoder decoder;
  const ImageTransform t{.size = 32};
  std::vector<uint8_t> small(10);
  const Bytes colour = testing::to_bytes(testing::make_jpeg(64, 64, 7));
  EXPECT_TRUE(decoder.prepare_for_device(colour, t, 0, small).is_ok());
  const Result<DeviceCrop> gray = decoder.prepare_for_device(gray_jpeg(64, 64), t, 0, small);
  ASSERT_FALSE(gray.is_ok());
  EXPECT_EQ(gray.status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zerowait
