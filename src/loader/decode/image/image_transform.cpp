#include "zerowait/loader/image_transform.hpp"

// clang-format off
#include <cstdio>    // jpeglib.h needs FILE and size_t first
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <string>
#include <vector>

#include "loader/decode/image/crop_geometry.hpp"
#include "loader/decode/image/resample.hpp"
#include "loader/decode/image/rgb_decode.hpp"

namespace zerowait {
namespace {

using internal::Box;
using internal::crop_geometry;
using internal::CropGeometry;
using internal::dct_scale_for;

// libjpeg memory and intermediate rows beyond this are refused rather than attempted: a worker
// decodes many images at once across threads.
constexpr uint64_t kMaxDecodeBytes = 1ull << 30;
// Larger images are refused before decoding: a 1 KB file can claim 65535x65535 pixels and cost
// seconds. Pillow's limit for raising DecompressionBombError, so torchvision would refuse them too.
constexpr uint64_t kMaxPixels = 2 * 89478485ull;
// More scans than this in a progressive JPEG is an attack, not data (TurboJPEG's limit too).
constexpr int kMaxScans = 500;

// libjpeg reports errors through callbacks that must not return; ours longjmp back into the
// ImageDecoder::Impl method that called libjpeg. Those methods keep nothing with a destructor
// in their frames, so the jump skips no C++ cleanup.
struct JpegErrorManager {
  jpeg_error_mgr pub;  // first: libjpeg hands back &pub as cinfo->err
  std::jmp_buf jump;
  int code;  // libjpeg's message code, or -1 for our own messages
  char message[JMSG_LENGTH_MAX];
};

JpegErrorManager* error_manager(j_common_ptr cinfo) {
  return reinterpret_cast<JpegErrorManager*>(cinfo->err);
}

[[noreturn]] void on_error_exit(j_common_ptr cinfo) {
  JpegErrorManager* err = error_manager(cinfo);
  err->code = cinfo->err->msg_code;
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings (msg_level -1) are tolerated, as Pillow tolerates them, except for data that ends
// before the rows we need: libjpeg would fill them with grey, Pillow says "image file is
// truncated". Trace messages are dropped: nothing is printed from a worker thread.
void on_emit_message(j_common_ptr cinfo, int msg_level) {
  if (msg_level >= 0) return;
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) on_error_exit(cinfo);
  cinfo->err->num_warnings++;
}

void on_output_message(j_common_ptr) {}

void on_progress(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  const auto* dinfo = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (dinfo->progressive_mode && dinfo->input_scan_number > kMaxScans) {
    JpegErrorManager* err = error_manager(cinfo);
    err->code = -1;
    std::snprintf(err->message, sizeof err->message, "progressive JPEG has more than %d scans",
                  kMaxScans);
    std::longjmp(err->jump, 1);
  }
}

// Pillow's CMYK -> RGB for JPEGs: it reads every CMYK JPEG as Adobe-inverted ("CMYK;I"), then
// r = (255 - k) - (255 - k) * c / 255 with its rounding MULDIV255; on the stored values that is
// what follows.
void cmyk_to_rgb(const uint8_t* cmyk, int pixels, uint8_t* rgb) {
  auto muldiv255 = [](int a, int b) {
    const int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
  };
  for (int i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int nk = cmyk[3];  // 255 - (255 - stored k)
    for (int c = 0; c < 3; ++c) rgb[c] = uint8_t(nk - muldiv255(255 - cmyk[c], nk));
  }
}

// A scaled image region: libjpeg rows and columns [x0, x1) x [y0, y1) at scale M/8.
struct Region {
  int x0, y0, x1, y1;
};

// "starts with 47 49 46 38": the first bytes of data that is no image we decode, for the error.
std::string signature_text(std::span<const std::byte> bytes) {
  std::string text = "starts with";
  char hex[4];
  for (size_t i = 0; i < std::min<size_t>(bytes.size(), 4); ++i) {
    std::snprintf(hex, sizeof hex, " %02x", unsigned(bytes[i]));
    text += hex;
  }
  return text;
}

// Aborts the decompression in progress when it goes out of scope, whatever happened: libjpeg is
// then ready for the next image.
struct AbortOnExit {
  j_decompress_ptr cinfo;
  const bool* created;
  ~AbortOnExit() {
    if (*created) jpeg_abort_decompress(cinfo);
  }
};

}  // namespace

class ImageDecoder::Impl {
 public:
  Impl() {
    jpeg_std_error(&err_.pub);
    err_.pub.error_exit = on_error_exit;
    err_.pub.emit_message = on_emit_message;
    err_.pub.output_message = on_output_message;
    progress_.progress_monitor = on_progress;
    created_ = create();
  }
  ~Impl() {
    if (created_) jpeg_destroy_decompress(&cinfo_);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Status decode(std::span<const std::byte> jpeg, const ImageTransform& t, uint64_t random_seed,
                std::span<uint8_t> out);
  Result<DeviceCrop> prepare_for_device(std::span<const std::byte> bytes, const ImageTransform& t,
                                        uint64_t random_seed, std::span<uint8_t> pixels);

 private:
  // Each of these calls libjpeg under a setjmp and returns false, with err_ filled in, when
  // libjpeg failed. No objects with destructors live in their frames.
  bool create();
  bool read_header(const unsigned char* data, size_t size);
  bool start(int scale_num, J_COLOR_SPACE out_color_space);
  bool read_rows(Region columns_and_rows);

  Status failure(const char* stage) const;

  // Gives the next JPEG a fresh decompress object and reads `jpeg`'s header into cinfo_; the
  // caller's AbortOnExit leaves libjpeg ready for the image after. Errors: decode()'s for the
  // header and for an image over the pixel limit.
  Status open_jpeg(std::span<const std::byte> jpeg);
  // Whether the JPEG whose header cinfo_ holds goes to a GPU decoder (prepare_for_device).
  bool device_decodes(std::span<const std::byte> jpeg) const;

  // Plans the resampler for `crop` in an image scaled by `f` to scaled_w x scaled_h pixels and
  // returns the region of the scaled image its input rows and columns are relative to.
  // kUnsupported (naming the `format` and width x height) for a plan too large.
  Result<Region> plan_resample(const CropGeometry& crop, double f, int scaled_w, int scaled_h,
                               const ImageTransform& t, const char* format, int width, int height);
  // PNG and WebP: decoded (whole, or a PNG's rows down to the last one the crop needs), then
  // resampled like a JPEG at full scale.
  Status decode_whole(std::span<const std::byte> bytes, internal::ImageFormat format,
                      const ImageTransform& t, uint64_t random_seed, std::span<uint8_t> out);

  jpeg_decompress_struct cinfo_{};
  JpegErrorManager err_{};
  jpeg_progress_mgr progress_{};
  bool created_ = false;
  bool used_ = false;  // cinfo_ has read a JPEG since it was created
  internal::Resampler resampler_;
  std::vector<uint8_t> scanlines_;  // a batch of libjpeg output rows (3 or 4 channels)
  std::vector<uint8_t> rgb_row_;    // one row converted from CMYK
  internal::RgbDecoder whole_;      // PNG and WebP, at full scale
};

bool ImageDecoder::Impl::create() {
  cinfo_.err = &err_.pub;
  if (setjmp(err_.jump)) return false;
  jpeg_create_decompress(&cinfo_);
  cinfo_.progress = &progress_;
  cinfo_.mem->max_memory_to_use = long(kMaxDecodeBytes);  // beyond it: JERR_NO_BACKING_STORE
  return true;
}

bool ImageDecoder::Impl::read_header(const unsigned char* data, size_t size) {
  if (setjmp(err_.jump)) return false;
  jpeg_mem_src(&cinfo_, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo_, TRUE);
  return true;
}

bool ImageDecoder::Impl::start(int scale_num, J_COLOR_SPACE out_color_space) {
  if (setjmp(err_.jump)) return false;
  cinfo_.scale_num = static_cast<unsigned int>(scale_num);
  cinfo_.scale_denom = 8;
  cinfo_.out_color_space = out_color_space;
  cinfo_.dct_method = JDCT_ISLOW;  // Pillow's default: same quality, and exact in libjpeg-turbo
  cinfo_.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo_);
  return true;
}

// Decodes the rows and columns of `r` (in output coordinates) and feeds each row to the
// resampler, whose first column is r.x0.
bool ImageDecoder::Impl::read_rows(Region r) {
  if (setjmp(err_.jump)) return false;
  // libjpeg widens the range to whole iMCUs; xoffset comes back <= r.x0.
  JDIMENSION xoffset = static_cast<JDIMENSION>(r.x0);
  JDIMENSION width = static_cast<JDIMENSION>(r.x1 - r.x0);
  jpeg_crop_scanline(&cinfo_, &xoffset, &width);
  const int channels = cinfo_.output_components;
  const size_t row_bytes = size_t(width) * channels;
  constexpr int kBatch = 8;
  if (scanlines_.size() < row_bytes * kBatch) scanlines_.resize(row_bytes * kBatch);
  if (channels == 4 && rgb_row_.size() < size_t(width) * 3) rgb_row_.resize(size_t(width) * 3);
  JSAMPROW rows[kBatch];
  for (int i = 0; i < kBatch; ++i) rows[i] = scanlines_.data() + i * row_bytes;

  if (r.y0 > 0) jpeg_skip_scanlines(&cinfo_, static_cast<JDIMENSION>(r.y0));
  const size_t skip = size_t(r.x0 - int(xoffset));  // pixels before r.x0 in each row
  for (int y = r.y0; y < r.y1;) {
    const JDIMENSION want = static_cast<JDIMENSION>(std::min(kBatch, r.y1 - y));
    const JDIMENSION got = jpeg_read_scanlines(&cinfo_, rows, want);
    if (got == 0) {  // cannot happen with a memory source; never spin
      err_.code = -1;
      std::snprintf(err_.message, sizeof err_.message, "libjpeg returned no rows at row %d", y);
      return false;
    }
    for (JDIMENSION i = 0; i < got; ++i) {
      const uint8_t* row = rows[i];
      if (channels == 4) {
        cmyk_to_rgb(row, int(width), rgb_row_.data());
        row = rgb_row_.data();
      }
      resampler_.add_row(row + skip * 3);
    }
    y += int(got);
  }
  return true;
}

Status ImageDecoder::Impl::failure(const char* stage) const {
  const std::string why = err_.code == JWRN_JPEG_EOF
                              ? "truncated (" + std::string(err_.message) + ")"
                              : std::string(err_.message);
  if (err_.code == JERR_NO_BACKING_STORE) {
    return unsupported(std::string("JPEG needs more than ") +
                       std::to_string(kMaxDecodeBytes >> 20) + " MiB to decode");
  }
  if (err_.code == JERR_CONVERSION_NOTIMPL) {
    return unsupported(std::string("JPEG colour space cannot be converted to RGB: ") + why);
  }
  return corrupt(std::string("JPEG decode failed (") + stage + "): " + why);
}

Status ImageDecoder::Impl::decode(std::span<const std::byte> jpeg, const ImageTransform& t,
                                  uint64_t random_seed, std::span<uint8_t> out) {
  ZW_RETURN_IF_ERROR(t.validate());
  const size_t out_bytes = size_t(t.size) * size_t(t.size) * 3;
  if (out.size() != out_bytes) {
    return invalid_argument("output buffer has " + std::to_string(out.size()) + " bytes, a " +
                            std::to_string(t.size) + "x" + std::to_string(t.size) +
                            " RGB image needs " + std::to_string(out_bytes));
  }
  const internal::ImageFormat format = internal::sniff_image_format(jpeg);
  if (format == internal::ImageFormat::kPng || format == internal::ImageFormat::kWebp) {
    return decode_whole(jpeg, format, t, random_seed, out);
  }
  if (jpeg.empty()) return corrupt("image decode failed: empty input");
  if (format == internal::ImageFormat::kUnknown) {
    return corrupt("not a JPEG, PNG or WebP image (" + signature_text(jpeg) + ")");
  }
  // Whatever happens below, libjpeg is left ready for the next image.
  AbortOnExit abort_on_exit{&cinfo_, &created_};
  ZW_RETURN_IF_ERROR(open_jpeg(jpeg));
  const int width = int(cinfo_.image_width), height = int(cinfo_.image_height);

  const CropGeometry crop = crop_geometry(width, height, t, random_seed);
  const int scale_num = t.dct_downscale ? dct_scale_for(crop.box, t.size) : 8;
  const bool cmyk = cinfo_.jpeg_color_space == JCS_CMYK || cinfo_.jpeg_color_space == JCS_YCCK;
  if (!start(scale_num, cmyk ? JCS_CMYK : JCS_RGB)) return failure("start");

  // The same geometry at scale M/8.
  ZW_ASSIGN_OR_RETURN(const Region d,
                      plan_resample(crop, scale_num / 8.0, int(cinfo_.output_width),
                                    int(cinfo_.output_height), t, "JPEG", width, height));
  const Region needed{d.x0 + resampler_.first_column(), d.y0 + resampler_.first_row(),
                      d.x0 + resampler_.end_column(), d.y0 + resampler_.end_row()};
  if (!read_rows(needed)) return failure("scan data");
  resampler_.finish(out);
  return Status::ok();
}

Status ImageDecoder::Impl::open_jpeg(std::span<const std::byte> jpeg) {
  // A decompress object keeps the Huffman and quantization tables of every JPEG it has read,
  // and a JPEG that lacks one (abbreviated, or damaged) would be decoded with an earlier file's
  // instead of the standard one: the pixels would depend on which images the worker decoded
  // before (found by fuzz_image). Each JPEG gets a fresh object, as a new decoder would; making
  // one costs microseconds.
  if (used_ && created_) jpeg_destroy_decompress(&cinfo_);
  if (used_) created_ = create();
  used_ = true;
  if (!created_) return Status(ErrorCode::kInternal, std::string("libjpeg init: ") + err_.message);
  if (!read_header(reinterpret_cast<const unsigned char*>(jpeg.data()), jpeg.size())) {
    return failure("header");
  }
  const uint64_t width = cinfo_.image_width, height = cinfo_.image_height;
  if (width * height > kMaxPixels) {
    return unsupported("JPEG of " + std::to_string(width) + "x" + std::to_string(height) +
                       " pixels is over the limit of " + std::to_string(kMaxPixels) + " pixels");
  }
  return Status::ok();
}

// What nvJPEG decodes as libjpeg does (within decoder tolerance): 8-bit, Huffman-coded, 3-component
// YCbCr with full-resolution chroma planes subsampled in one of the ways nvJPEG knows (4:4:4,
// 4:2:2, 4:4:0, 4:2:0, 4:1:1, 4:1:0), and complete: data that ends in anything but EOI goes to
// libjpeg, which tells a truncated file (kCorrupt) from trailing bytes after the image.
bool ImageDecoder::Impl::device_decodes(std::span<const std::byte> jpeg) const {
  if (cinfo_.jpeg_color_space != JCS_YCbCr || cinfo_.num_components != 3 ||
      cinfo_.data_precision != 8 || cinfo_.arith_code) {
    return false;
  }
  const jpeg_component_info* c = cinfo_.comp_info;
  for (int i = 1; i < 3; ++i) {
    if (c[i].h_samp_factor != 1 || c[i].v_samp_factor != 1) return false;
  }
  const int h = c[0].h_samp_factor, v = c[0].v_samp_factor;
  if (!((h == 1 || h == 2 || h == 4) && (v == 1 || v == 2))) return false;
  const size_t n = jpeg.size();
  return n >= 2 && jpeg[n - 2] == std::byte{0xFF} && jpeg[n - 1] == std::byte{0xD9};
}

Result<DeviceCrop> ImageDecoder::Impl::prepare_for_device(std::span<const std::byte> bytes,
                                                          const ImageTransform& t,
                                                          uint64_t random_seed,
                                                          std::span<uint8_t> pixels) {
  ZW_RETURN_IF_ERROR(t.validate());
  DeviceCrop crop;
  if (internal::sniff_image_format(bytes) == internal::ImageFormat::kJpeg) {
    AbortOnExit abort_on_exit{&cinfo_, &created_};
    ZW_RETURN_IF_ERROR(open_jpeg(bytes));
    crop.width = int(cinfo_.image_width);
    crop.height = int(cinfo_.image_height);
    crop.area = crop_area(crop.width, crop.height, t, random_seed);
    if (device_decodes(bytes)) return crop;
  }
  // Decoded here, as decode() does (PNG and WebP keep width and height 0: their pixels are final).
  ZW_RETURN_IF_ERROR(decode(bytes, t, random_seed, pixels));
  crop.decoded = true;
  return crop;
}

Result<Region> ImageDecoder::Impl::plan_resample(const CropGeometry& crop, double f, int scaled_w,
                                                 int scaled_h, const ImageTransform& t,
                                                 const char* format, int width, int height) {
  // The domain widened to whole pixels of the (scaled) image, the box relative to it.
  const Box& domain = crop.domain;
  const Region d{std::max(int(std::floor(domain.x0 * f)), 0),
                 std::max(int(std::floor(domain.y0 * f)), 0),
                 std::min(int(std::ceil(domain.x1 * f)), scaled_w),
                 std::min(int(std::ceil(domain.y1 * f)), scaled_h)};
  const int dw = d.x1 - d.x0, dh = d.y1 - d.y0;
  const Box& box = crop.box;
  const Box scaled{std::clamp(box.x0 * f - d.x0, 0.0, double(dw)),
                   std::clamp(box.y0 * f - d.y0, 0.0, double(dh)),
                   std::clamp(box.x1 * f - d.x0, 0.0, double(dw)),
                   std::clamp(box.y1 * f - d.y0, 0.0, double(dh))};
  resampler_.plan(dw, dh, scaled, t.size, t.size, crop.flip);
  if (resampler_.intermediate_bytes() > kMaxDecodeBytes) {
    return unsupported("resampling a " + std::to_string(width) + "x" + std::to_string(height) +
                       " " + format + " to " + std::to_string(t.size) + " pixels needs more than " +
                       std::to_string(kMaxDecodeBytes >> 20) + " MiB");
  }
  return d;
}

Status ImageDecoder::Impl::decode_whole(std::span<const std::byte> bytes,
                                        internal::ImageFormat format, const ImageTransform& t,
                                        uint64_t random_seed, std::span<uint8_t> out) {
  const char* name = format == internal::ImageFormat::kPng ? "PNG" : "WebP";
  int first_column = 0;  // of the image: where each row handed to the resampler starts
  auto need = [&](int width, int height) -> Result<internal::RgbDecoder::RowRange> {
    const CropGeometry crop = crop_geometry(width, height, t, random_seed);
    ZW_ASSIGN_OR_RETURN(const Region d,
                        plan_resample(crop, 1.0, width, height, t, name, width, height));
    first_column = d.x0 + resampler_.first_column();
    return internal::RgbDecoder::RowRange{d.y0 + resampler_.first_row(),
                                          d.y0 + resampler_.end_row()};
  };
  auto row = [&](const uint8_t* rgb) { resampler_.add_row(rgb + size_t(first_column) * 3); };
  ZW_RETURN_IF_ERROR(whole_.decode_rows(bytes, format, kMaxPixels, need, row));
  resampler_.finish(out);
  return Status::ok();
}

ImageDecoder::ImageDecoder() : impl_(std::make_unique<Impl>()) {}
ImageDecoder::~ImageDecoder() = default;
ImageDecoder::ImageDecoder(ImageDecoder&&) noexcept = default;
ImageDecoder& ImageDecoder::operator=(ImageDecoder&&) noexcept = default;

Status ImageDecoder::decode(std::span<const std::byte> jpeg, const ImageTransform& t,
                            uint64_t random_seed, std::span<uint8_t> out) {
  if (!impl_) impl_ = std::make_unique<Impl>();  // moved from: start afresh
  return impl_->decode(jpeg, t, random_seed, out);
}

Result<DeviceCrop> ImageDecoder::prepare_for_device(std::span<const std::byte> bytes,
                                                    const ImageTransform& t, uint64_t random_seed,
                                                    std::span<uint8_t> pixels) {
  if (!impl_) impl_ = std::make_unique<Impl>();
  return impl_->prepare_for_device(bytes, t, random_seed, pixels);
}

}  // namespace zerowait
