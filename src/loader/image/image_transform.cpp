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

#include "common/random.hpp"
#include "loader/image/resample.hpp"
#include "loader/image/rgb_decode.hpp"

// The crop box must come out the same on every machine, so its floating-point expressions are
// evaluated as written: no fused multiply-adds (GCC contracts by default in C++, Clang within
// expressions; either differs from x86-64 without FMA). Scoped to the crop geometry below.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace zerowait {
namespace {

using internal::Box;

constexpr int kMaxSize = 16384;
constexpr int kRandomResizedCropAttempts = 10;  // torchvision's
// libjpeg memory and intermediate rows beyond this are refused rather than attempted: a worker
// decodes many images at once across threads.
constexpr uint64_t kMaxDecodeBytes = 1ull << 30;
// Larger images are refused before decoding: a 1 KB file can claim 65535x65535 pixels and cost
// seconds. Pillow's limit for raising DecompressionBombError, so torchvision would refuse them too.
constexpr uint64_t kMaxPixels = 2 * 89478485ull;
// More scans than this in a progressive JPEG is an attack, not data (TurboJPEG's limit too).
constexpr int kMaxScans = 500;

// ---- Portable randomness and arithmetic --------------------------------------------------------

using internal::Rng;  // the loader's portable xoshiro256** (internal/random.hpp)

// Uniform in [lo, hi), computed here rather than with Rng::between so that the expression is
// evaluated under this file's no-contraction rule.
double uniform(Rng& rng, double lo, double hi) {
  const double u = rng.unit();
  return lo + (hi - lo) * u;
}

// The flip has its own stream so that it is independent of how many crop attempts were drawn.
constexpr uint64_t kFlipStream = 0x6A09E667F3BCC909ull;

bool draw_flip(const ImageTransform& t, uint64_t seed) {
  return t.random_flip && Rng(seed ^ kFlipStream).unit() < 0.5;
}

// Python's round(): halves go to the even neighbour, whatever the FPU rounding mode is.
double round_half_even(double v) {
  const double down = std::floor(v);
  const double diff = v - down;
  if (diff > 0.5) return down + 1;
  if (diff < 0.5) return down;
  return std::fmod(down, 2.0) == 0.0 ? down : down + 1;
}

constexpr double kLn2 = 0.6931471805599453094;

// exp and log from basic IEEE operations only: libm implementations differ in the last bit
// between platforms, and a last bit can move a rounded crop edge.
double portable_exp(double x) {
  // x = k ln2 + r with |r| <= ln2 / 2; ln2 split so that k * kLn2Hi is exact.
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const double k = round_half_even(x / kLn2);
  const double hi = x - k * kLn2Hi;
  const double r = hi - k * kLn2Lo;
  double term = 1.0, sum = 1.0;  // Taylor series; 0.35^18 / 18! < 1e-24
  for (int n = 1; n <= 17; ++n) {
    term = term * r / n;
    sum = sum + term;
  }
  return std::ldexp(sum, int(k));
}

// log(x) for finite x > 0.
double portable_log(double x) {
  int e = 0;
  double m = std::frexp(x, &e);  // x = m 2^e, m in [0.5, 1)
  if (m < 0.70710678118654752440) {
    m = m * 2;
    e = e - 1;
  }
  // log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172: the odd series to s^25.
  const double s = (m - 1) / (m + 1);
  const double s2 = s * s;
  double term = s, sum = 0.0;
  for (int n = 1; n <= 25; n += 2) {
    sum = sum + term / n;
    term = term * s2;
  }
  const double log_m = 2 * sum;
  const double log_2e = e * kLn2;
  return log_m + log_2e;
}

// ---- Crop geometry ----------------------------------------------------------------------------

// Resize(resize) then CenterCrop(size), as torchvision computes them for a PIL image, expressed
// as one box in the source image: output pixel i of the resized image is centred on
// (i + 0.5) * width / resized_width, so cropping the resized image is resampling this box.
Box center_crop_box(int width, int height, const ImageTransform& t) {
  const int64_t target = t.resize_or_default();
  const int64_t short_side = std::min(width, height), long_side = std::max(width, height);
  // torchvision: int(requested_new_short * long / short)
  const int64_t new_long = int64_t(double(target * long_side) / double(short_side));
  const int64_t new_width = width <= height ? target : new_long;
  const int64_t new_height = width <= height ? new_long : target;
  // CenterCrop: int(round((image_size - crop_size) / 2.0))
  const double left = round_half_even(double(new_width - t.size) / 2.0);
  const double top = round_half_even(double(new_height - t.size) / 2.0);
  const double sx = double(width) / double(new_width), sy = double(height) / double(new_height);
  return {left * sx, top * sy, (left + t.size) * sx, (top + t.size) * sy};
}

// The smallest DCT scale M/8 at which `box` still covers at least size x size pixels:
// libjpeg-turbo then does the coarse part of the downscale almost for free. Only M = 1, 2, 4 and 8
// have SIMD inverse DCTs in libjpeg-turbo; the others run in C and, measured here, made decoding
// slower than the next of these (a 300x300 centre crop: 670 us at 7/8, 550 us at 8/8).
int dct_scale_for(const Box& box, int size) {
  constexpr double kSlack = 1e-9;  // a box of exactly size pixels must not miss M by rounding
  const double w = box.x1 - box.x0, h = box.y1 - box.y0;
  for (const int m : {1, 2, 4}) {
    if (w * m >= 8.0 * size * (1 - kSlack) && h * m >= 8.0 * size * (1 - kSlack)) return m;
  }
  return 8;
}

// The crop in full-resolution pixels: `box` is what the output shows, `domain` where the
// filter's edge clamps (the crop itself for RandomResizedCrop, which crops before resizing;
// the whole image for Resize + CenterCrop, which resizes first).
struct CropGeometry {
  Box box, domain;
  bool flip = false;
};

CropGeometry crop_geometry(int width, int height, const ImageTransform& t, uint64_t seed) {
  if (t.mode == ImageTransform::Mode::kRandomResizedCrop) {
    const CropBox c = random_resized_crop_box(width, height, t, seed);
    const Box box{double(c.x), double(c.y), double(c.x + c.width), double(c.y + c.height)};
    return {box, box, c.flip};
  }
  return {center_crop_box(width, height, t), {0, 0, double(width), double(height)},
          draw_flip(t, seed)};
}

}  // namespace

