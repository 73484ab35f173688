// The crop geometry of the image transforms (image_transform.hpp): torchvision's RandomResizedCrop
// and Resize + CenterCrop as boxes in the source image, from portable arithmetic so that a seed
// gives the same box on every machine.
#include "loader/decode/image/crop_geometry.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "common/random.hpp"

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

CropArea crop_area(int width, int height, const ImageTransform& t, uint64_t random_seed) {
  if (width <= 0 || height <= 0 || !t.validate().is_ok()) return {};
  const internal::CropGeometry crop = internal::crop_geometry(width, height, t, random_seed);
  return {crop.box.x0, crop.box.y0, crop.box.x1, crop.box.y1, crop.flip};
}

namespace internal {

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

CropGeometry crop_geometry(int width, int height, const ImageTransform& t, uint64_t seed) {
  if (t.mode == ImageTransform::Mode::kRandomResizedCrop) {
    const CropBox c = random_resized_crop_box(width, height, t, seed);
    const Box box{double(c.x), double(c.y), double(c.x + c.width), double(c.y + c.height)};
    return {box, box, c.flip};
  }
  return {
      center_crop_box(width, height, t), {0, 0, double(width), double(height)}, draw_flip(t, seed)};
}

}  // namespace internal

#if defined(__clang__)
#pragma STDC FP_CONTRACT ON
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

}  // namespace zerowait
