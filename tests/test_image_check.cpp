// Image integrity checks: valid JPEG/PNG pass, truncated and damaged ones fail with a reason.
#include <gtest/gtest.h>
#include <png.h>
#include <zlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "shard/pack/image_check.hpp"
#include "testing/testing.hpp"

namespace zerowait::internal {
namespace {

using ::zerowait::testing::make_jpeg;
using ::zerowait::testing::random_bytes;

constexpr ImageCheck kBothModes[] = {ImageCheck::kHeader, ImageCheck::kDecode};

Status check(std::string_view field, const std::string& bytes, ImageCheck mode) {
  return check_image(field, std::as_bytes(std::span(bytes.data(), bytes.size())), mode);
}

// The offset just past the JPEG SOS segment: where entropy-coded data starts.
size_t scan_data_offset(const std::string& jpeg) {
  size_t pos = 2;
  while (pos + 4 <= jpeg.size()) {
    const auto marker = static_cast<uint8_t>(jpeg[pos + 1]);
    const size_t length = (size_t(uint8_t(jpeg[pos + 2])) << 8) | uint8_t(jpeg[pos + 3]);
    pos += 2 + length;
    if (marker == 0xDA) return pos;
  }
  ADD_FAILURE() << "no SOS in test JPEG";
  return 0;
}

enum class PngKind { kGray, kRgb, kRgba };

// A PNG through libpng's simplified write API, with seeded pixels.
std::string make_png(uint32_t width, uint32_t height, PngKind kind, uint64_t seed) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = width;
  image.height = height;
  image.format = kind == PngKind::kGray  ? PNG_FORMAT_GRAY
                 : kind == PngKind::kRgb ? PNG_FORMAT_RGB
                                         : PNG_FORMAT_RGBA;
  std::string pixels = random_bytes(PNG_IMAGE_SIZE(image), seed);
  // Smooth half the rows so the deflate stream has both literals and matches.
  for (size_t i = pixels.size() / 2; i < pixels.size(); ++i) pixels[i] = char(i / 7);
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0, nullptr)) {
    ADD_FAILURE() << "png size query failed: " << image.message;
    return {};
  }
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0, nullptr)) {
    ADD_FAILURE() << "png write failed: " << image.message;
    return {};
  }
  out.resize(size);
  return out;
}

std::string be32_bytes(uint32_t v) { return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)}; }

// A complete chunk (length, type, data, CRC); `bad_crc` flips the CRC.
std::string png_chunk(const std::string& type, const std::string& data, bool bad_crc = false) {
  std::string body = type + data;
  uint32_t crc = uint32_t(crc32(0, reinterpret_cast<const Bytef*>(body.data()), uInt(body.size())));
  if (bad_crc) crc ^= 1;
  return be32_bytes(uint32_t(data.size())) + body + be32_bytes(crc);
}

constexpr size_t kPngSignatureSize = 8;
constexpr size_t kIhdrChunkSize = 25;

// Offset of the first IDAT chunk's data.
size_t first_idat_data(const std::string& png) {
  size_t pos = png.find("IDAT");
  EXPECT_NE(pos, std::string::npos);
  return pos + 4;
}

// ---- field matching ---------------------------------------------------------------------------

TEST(ImageCheck, NonImageFieldsAlwaysPass) {
  const std::string garbage = random_bytes(1000, 7);
  for (ImageCheck mode : kBothModes) {
    for (const char* field : {"cls", "json", "txt", "jpgx", "png.txt", "", "npy"}) {
      EXPECT_TRUE(check(field, garbage, mode).is_ok()) << field;
      EXPECT_TRUE(check(field, "", mode).is_ok()) << field;
    }
  }
}

TEST(ImageCheck, ImageFieldsMatchCaseInsensitivelyAndByLastDottedPart) {
  const std::string garbage = random_bytes(1000, 8);
  for (const char* field : {"jpg", "JPG", "jpeg", "JpEg", "left.jpg", "a.b.jpeg"}) {
    Status s = check(field, garbage, ImageCheck::kHeader);
    EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << field;
    EXPECT_NE(s.message().find("missing start-of-image"), std::string::npos) << s.message();
  }
  for (const char* field : {"png", "PNG", "seg.png", "mask.Png"}) {
    Status s = check(field, garbage, ImageCheck::kHeader);
    EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << field;
    EXPECT_NE(s.message().find("not a PNG"), std::string::npos) << s.message();
  }
  // The right bytes under the wrong name are caught too.
  EXPECT_FALSE(check("png", make_jpeg(16, 16, 1), ImageCheck::kHeader).is_ok());
  EXPECT_FALSE(check("jpg", make_png(16, 16, PngKind::kRgb, 1), ImageCheck::kHeader).is_ok());
}