// ---- ImageTransform ---------------------------------------------------------------------------

int ImageTransform::resize_or_default() const {
  return resize != 0 ? resize : int(round_half_even(size * 256.0 / 224.0));
}

Status ImageTransform::validate() const {
  auto bad = [](const std::string& field, const std::string& why) {
    return invalid_argument("ImageTransform." + field + " " + why);
  };
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  if (mode != Mode::kRandomResizedCrop && mode != Mode::kResizeCenterCrop) {
    return bad("mode", "is not a known mode (" + std::to_string(int(mode)) + ")");
  }
  if (size < 1 || size > kMaxSize) {
    return bad("size",
               "must be in [1, " + std::to_string(kMaxSize) + "], got " + std::to_string(size));
  }
  if (resize != 0 && (resize < size || resize > 4 * kMaxSize)) {
    return bad("resize", "must be 0 (default) or in [size, " + std::to_string(4 * kMaxSize) +
                             "], got " + std::to_string(resize) + " with size " +
                             std::to_string(size));
  }
  if (!(scale_min > 0 && scale_min <= 1)) {
    return bad("scale_min", "must be in (0, 1], got " + num(scale_min));
  }
  if (!(scale_max >= scale_min && scale_max <= 1)) {
    return bad("scale_max", "must be in [scale_min, 1], got " + num(scale_max) +
                                " with scale_min " + num(scale_min));
  }
  if (!(ratio_min > 0 && std::isfinite(ratio_min))) {
    return bad("ratio_min", "must be positive and finite, got " + num(ratio_min));
  }
  if (!(ratio_max >= ratio_min && std::isfinite(ratio_max))) {
    return bad("ratio_max", "must be finite and >= ratio_min, got " + num(ratio_max) +
                                " with ratio_min " + num(ratio_min));
  }
  return Status::ok();
}

