#include "shard/pack/image_check.hpp"

#include <png.h>
#include <turbojpeg.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/text.hpp"

namespace zerowait::internal {
namespace {

enum class ImageType { kNone, kJpeg, kPng };

// A decode of more than this many output bytes is refused instead of attempted: one check must
// not be able to take gigabytes from a pack running many checks at once.
constexpr uint64_t kMaxDecodeBytes = 1ull << 30;

bool equals_lower(std::string_view a, std::string_view lower) { return ascii_lower(a) == lower; }

ImageType image_type(std::string_view field) {
  size_t dot = field.rfind('.');
  std::string_view ext = dot == std::string_view::npos ? field : field.substr(dot + 1);
  if (equals_lower(ext, "jpg") || equals_lower(ext, "jpeg")) return ImageType::kJpeg;
  if (equals_lower(ext, "png")) return ImageType::kPng;
  return ImageType::kNone;
}

uint8_t byte_at(std::span<const std::byte> b, size_t i) { return static_cast<uint8_t>(b[i]); }
uint32_t be16(std::span<const std::byte> b, size_t i) {
  return (uint32_t{byte_at(b, i)} << 8) | byte_at(b, i + 1);
}
uint32_t be32(std::span<const std::byte> b, size_t i) {
  return (be16(b, i) << 16) | be16(b, i + 2);
}

std::string hex_byte(uint8_t v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", v);
  return buf;
}

// "FF D8": how the JPEG spec and hex dumps write a marker.
std::string marker_name(uint8_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "FF %02X", m);
  return buf;
}

// ---- JPEG -------------------------------------------------------------------------------------

// Markers that stand alone, without a length field: TEM and RST0..RST7.
bool is_standalone_marker(uint8_t m) { return m == 0x01 || (m >= 0xD0 && m <= 0xD7); }

// SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC).
bool is_frame_marker(uint8_t m) {
  return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

// Walks the marker segments from SOI to the first SOS, checking that every length stays inside
// the file, then looks for EOI after the scan. Searching backwards from the end is enough: in
// entropy-coded data an FF is always followed by 00 or RSTn, so an FF D9 there can only be EOI,
// and bytes after EOI (padding some writers append) are tolerated.
Status check_jpeg_structure(std::span<const std::byte> b) {
  const size_t size = b.size();
  if (size < 2 || byte_at(b, 0) != 0xFF || byte_at(b, 1) != 0xD8) {
    return corrupt("not a JPEG: missing start-of-image marker (FF D8)");
  }
  bool frame_seen = false;
  size_t pos = 2;
  while (true) {
    if (pos >= size) {
      return corrupt("truncated: file ends at offset " + std::to_string(size) +
                     " before any start-of-scan marker");
    }
    if (byte_at(b, pos) != 0xFF) {
      return corrupt("expected a JPEG marker at offset " + std::to_string(pos) + ", found " +
                     hex_byte(byte_at(b, pos)));
    }
    const size_t marker_offset = pos;
    while (pos < size && byte_at(b, pos) == 0xFF) ++pos;  // FF fill bytes may precede a marker
    if (pos >= size) {
      return corrupt("truncated: file ends inside the marker at offset " +
                     std::to_string(marker_offset));
    }
    const uint8_t marker = byte_at(b, pos++);
    if (is_standalone_marker(marker)) continue;
    if (marker == 0xD9) {
      return corrupt("no image data: end-of-image marker at offset " +
                     std::to_string(marker_offset) + " before any start-of-scan");
    }
    if (marker == 0xD8 || marker == 0x00) {
      return corrupt("unexpected marker " + marker_name(marker) + " at offset " +
                     std::to_string(marker_offset));
    }
    if (pos + 2 > size) {
      return corrupt("truncated: length of segment " + marker_name(marker) + " at offset " +
                     std::to_string(marker_offset) + " runs past end of file (size " +
                     std::to_string(size) + ")");
    }
    const uint32_t length = be16(b, pos);  // counts itself, not the marker
    if (length < 2) {
      return corrupt("invalid segment length " + std::to_string(length) + " at offset " +
                     std::to_string(marker_offset));
    }
    if (pos + length > size) {
      return corrupt("segment " + marker_name(marker) + " length " + std::to_string(length) +
                     " at offset " + std::to_string(marker_offset) +
                     " runs past end of file (size " + std::to_string(size) + ")");
    }
    pos += length;
    if (is_frame_marker(marker)) frame_seen = true;
    if (marker == 0xDA) break;  // SOS: entropy-coded data follows
  }
  if (!frame_seen) return corrupt("no frame header (SOF) before the start-of-scan marker");

  const size_t scan_start = pos;
  for (size_t i = size; i >= scan_start + 2; --i) {
    if (byte_at(b, i - 2) == 0xFF && byte_at(b, i - 1) == 0xD9) return Status::ok();
  }
  return corrupt("truncated: no JPEG end-of-image marker after scan data (scan data starts at " +
                 std::to_string(scan_start) + ", file size " + std::to_string(size) + ")");
}

struct TjDeleter {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

Status tj_failure(tjhandle handle, const char* what) {
  // A warning ("Premature end of JPEG file", "Corrupt JPEG data: ...") means libjpeg-turbo
  // papered over damage; for an integrity check it is corruption like any error.
  std::string kind = tjGetErrorCode(handle) == TJERR_WARNING ? "warning" : "error";
  return corrupt(std::string("JPEG decode failed (") + what + ", libjpeg-turbo " + kind +
                 "): " + tjGetErrorStr2(handle));
}

Status decode_jpeg(std::span<const std::byte> b) {
  TjHandle handle(tjInitDecompress());
  if (!handle) return Status(ErrorCode::kInternal, "tjInitDecompress failed");
  const auto* data = reinterpret_cast<const unsigned char*>(b.data());
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(handle.get(), data, b.size(), &width, &height, &subsamp, &colorspace) !=
      0) {
    return tj_failure(handle.get(), "header");
  }
  // Decoding at 1/8 scale still entropy-decodes every coefficient of every scan, which is where
  // damage shows up; only the inverse DCT shrinks, so the check costs a fraction of a full decode.
  const tjscalingfactor eighth{1, 8};
  const int out_width = TJSCALED(width, eighth);
  const int out_height = TJSCALED(height, eighth);
  const int pixel_format = colorspace == TJCS_GRAY                              ? TJPF_GRAY
                           : colorspace == TJCS_CMYK || colorspace == TJCS_YCCK ? TJPF_CMYK
                                                                                : TJPF_RGB;
  const uint64_t pitch = uint64_t(out_width) * tjPixelSize[pixel_format];
  if (pitch * out_height > kMaxDecodeBytes) {
    return unsupported("JPEG of " + std::to_string(width) + "x" + std::to_string(height) +
                       " is too large to check by decoding");
  }
  std::vector<unsigned char> pixels(pitch * out_height);
  int flags = TJFLAG_STOPONWARNING;
#ifdef TJFLAG_LIMITSCANS
  flags |= TJFLAG_LIMITSCANS;  // a progressive JPEG with thousands of scans is an attack, not data
#endif
  if (tjDecompress2(handle.get(), data, b.size(), pixels.data(), out_width, int(pitch), out_height,
                    pixel_format, flags) != 0) {
    return tj_failure(handle.get(), "scan data");
  }
  return Status::ok();
}

// ---- PNG --------------------------------------------------------------------------------------

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
constexpr size_t kChunkOverhead = 12;  // length, type, CRC
constexpr uint32_t kPngMaxLength = 0x7FFFFFFFu;

bool is_chunk_letter(uint8_t c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

// Walks the chunks from the signature to IEND, checking every length against the file size.
// CRCs are left to the decode mode: checking them means reading every byte.
Status check_png_structure(std::span<const std::byte> b) {
  const size_t size = b.size();
  if (size < sizeof kPngSignature) return corrupt("not a PNG: missing signature");
  for (size_t i = 0; i < sizeof kPngSignature; ++i) {
    if (byte_at(b, i) != kPngSignature[i]) return corrupt("not a PNG: missing signature");
  }
  size_t pos = sizeof kPngSignature;
  bool idat_seen = false;
  for (uint64_t chunk = 0;; ++chunk) {
    if (pos == size) {
      return corrupt("truncated: no PNG end chunk (IEND); file ends at offset " +
                     std::to_string(size) + " after " + std::to_string(chunk) + " chunks");
    }
    if (pos + 8 > size) {
      return corrupt("truncated: chunk header at offset " + std::to_string(pos) +
                     " runs past end of file (size " + std::to_string(size) + ")");
    }
    const uint32_t length = be32(b, pos);
    std::string type(4, '\0');
    for (size_t i = 0; i < 4; ++i) {
      const uint8_t c = byte_at(b, pos + 4 + i);
      if (!is_chunk_letter(c)) {
        return corrupt("invalid PNG chunk type at offset " + std::to_string(pos + 4));
      }
      type[i] = static_cast<char>(c);
    }
    if (length > kPngMaxLength) {
      return corrupt("invalid length " + std::to_string(length) + " of chunk '" + type +
                     "' at offset " + std::to_string(pos));
    }
    if (pos + kChunkOverhead + length > size) {
      return corrupt("chunk '" + type + "' length " + std::to_string(length) + " at offset " +
                     std::to_string(pos) + " runs past end of file (size " + std::to_string(size) +
                     ")");
    }
    if (chunk == 0) {
      if (type != "IHDR") return corrupt("first PNG chunk is '" + type + "', not IHDR");
      if (length != 13) return corrupt("IHDR length is " + std::to_string(length) + ", not 13");
      if (be32(b, pos + 8) == 0 || be32(b, pos + 12) == 0) {
        return corrupt("IHDR has a zero width or height");
      }
    }
    if (type == "IDAT") idat_seen = true;
    if (type == "IEND") {
      if (!idat_seen)
        return corrupt("no image data: IEND at offset " + std::to_string(pos) +
                       " before any IDAT chunk");
      return Status::ok();  // bytes after IEND are tolerated, as decoders do
    }
    pos += kChunkOverhead + length;
  }
}

Status decode_png(std::span<const std::byte> b) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  // png_image_free is safe on a zeroed or already-finished image; finish_read frees on its own.
  std::unique_ptr<png_image, void (*)(png_image*)> guard(&image, png_image_free);
  auto failure = [&](const char* what) {
    return corrupt(std::string("PNG decode failed (") + what + ", libpng " +
                   ((image.warning_or_error & PNG_IMAGE_ERROR) ? "error" : "warning") +
                   "): " + image.message);
  };
  if (!png_image_begin_read_from_memory(&image, b.data(), b.size())) return failure("header");
  // libpng warns about damage it can skip (bad CRC of an ancillary chunk, extra data): an
  // integrity check treats that as corruption.
  if (image.warning_or_error != 0) return failure("header");
  image.format &= ~PNG_FORMAT_FLAG_COLORMAP;  // expand palettes: no colour-map buffer to manage
  // PNG_IMAGE_SIZE computes in 32 bits; a hostile IHDR would overflow it.
  const uint64_t out_bytes = uint64_t{PNG_IMAGE_PIXEL_CHANNELS(image.format)} *
                             PNG_IMAGE_PIXEL_COMPONENT_SIZE(image.format) * image.width *
                             image.height;
  if (out_bytes > kMaxDecodeBytes) {
    return unsupported("PNG of " + std::to_string(image.width) + "x" +
                       std::to_string(image.height) + " is too large to check by decoding");
  }
  std::vector<unsigned char> pixels(out_bytes);
  if (!png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr)) {
    return failure("image data");
  }
  if (image.warning_or_error != 0) return failure("image data");
  return Status::ok();
}

}  // namespace

Status check_image(std::string_view field, std::span<const std::byte> bytes, ImageCheck mode) {
  switch (image_type(field)) {
    case ImageType::kNone:
      return Status::ok();
    case ImageType::kJpeg:
      ZW_RETURN_IF_ERROR(check_jpeg_structure(bytes));
      return mode == ImageCheck::kDecode ? decode_jpeg(bytes) : Status::ok();
    case ImageType::kPng:
      ZW_RETURN_IF_ERROR(check_png_structure(bytes));
      return mode == ImageCheck::kDecode ? decode_png(bytes) : Status::ok();
  }
  return Status::ok();
}

}  // namespace zerowait::internal