// ---- JPEG -------------------------------------------------------------------------------------

TEST(ImageCheckJpeg, ValidImagesPassBothModes) {
  int seed = 0;
  for (auto [w, h] : {std::pair{1, 1}, {8, 8}, {17, 9}, {64, 48}, {333, 211}}) {
    const std::string jpeg = make_jpeg(w, h, ++seed);
    for (ImageCheck mode : kBothModes) {
      Status s = check("jpg", jpeg, mode);
      EXPECT_TRUE(s.is_ok()) << w << "x" << h << ": " << s.to_string();
    }
  }
}

TEST(ImageCheckJpeg, TrailingPaddingAfterEndMarkerIsTolerated) {
  const std::string padded = make_jpeg(32, 32, 3) + std::string(100, '\0') + "\xFF\xFF";
  for (ImageCheck mode : kBothModes) EXPECT_TRUE(check("jpeg", padded, mode).is_ok());
}

TEST(ImageCheckJpeg, EveryTruncationFailsHeaderMode) {
  const std::string jpeg = make_jpeg(48, 40, 4);
  const size_t scan_start = scan_data_offset(jpeg);
  ASSERT_GT(jpeg.size(), scan_start + 100);
  for (size_t len = 0; len < jpeg.size(); ++len) {
    Status s = check("jpg", jpeg.substr(0, len), ImageCheck::kHeader);
    ASSERT_EQ(s.code(), ErrorCode::kCorrupt) << "truncated to " << len << " of " << jpeg.size();
    if (len > scan_start) {
      EXPECT_NE(s.message().find("truncated: no JPEG end-of-image marker after scan data"),
                std::string::npos)
          << s.message();
    }
  }
}

TEST(ImageCheckJpeg, TruncationsFailDecodeMode) {
  const std::string jpeg = make_jpeg(48, 40, 5);
  for (size_t len = 0; len < jpeg.size(); len += 97) {
    EXPECT_FALSE(check("jpg", jpeg.substr(0, len), ImageCheck::kDecode).is_ok()) << len;
  }
}

TEST(ImageCheckJpeg, ReasonsNameWhatIsWrong) {
  const std::string jpeg = make_jpeg(32, 32, 6);
  // Cut inside the segment after SOI: its length runs past the end.
  Status s = check("jpg", jpeg.substr(0, 10), ImageCheck::kHeader);
  EXPECT_NE(s.message().find("length 16 at offset 2 runs past end of file (size 10)"),
            std::string::npos)
      << s.message();

  std::string no_soi = jpeg;
  no_soi[1] = 0x00;
  s = check("jpg", no_soi, ImageCheck::kHeader);
  EXPECT_EQ(s.message(), "not a JPEG: missing start-of-image marker (FF D8)");

  std::string zero_length = jpeg;
  zero_length[4] = 0;
  zero_length[5] = 1;
  s = check("jpg", zero_length, ImageCheck::kHeader);
  EXPECT_NE(s.message().find("invalid segment length 1 at offset 2"), std::string::npos)
      << s.message();

  std::string not_a_marker = jpeg;
  not_a_marker[2] = 0x12;
  s = check("jpg", not_a_marker, ImageCheck::kHeader);
  EXPECT_NE(s.message().find("expected a JPEG marker at offset 2, found 0x12"), std::string::npos)
      << s.message();

  s = check("jpg", std::string("\xFF\xD8\xFF\xD9", 4), ImageCheck::kHeader);
  EXPECT_NE(s.message().find("before any start-of-scan"), std::string::npos) << s.message();
}

TEST(ImageCheckJpeg, DamageInsideScanDataFailsDecodeOnly) {
  const std::string jpeg = make_jpeg(96, 64, 7);
  const size_t scan_start = scan_data_offset(jpeg);
  const size_t middle = scan_start + (jpeg.size() - scan_start) / 2;

  // A chunk of entropy-coded data lost (a bad copy, a sector of zeros written elsewhere).
  std::string cut = jpeg;
  cut.erase(middle, 200);
  // A run of bytes overwritten with a marker-like pattern.
  std::string overwritten = jpeg;
  std::memset(overwritten.data() + middle, 0xFF, 64);
  // A run of bytes replaced with zeros (unwritten blocks).
  std::string zeroed = jpeg;
  std::memset(zeroed.data() + middle, 0x00, 512);

  for (const std::string* damaged : {&cut, &overwritten, &zeroed}) {
    EXPECT_TRUE(check("jpg", *damaged, ImageCheck::kHeader).is_ok());
    Status s = check("jpg", *damaged, ImageCheck::kDecode);
    EXPECT_EQ(s.code(), ErrorCode::kCorrupt);
    EXPECT_NE(s.message().find("JPEG decode failed"), std::string::npos) << s.message();
  }
}