// torchvision.transforms.RandomResizedCrop.get_params, step by step.
CropBox random_resized_crop_box(int width, int height, const ImageTransform& t,
                                uint64_t random_seed) {
  if (width <= 0 || height <= 0 || !t.validate().is_ok()) return {};
  const bool flip = draw_flip(t, random_seed);
  Rng rng(random_seed);
  const double area = double(width) * double(height);
  const double log_ratio_min = portable_log(t.ratio_min);
  const double log_ratio_max = portable_log(t.ratio_max);
  for (int attempt = 0; attempt < kRandomResizedCropAttempts; ++attempt) {
    const double target_area = area * uniform(rng, t.scale_min, t.scale_max);
    const double aspect_ratio = portable_exp(uniform(rng, log_ratio_min, log_ratio_max));
    const double w = round_half_even(std::sqrt(target_area * aspect_ratio));
    const double h = round_half_even(std::sqrt(target_area / aspect_ratio));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int crop_w = int(w), crop_h = int(h);
      const int y = int(rng.below(uint64_t(height - crop_h) + 1));
      const int x = int(rng.below(uint64_t(width - crop_w) + 1));
      return {x, y, crop_w, crop_h, flip};
    }
  }
  // Fallback: the whole image, cut to the nearest allowed aspect ratio, centred.
  const double in_ratio = double(width) / double(height);
  int crop_w = width, crop_h = height;
  if (in_ratio < t.ratio_min) {
    crop_h = int(round_half_even(width / t.ratio_min));
  } else if (in_ratio > t.ratio_max) {
    crop_w = int(round_half_even(height * t.ratio_max));
  }
  crop_w = std::clamp(crop_w, 1, width);  // ratios far from 1 can round a side of 1 pixel to 0
  crop_h = std::clamp(crop_h, 1, height);
  return {(width - crop_w) / 2, (height - crop_h) / 2, crop_w, crop_h, flip};
}

#if defined(__clang__)
#pragma STDC FP_CONTRACT ON
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

// ---- The libjpeg side -------------------------------------------------------------------------

namespace {

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

 private:
  // Each of these calls libjpeg under a setjmp and returns false, with err_ filled in, when
  // libjpeg failed. No objects with destructors live in their frames.
  bool create();
  bool read_header(const unsigned char* data, size_t size);
  bool start(int scale_num, J_COLOR_SPACE out_color_space);
  bool read_rows(Region columns_and_rows);

  Status failure(const char* stage) const;

  // Plans the resampler for `crop` in an image scaled by `f` to scaled_w x scaled_h pixels and
  // returns the region of the scaled image its input rows and columns are relative to.
  // kUnsupported (naming the `format` and width x height) for a plan too large.
  Result<Region> plan_resample(const CropGeometry& crop, double f, int scaled_w, int scaled_h,
                               const ImageTransform& t, const char* format, int width,
                               int height);
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
  // A decompress object keeps the Huffman and quantization tables of every JPEG it has read,
  // and a JPEG that lacks one (abbreviated, or damaged) would be decoded with an earlier file's
  // instead of the standard one: the pixels would depend on which images the worker decoded
  // before (found by fuzz_image). Each JPEG gets a fresh object, as a new decoder would; making
  // one costs microseconds.
  if (used_ && created_) jpeg_destroy_decompress(&cinfo_);
  if (used_) created_ = create();
  used_ = true;
  if (!created_) return Status(ErrorCode::kInternal, std::string("libjpeg init: ") + err_.message);

  // Whatever happens below, libjpeg is left ready for the next image.
  struct AbortOnExit {
    j_decompress_ptr cinfo;
    ~AbortOnExit() { jpeg_abort_decompress(cinfo); }
  } abort_on_exit{&cinfo_};

  if (!read_header(reinterpret_cast<const unsigned char*>(jpeg.data()), jpeg.size())) {
    return failure("header");
  }
  const int width = int(cinfo_.image_width), height = int(cinfo_.image_height);
  if (uint64_t(width) * uint64_t(height) > kMaxPixels) {
    return unsupported("JPEG of " + std::to_string(width) + "x" + std::to_string(height) +
                       " pixels is over the limit of " + std::to_string(kMaxPixels) + " pixels");
  }

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

}  // namespace zerowait