// ---- PNG --------------------------------------------------------------------------------------

TEST(ImageCheckPng, ValidImagesPassBothModes) {
  int seed = 0;
  for (PngKind kind : {PngKind::kGray, PngKind::kRgb, PngKind::kRgba}) {
    for (auto [w, h] : {std::pair{1u, 1u}, {13u, 7u}, {120u, 90u}}) {
      const std::string png = make_png(w, h, kind, ++seed);
      for (ImageCheck mode : kBothModes) {
        Status s = check("png", png, mode);
        EXPECT_TRUE(s.is_ok()) << w << "x" << h << ": " << s.to_string();
      }
    }
  }
}

TEST(ImageCheckPng, EveryTruncationFailsBothModes) {
  const std::string png = make_png(40, 30, PngKind::kRgb, 9);
  for (size_t len = 0; len < png.size(); ++len) {
    Status s = check("png", png.substr(0, len), ImageCheck::kHeader);
    ASSERT_EQ(s.code(), ErrorCode::kCorrupt) << "truncated to " << len << " of " << png.size();
    if (len % 61 == 0) {
      EXPECT_FALSE(check("png", png.substr(0, len), ImageCheck::kDecode).is_ok()) << len;
    }
  }
  Status s = check("png", png.substr(0, png.size() - 12), ImageCheck::kHeader);
  EXPECT_NE(s.message().find("truncated: no PNG end chunk (IEND)"), std::string::npos)
      << s.message();
  s = check("png", png.substr(0, 100), ImageCheck::kHeader);
  EXPECT_NE(s.message().find("chunk 'IDAT' length"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("runs past end of file (size 100)"), std::string::npos) << s.message();
}

TEST(ImageCheckPng, StructureErrorsAreNamed) {
  const std::string png = make_png(8, 8, PngKind::kGray, 10);
  const std::string signature = png.substr(0, kPngSignatureSize);
  const std::string after_ihdr = png.substr(kPngSignatureSize + kIhdrChunkSize);

  Status s = check("png", signature + png_chunk("tEXt", "a\0b") + png.substr(kPngSignatureSize),
                   ImageCheck::kHeader);
  EXPECT_NE(s.message().find("first PNG chunk is 'tEXt', not IHDR"), std::string::npos)
      << s.message();

  s = check("png",
            signature + png.substr(kPngSignatureSize, kIhdrChunkSize) + png_chunk("IEND", ""),
            ImageCheck::kHeader);
  EXPECT_NE(s.message().find("no image data"), std::string::npos) << s.message();

  std::string bad_type = png;
  bad_type[kPngSignatureSize + kIhdrChunkSize + 5] = '#';
  s = check("png", bad_type, ImageCheck::kHeader);
  EXPECT_NE(s.message().find("invalid PNG chunk type at offset"), std::string::npos) << s.message();
}

TEST(ImageCheckPng, DamagedImageDataFailsDecodeOnly) {
  const std::string png = make_png(64, 64, PngKind::kRgb, 11);
  std::string flipped = png;
  flipped[first_idat_data(png) + 40] ^= 0x5A;
  EXPECT_TRUE(check("png", flipped, ImageCheck::kHeader).is_ok());
  Status s = check("png", flipped, ImageCheck::kDecode);
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt);
  EXPECT_NE(s.message().find("PNG decode failed"), std::string::npos) << s.message();
}

TEST(ImageCheckPng, AncillaryChunkWithBadCrcFailsDecode) {
  const std::string png = make_png(16, 16, PngKind::kRgba, 12);
  const std::string head = png.substr(0, kPngSignatureSize + kIhdrChunkSize);
  const std::string tail = png.substr(kPngSignatureSize + kIhdrChunkSize);
  const std::string text("Comment\0hello", 13);

  const std::string good = head + png_chunk("tEXt", text) + tail;
  for (ImageCheck mode : kBothModes) EXPECT_TRUE(check("png", good, mode).is_ok());

  // libpng only warns about a bad CRC on an ancillary chunk; the check must not.
  const std::string bad = head + png_chunk("tEXt", text, /*bad_crc=*/true) + tail;
  EXPECT_TRUE(check("png", bad, ImageCheck::kHeader).is_ok());
  Status s = check("png", bad, ImageCheck::kDecode);
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
}

}  // namespace
}  // namespace zerowait::internal
