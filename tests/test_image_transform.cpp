// JPEG -> fixed-size RGB with torchvision's crops: geometry of the random crop, determinism,
// flips, agreement of the DCT-scaled partial decode with a full decode, colour spaces, and
// corrupt input that must fail cleanly.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "loader/decode/image/resample.hpp"
#include "testing/testing.hpp"
#include "zerowait/loader/image_transform.hpp"

namespace zerowait {
namespace {

using Bytes = std::vector<std::byte>;
using Mode = ImageTransform::Mode;

// ---- Making and decoding JPEGs with TurboJPEG ------------------------------------------------

// Encodes `pixels` (tjPixelSize[format] bytes per pixel, rows packed).
Bytes encode(const std::vector<uint8_t>& pixels, int width, int height, int format, int subsamp,
             int quality = 90, int flags = 0) {
  tjhandle handle = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(handle, pixels.data(), width, 0, height, format, &jpeg, &size, subsamp,
                             quality, flags);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(handle);
  Bytes out(size);
  if (rc == 0) std::memcpy(out.data(), jpeg, size);
  tjFree(jpeg);
  tjDestroy(handle);
  return out;
}

// An RGB picture from a function of (x, y) -> {r, g, b}.
template <typename F>
std::vector<uint8_t> paint(int width, int height, F f) {
  std::vector<uint8_t> pixels(size_t(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const auto [r, g, b] = f(x, y);
      uint8_t* p = &pixels[(size_t(y) * width + x) * 3];
      p[0] = uint8_t(std::clamp(r, 0, 255));
      p[1] = uint8_t(std::clamp(g, 0, 255));
      p[2] = uint8_t(std::clamp(b, 0, 255));
    }
  }
  return pixels;
}

// Smooth content: slow waves over a diagonal gradient; nothing a DCT downscale would alias.
std::vector<uint8_t> smooth_picture(int width, int height) {
  return paint(width, height, [&](int x, int y) {
    const double u = double(x) / width, v = double(y) / height;
    return std::tuple{int(40 + 150 * u + 30 * std::sin(9 * v)),
                      int(128 + 90 * std::sin(7 * u + 3 * v)),
                      int(200 - 120 * v + 25 * std::cos(11 * u))};
  });
}

// Dark on the left, bright on the right (or top to bottom when `vertical`).
std::vector<uint8_t> ramp_picture(int width, int height, bool vertical = false) {
  return paint(width, height, [&](int x, int y) {
    const int v = vertical ? 255 * y / (height - 1) : 255 * x / (width - 1);
    return std::tuple{v, v, v};
  });
}

Bytes smooth_jpeg(int width, int height, int subsamp = TJSAMP_420) {
  return encode(smooth_picture(width, height), width, height, TJPF_RGB, subsamp);
}

struct Decoded {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
};

// A full-resolution decode: the reference that torchvision's PIL pipeline starts from.
Decoded full_decode(const Bytes& jpeg) {
  tjhandle handle = tjInitDecompress();
  const auto* data = reinterpret_cast<const unsigned char*>(jpeg.data());
  Decoded d;
  int subsamp = 0, colorspace = 0;
  EXPECT_EQ(
      tjDecompressHeader3(handle, data, jpeg.size(), &d.width, &d.height, &subsamp, &colorspace),
      0);
  d.rgb.resize(size_t(d.width) * d.height * 3);
  EXPECT_EQ(
      tjDecompress2(handle, data, jpeg.size(), d.rgb.data(), d.width, 0, d.height, TJPF_RGB, 0), 0)
      << tjGetErrorStr2(handle);
  tjDestroy(handle);
  return d;
}

// PIL's order for RandomResizedCrop: full decode, crop, then one resize of the crop.
std::vector<uint8_t> reference_random_resized_crop(const Bytes& jpeg, const ImageTransform& t,
                                                   uint64_t seed) {
  const Decoded d = full_decode(jpeg);
  const CropBox c = random_resized_crop_box(d.width, d.height, t, seed);
  std::vector<uint8_t> out(size_t(t.size) * t.size * 3);
  internal::resample_rgb(&d.rgb[(size_t(c.y) * d.width + c.x) * 3], c.width, c.height,
                         size_t(d.width) * 3, {0, 0, double(c.width), double(c.height)}, t.size,
                         t.size, c.flip, out);
  return out;
}

// ---- Running the decoder ---------------------------------------------------------------------

std::vector<uint8_t> decode_jpeg_ok(ImageDecoder& decoder, const Bytes& jpeg, const ImageTransform& t,
                               uint64_t seed) {
  std::vector<uint8_t> out(size_t(t.size) * t.size * 3);
  const Status s = decoder.decode(jpeg, t, seed, out);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

std::vector<uint8_t> decode_jpeg_ok(const Bytes& jpeg, const ImageTransform& t, uint64_t seed) {
  ImageDecoder decoder;
  return decode_jpeg_ok(decoder, jpeg, t, seed);
}

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(int(a[i]) - int(b[i]));
  return sum / double(a.size());
}

int max_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  int m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(int(a[i]) - int(b[i])));
  return m;
}

std::vector<uint8_t> mirror(const std::vector<uint8_t>& rgb, int size) {
  std::vector<uint8_t> out(rgb.size());
  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      std::memcpy(&out[(size_t(y) * size + (size - 1 - x)) * 3], &rgb[(size_t(y) * size + x) * 3],
                  3);
    }
  }
  return out;
}

// Mean of channel 0 over columns [x0, x1) (rows [x0, x1) when `rows`) of a size x size image.
double band_mean(const std::vector<uint8_t>& rgb, int size, int from, int to, bool rows = false) {
  double sum = 0;
  int n = 0;
  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      const int along = rows ? y : x;
      if (along < from || along >= to) continue;
      sum += rgb[(size_t(y) * size + x) * 3];
      ++n;
    }
  }
  return sum / n;
}

// ---- The resampler against Pillow's algorithm -------------------------------------------------

// Pillow's ImagingResample for 8-bit RGB with the bilinear filter, in doubles: horizontal pass,
// rounding to 8 bits, vertical pass.
std::vector<uint8_t> pillow_resample(const std::vector<uint8_t>& in, int width, int height,
                                     const internal::Box& box, int out_w, int out_h) {
  struct Tap {
    int first;
    std::vector<double> w;
  };
  auto taps = [](double in0, double in1, int in_size, int out_size) {
    const double scale = (in1 - in0) / out_size, filter_scale = std::max(scale, 1.0);
    const double support = filter_scale;
    std::vector<Tap> out(out_size);
    for (int i = 0; i < out_size; ++i) {
      const double center = in0 + (i + 0.5) * scale;
      const int lo = std::max(int(center - support + 0.5), 0);
      const int hi = std::min(int(center + support + 0.5), in_size);
      double sum = 0;
      for (int x = lo; x < hi; ++x) {
        const double w = std::max(0.0, 1.0 - std::fabs((x - center + 0.5) / filter_scale));
        out[i].w.push_back(w);
        sum += w;
      }
      for (double& w : out[i].w) w = sum != 0 ? w / sum : w;
      out[i].first = lo;
    }
    return out;
  };
  auto to8 = [](double v) { return uint8_t(std::clamp(std::floor(v + 0.5), 0.0, 255.0)); };
  const auto h = taps(box.x0, box.x1, width, out_w);
  const auto v = taps(box.y0, box.y1, height, out_h);
  std::vector<uint8_t> mid(size_t(out_w) * height * 3), out(size_t(out_w) * out_h * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < out_w; ++x) {
      for (int c = 0; c < 3; ++c) {
        double sum = 0;
        for (size_t k = 0; k < h[x].w.size(); ++k) {
          sum += in[(size_t(y) * width + h[x].first + k) * 3 + c] * h[x].w[k];
        }
        mid[(size_t(y) * out_w + x) * 3 + c] = to8(sum);
      }
    }
  }
  for (int y = 0; y < out_h; ++y) {
    for (size_t i = 0; i < size_t(out_w) * 3; ++i) {
      double sum = 0;
      for (size_t k = 0; k < v[y].w.size(); ++k) {
        sum += mid[(v[y].first + k) * out_w * 3 + i] * v[y].w[k];
      }
      out[size_t(y) * out_w * 3 + i] = to8(sum);
    }
  }
  return out;
}

// Fixed point (14-bit weights, SSE2 where available) against Pillow's arithmetic in doubles:
// downscales up to 12x (many taps), upscales, fractional boxes, flips.
TEST(Resample, MatchesPillowsBilinearWithinOneLevel) {
  const std::string noise = testing::random_bytes(97 * 83 * 3, 11);
  const std::vector<uint8_t> in(noise.begin(), noise.end());
  struct Case {
    internal::Box box;
    int out_w, out_h;
  };
  const std::vector<Case> cases = {
      {{0, 0, 97, 83}, 8, 7},
      {{0, 0, 97, 83}, 40, 50},
      {{0, 0, 97, 83}, 97, 83},
      {{10, 5, 30, 25}, 64, 64},
      {{3.25, 7.5, 90.75, 60.1}, 31, 29},
      {{0, 0, 97, 83}, 211, 190},
      {{50.5, 40.5, 51.5, 41.5}, 5, 5},
  };
  for (const Case& c : cases) {
    const std::vector<uint8_t> want = pillow_resample(in, 97, 83, c.box, c.out_w, c.out_h);
    std::vector<uint8_t> got(want.size()), flipped(want.size());
    internal::resample_rgb(in.data(), 97, 83, 97 * 3, c.box, c.out_w, c.out_h, false, got);
    internal::resample_rgb(in.data(), 97, 83, 97 * 3, c.box, c.out_w, c.out_h, true, flipped);
    EXPECT_LE(max_abs_diff(got, want), 1) << c.out_w << "x" << c.out_h;
    // Rounding differs where Pillow's sum lands within 2^-14 of a half: well under 1% of values
    // (the 5x5 upscale of one pixel is all halves and too small to count).
    if (want.size() > 1000) {
      EXPECT_LT(mean_abs_diff(got, want), 0.01) << c.out_w << "x" << c.out_h;
    }
    for (int y = 0; y < c.out_h; ++y) {
      for (int x = 0; x < c.out_w; ++x) {
        const size_t a = (size_t(y) * c.out_w + x) * 3,
                     b = (size_t(y) * c.out_w + c.out_w - 1 - x) * 3;
        ASSERT_EQ(std::memcmp(&got[a], &flipped[b], 3), 0) << x << "," << y;
      }
    }
  }
}

// ---- ImageTransform::validate ----------------------------------------------------------------

TEST(ImageTransformValidate, DefaultsAreValid) {
  EXPECT_TRUE(ImageTransform{}.validate().is_ok());
  EXPECT_EQ(ImageTransform{}.resize_or_default(), 256);
  EXPECT_EQ((ImageTransform{.size = 112}).resize_or_default(), 128);
}

TEST(ImageTransformValidate, NamesTheBadField) {
  const std::vector<std::pair<ImageTransform, std::string>> cases = {
      {{.size = 0}, "size"},
      {{.size = 100000}, "size"},
      {{.mode = Mode::kResizeCenterCrop, .size = 224, .resize = 200}, "resize"},
      {{.scale_min = 0}, "scale_min"},
      {{.scale_min = 0.5, .scale_max = 0.4}, "scale_max"},
      {{.scale_max = 1.5}, "scale_max"},
      {{.ratio_min = -1}, "ratio_min"},
      {{.ratio_min = 2, .ratio_max = 1}, "ratio_max"},
      {{.ratio_max = INFINITY}, "ratio_max"},
      {{.mode = Mode(7)}, "mode"},
  };
  for (const auto& [t, field] : cases) {
    const Status s = t.validate();
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find("ImageTransform." + field + " "), std::string::npos) << s.message();
  }
}

// ---- random_resized_crop_box -----------------------------------------------------------------

TEST(RandomResizedCropBox, StaysWithinScaleAndRatioBounds) {
  const ImageTransform t;
  const std::vector<std::pair<int, int>> sizes = {{300, 300},   {500, 375}, {375, 500}, {1000, 750},
                                                  {4000, 3000}, {64, 48},   {10, 10},   {3, 2}};
  for (const auto& [w, h] : sizes) {
    int fallbacks = 0;
    double area_sum = 0, x_centre_sum = 0;
    const int seeds = 2000;
    for (uint64_t seed = 0; seed < seeds; ++seed) {
      const CropBox c = random_resized_crop_box(w, h, t, seed);
      ASSERT_GE(c.x, 0);
      ASSERT_GE(c.y, 0);
      ASSERT_GE(c.width, 1);
      ASSERT_GE(c.height, 1);
      ASSERT_LE(c.x + c.width, w);
      ASSERT_LE(c.y + c.height, h);
      ASSERT_FALSE(c.flip);  // random_flip is off
      const double area = double(c.width) * c.height / (double(w) * h);
      area_sum += area;
      x_centre_sum += (c.x + c.width / 2.0) / w;
      if (c.width == w && c.height == h) {
        ++fallbacks;  // the whole image (the fallback, or an attempt that drew all of it)
        continue;
      }
      // w and h are rounded: allow half a pixel on each side.
      const double ratio_lo = (c.width - 0.5) / (c.height + 0.5);
      const double ratio_hi = (c.width + 0.5) / (c.height - 0.5);
      EXPECT_LE(ratio_lo, t.ratio_max) << w << "x" << h << " seed " << seed;
      EXPECT_GE(ratio_hi, t.ratio_min) << w << "x" << h << " seed " << seed;
      const double area_lo = (c.width - 0.5) * (c.height - 0.5) / (double(w) * h);
      const double area_hi = (c.width + 0.5) * (c.height + 0.5) / (double(w) * h);
      EXPECT_LE(area_lo, t.scale_max) << w << "x" << h << " seed " << seed;
      EXPECT_GE(area_hi, t.scale_min) << w << "x" << h << " seed " << seed;
    }
    if (w >= 64) {
      // Most of the scale range fits a 4:3 or square image; positions are uniform.
      EXPECT_LT(fallbacks, seeds / 50) << w << "x" << h;
      EXPECT_NEAR(area_sum / seeds, 0.5, 0.1) << w << "x" << h;
      EXPECT_NEAR(x_centre_sum / seeds, 0.5, 0.02) << w << "x" << h;
    }
  }
}

TEST(RandomResizedCropBox, ExtremeAspectRatiosFallBackToACentredAllowedRatio) {
  const ImageTransform t;
  // 20:1 and 1:20 never fit a 3:4..4:3 crop of at least 8% of the area: torchvision's fallback.
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const CropBox wide = random_resized_crop_box(1000, 50, t, seed);
    EXPECT_EQ(wide.width, 67);  // round(50 * 4/3)
    EXPECT_EQ(wide.height, 50);
    EXPECT_EQ(wide.x, (1000 - 67) / 2);
    EXPECT_EQ(wide.y, 0);
    const CropBox tall = random_resized_crop_box(50, 1000, t, seed);
    EXPECT_EQ(tall.width, 50);
    EXPECT_EQ(tall.height, 67);  // round(50 / (3/4))
    EXPECT_EQ(tall.x, 0);
    EXPECT_EQ(tall.y, (1000 - 67) / 2);
  }
  // A 1x1 image has only one crop.
  const CropBox one = random_resized_crop_box(1, 1, t, 3);
  EXPECT_EQ(std::tie(one.x, one.y, one.width, one.height), std::tuple(0, 0, 1, 1));
}

TEST(RandomResizedCropBox, SameSeedSameBoxDifferentSeedsDiffer) {
  const ImageTransform t{.random_flip = true};
  std::set<std::tuple<int, int, int, int, bool>> boxes;
  int flips = 0;
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    const CropBox a = random_resized_crop_box(500, 375, t, seed);
    const CropBox b = random_resized_crop_box(500, 375, t, seed);
    EXPECT_EQ(std::tie(a.x, a.y, a.width, a.height, a.flip),
              std::tie(b.x, b.y, b.width, b.height, b.flip));
    boxes.insert({a.x, a.y, a.width, a.height, a.flip});
    flips += a.flip;
  }
  EXPECT_GT(boxes.size(), 990u);
  EXPECT_NEAR(flips, 500, 60);
}

// Pins the PRNG and arithmetic: a change here changes every training run's crops, so it must be
// deliberate. The values are portable by construction (IEEE basic operations only).
TEST(RandomResizedCropBox, GoldenValues) {
  const ImageTransform t{.random_flip = true};
  const CropBox a = random_resized_crop_box(500, 375, t, 42);
  const CropBox b = random_resized_crop_box(4000, 3000, t, 0xDEADBEEF);
  EXPECT_EQ(std::tie(a.x, a.y, a.width, a.height, a.flip), std::tuple(309, 134, 166, 178, false));
  EXPECT_EQ(std::tie(b.x, b.y, b.width, b.height, b.flip), std::tuple(1226, 683, 2007, 2304, true));
}

TEST(RandomResizedCropBox, InvalidInputGivesAnEmptyBox) {
  EXPECT_EQ(random_resized_crop_box(0, 10, ImageTransform{}, 1).width, 0);
  EXPECT_EQ(random_resized_crop_box(10, 10, ImageTransform{.scale_min = 2}, 1).width, 0);
}

// ---- ImageDecoder: shape, determinism, flips -------------------------------------------------

TEST(ImageDecoder, OutputSizeMismatchIsInvalidArgument) {
  ImageDecoder decoder;
  const Bytes jpeg = smooth_jpeg(300, 300);
  std::vector<uint8_t> out(224 * 224 * 3 - 1);
  const Status s = decoder.decode(jpeg, ImageTransform{}, 1, out);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("150528"), std::string::npos) << s.message();
  std::vector<uint8_t> right(224 * 224 * 3);
  EXPECT_EQ(decoder.decode(jpeg, ImageTransform{.size = 0}, 1, right).code(),
            ErrorCode::kInvalidArgument);
}

TEST(ImageDecoder, SameSeedSameBytesDifferentSeedsDifferentCrops) {
  const Bytes jpeg = smooth_jpeg(450, 300);
  const Bytes other = smooth_jpeg(640, 480, TJSAMP_444);
  for (const Mode mode : {Mode::kRandomResizedCrop, Mode::kResizeCenterCrop}) {
    const ImageTransform t{.mode = mode, .size = 96, .random_flip = true};
    ImageDecoder reused;
    std::set<std::vector<uint8_t>> distinct;
    for (uint64_t seed = 0; seed < 20; ++seed) {
      const std::vector<uint8_t> a = decode_jpeg_ok(reused, jpeg, t, seed);
      decode_jpeg_ok(reused, other, t, seed + 100);  // state from another image must not leak
      const std::vector<uint8_t> b = decode_jpeg_ok(jpeg, t, seed);  // a fresh decoder
      ASSERT_EQ(a.size(), 96u * 96 * 3);
      EXPECT_EQ(a, b) << "seed " << seed;
      distinct.insert(a);
    }
    // Centre crops differ only by the flip.
    EXPECT_EQ(distinct.size(), mode == Mode::kRandomResizedCrop ? 20u : 2u);
  }
}

TEST(ImageDecoder, FlipIsTheMirrorOfTheUnflippedOutput) {
  const Bytes jpeg = smooth_jpeg(400, 300, TJSAMP_422);
  int flipped_seeds = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    for (const Mode mode : {Mode::kRandomResizedCrop, Mode::kResizeCenterCrop}) {
      const ImageTransform plain{.mode = mode, .size = 64};
      ImageTransform flipping = plain;
      flipping.random_flip = true;
      const bool flip = random_resized_crop_box(400, 300, flipping, seed).flip;
      const std::vector<uint8_t> a = decode_jpeg_ok(jpeg, plain, seed);
      const std::vector<uint8_t> b = decode_jpeg_ok(jpeg, flipping, seed);
      EXPECT_EQ(b, flip ? mirror(a, 64) : a) << "seed " << seed;
      flipped_seeds += flip;
    }
  }
  EXPECT_GT(flipped_seeds, 0);
}

// ---- ImageDecoder: pixels against a full decode ----------------------------------------------

// Without DCT scaling the partial decode (iMCU-cropped columns, skipped rows) must give PIL's
// crop-then-resize of the full decode. Exactly, except that 4:2:2 and 4:2:0 chroma upsampling
// sees an edge where libjpeg cut the columns: a level or two there.
TEST(ImageDecoder, PartialDecodeMatchesFullDecode) {
  for (const int subsamp : {TJSAMP_444, TJSAMP_422, TJSAMP_420, TJSAMP_440, TJSAMP_411}) {
    const Bytes jpeg = smooth_jpeg(523, 397, subsamp);
    const ImageTransform t{.size = 128, .random_flip = true, .dct_downscale = false};
    for (uint64_t seed = 0; seed < 8; ++seed) {
      const std::vector<uint8_t> ours = decode_jpeg_ok(jpeg, t, seed);
      const std::vector<uint8_t> ref = reference_random_resized_crop(jpeg, t, seed);
      EXPECT_LE(max_abs_diff(ours, ref), 2) << "subsamp " << subsamp << " seed " << seed;
      EXPECT_LT(mean_abs_diff(ours, ref), 0.05) << "subsamp " << subsamp << " seed " << seed;
    }
  }
}

// With DCT scaling, large images decode at 1/8..7/8 scale first: close to, not equal to, the
// full-resolution result.
TEST(ImageDecoder, DctScaledDecodeIsCloseToFullDecode) {
  for (const int subsamp : {TJSAMP_444, TJSAMP_420}) {
    const Bytes jpeg = smooth_jpeg(1000, 750, subsamp);
    for (const double scale_min : {0.08, 0.5}) {
      const ImageTransform t{.scale_min = scale_min, .random_flip = true};
      for (uint64_t seed = 0; seed < 10; ++seed) {
        const std::vector<uint8_t> ours = decode_jpeg_ok(jpeg, t, seed);
        const std::vector<uint8_t> ref = reference_random_resized_crop(jpeg, t, seed);
        EXPECT_LT(mean_abs_diff(ours, ref), 3.0) << "subsamp " << subsamp << " seed " << seed;
      }
    }
  }
}

// Resize(256) + CenterCrop(224) computed as one box equals resizing the whole image and then
// cropping, which is what torchvision does.
TEST(ImageDecoder, CentreCropEqualsResizeThenCrop) {
  for (const auto& [w, h] :
       std::vector<std::pair<int, int>>{{500, 375}, {301, 433}, {260, 260}, {1000, 750}}) {
    const Bytes jpeg = smooth_jpeg(w, h, TJSAMP_444);
    const ImageTransform t{.mode = Mode::kResizeCenterCrop, .dct_downscale = false};
    const std::vector<uint8_t> ours = decode_jpeg_ok(jpeg, t, 0);

    const Decoded d = full_decode(jpeg);
    const int short_side = std::min(w, h), long_side = std::max(w, h);
    const int new_long = int(256.0 * long_side / short_side);
    const int rw = w <= h ? 256 : new_long, rh = w <= h ? new_long : 256;
    std::vector<uint8_t> resized(size_t(rw) * rh * 3);
    internal::resample_rgb(d.rgb.data(), w, h, size_t(w) * 3, {0, 0, double(w), double(h)}, rw, rh,
                           false, resized);
    const int left = int(std::nearbyint((rw - 224) / 2.0)),
              top = int(std::nearbyint((rh - 224) / 2.0));
    std::vector<uint8_t> ref(224 * 224 * 3);
    for (int y = 0; y < 224; ++y) {
      std::memcpy(&ref[size_t(y) * 224 * 3], &resized[(size_t(top + y) * rw + left) * 3], 224 * 3);
    }
    EXPECT_LE(max_abs_diff(ours, ref), 1) << w << "x" << h;
    EXPECT_LT(mean_abs_diff(ours, ref), 0.01) << w << "x" << h;
    // And with DCT scaling (no effect below 2x the output size, near for larger ones).
    ImageTransform fast = t;
    fast.dct_downscale = true;
    EXPECT_LT(mean_abs_diff(decode_jpeg_ok(jpeg, fast, 0), ref), 3.0) << w << "x" << h;
  }
}

TEST(ImageDecoder, SolidColourStaysThatColour) {
  const auto solid = paint(700, 500, [](int, int) { return std::tuple{200, 60, 110}; });
  const Bytes jpeg = encode(solid, 700, 500, TJPF_RGB, TJSAMP_420, 95);
  const Decoded d = full_decode(jpeg);
  const uint8_t* colour = &d.rgb[(size_t(250) * 700 + 350) * 3];
  for (const Mode mode : {Mode::kResizeCenterCrop, Mode::kRandomResizedCrop}) {
    for (uint64_t seed = 0; seed < 4; ++seed) {
      const std::vector<uint8_t> out = decode_jpeg_ok(jpeg, ImageTransform{.mode = mode}, seed);
      for (size_t i = 0; i < out.size(); i += 3) {
        ASSERT_NEAR(out[i + 0], colour[0], 1) << i;
        ASSERT_NEAR(out[i + 1], colour[1], 1) << i;
        ASSERT_NEAR(out[i + 2], colour[2], 1) << i;
      }
    }
  }
}

TEST(ImageDecoder, GradientKeepsItsOrientation) {
  const Bytes horizontal = encode(ramp_picture(640, 480), 640, 480, TJPF_RGB, TJSAMP_420);
  const Bytes vertical = encode(ramp_picture(640, 480, true), 640, 480, TJPF_RGB, TJSAMP_420);
  const int n = 112;
  for (const Mode mode : {Mode::kRandomResizedCrop, Mode::kResizeCenterCrop}) {
    for (uint64_t seed = 0; seed < 10; ++seed) {
      const ImageTransform t{.mode = mode, .size = n, .random_flip = true};
      const bool flip = random_resized_crop_box(640, 480, t, seed).flip;
      const std::vector<uint8_t> h = decode_jpeg_ok(horizontal, t, seed);
      const double left = band_mean(h, n, 0, n / 4), right = band_mean(h, n, 3 * n / 4, n);
      EXPECT_GT(flip ? left : right, (flip ? right : left) + 10) << "seed " << seed;
      const std::vector<uint8_t> v = decode_jpeg_ok(vertical, t, seed);
      EXPECT_GT(band_mean(v, n, 3 * n / 4, n, true), band_mean(v, n, 0, n / 4, true) + 10);
    }
  }
}

// Images smaller than the output are upsampled. The pixels must be torchvision's with Pillow:
// the random crop cut out of the full decode, then Pillow's bilinear resample of it (computed
// here in doubles); or the whole image resampled, then the centre cut out. Within one level.
TEST(ImageDecoder, ImagesSmallerThanTheOutputAreUpsampledLikePillow) {
  constexpr int kSize = 64;
  for (const auto& [w, h] : std::vector<std::pair<int, int>>{{1, 1}, {7, 5}, {50, 40}, {3, 200}}) {
    const Bytes jpeg = smooth_jpeg(w, h, TJSAMP_444);
    const Decoded d = full_decode(jpeg);
    const ImageTransform random{.size = kSize, .random_flip = true};
    for (uint64_t seed = 0; seed < 5; ++seed) {
      const CropBox c = random_resized_crop_box(w, h, random, seed);
      std::vector<uint8_t> crop(size_t(c.width) * c.height * 3);
      for (int y = 0; y < c.height; ++y) {
        std::memcpy(&crop[size_t(y) * c.width * 3], &d.rgb[(size_t(c.y + y) * w + c.x) * 3],
                    size_t(c.width) * 3);
      }
      std::vector<uint8_t> want = pillow_resample(
          crop, c.width, c.height, {0, 0, double(c.width), double(c.height)}, kSize, kSize);
      if (c.flip) want = mirror(want, kSize);
      const std::vector<uint8_t> got = decode_jpeg_ok(jpeg, random, seed);
      EXPECT_LE(max_abs_diff(got, want), 1) << w << "x" << h << " seed " << seed;
      EXPECT_LT(mean_abs_diff(got, want), 0.02) << w << "x" << h << " seed " << seed;
    }
    // Resize(73) then CenterCrop(64), as torchvision does it.
    const ImageTransform centre{.mode = Mode::kResizeCenterCrop, .size = kSize, .resize = 73};
    const int short_side = std::min(w, h), long_side = std::max(w, h);
    const int new_long = int(73.0 * long_side / short_side);
    const int rw = w <= h ? 73 : new_long, rh = w <= h ? new_long : 73;
    const std::vector<uint8_t> resized =
        pillow_resample(d.rgb, w, h, {0, 0, double(w), double(h)}, rw, rh);
    const int left = int(std::nearbyint((rw - kSize) / 2.0)),
              top = int(std::nearbyint((rh - kSize) / 2.0));
    std::vector<uint8_t> want(size_t(kSize) * kSize * 3);
    for (int y = 0; y < kSize; ++y) {
      std::memcpy(&want[size_t(y) * kSize * 3], &resized[(size_t(top + y) * rw + left) * 3],
                  size_t(kSize) * 3);
    }
    const std::vector<uint8_t> got = decode_jpeg_ok(jpeg, centre, 0);
    EXPECT_LE(max_abs_diff(got, want), 1) << w << "x" << h << " centre crop";
    EXPECT_LT(mean_abs_diff(got, want), 0.02) << w << "x" << h << " centre crop";
  }
}

// ---- Colour spaces and encodings -------------------------------------------------------------

TEST(ImageDecoder, GrayscaleComesOutAsEqualChannels) {
  std::vector<uint8_t> gray(320 * 240);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = uint8_t((i % 320) * 255 / 319);
  const Bytes jpeg = encode(gray, 320, 240, TJPF_GRAY, TJSAMP_GRAY);
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const std::vector<uint8_t> out = decode_jpeg_ok(jpeg, ImageTransform{.size = 100}, seed);
    for (size_t i = 0; i < out.size(); i += 3) {
      ASSERT_EQ(out[i], out[i + 1]);
      ASSERT_EQ(out[i], out[i + 2]);
    }
    EXPECT_GT(band_mean(out, 100, 75, 100), band_mean(out, 100, 0, 25));
  }
}

TEST(ImageDecoder, CmykIsConvertedLikePillow) {
  // Stored (Adobe-inverted) CMYK: c = 255 means no cyan. No cyan or yellow, full magenta, no
  // black: magenta.
  std::vector<uint8_t> cmyk(256 * 256 * 4);
  for (size_t i = 0; i < cmyk.size(); i += 4) {
    cmyk[i + 0] = 255;
    cmyk[i + 1] = 0;
    cmyk[i + 2] = 255;
    cmyk[i + 3] = 255;
  }
  const Bytes jpeg = encode(cmyk, 256, 256, TJPF_CMYK, TJSAMP_444, 95);
  const std::vector<uint8_t> out = decode_jpeg_ok(jpeg, ImageTransform{.size = 32}, 1);
  for (size_t i = 0; i < out.size(); i += 3) {
    ASSERT_NEAR(out[i + 0], 255, 3);
    ASSERT_NEAR(out[i + 1], 0, 3);
    ASSERT_NEAR(out[i + 2], 255, 3);
  }
}

TEST(ImageDecoder, ProgressiveJpegDecodes) {
  const auto pixels = smooth_picture(600, 450);
  const Bytes baseline = encode(pixels, 600, 450, TJPF_RGB, TJSAMP_420, 90);
  const Bytes progressive = encode(pixels, 600, 450, TJPF_RGB, TJSAMP_420, 90, TJFLAG_PROGRESSIVE);
  for (uint64_t seed = 0; seed < 4; ++seed) {
    const ImageTransform t{.random_flip = true};
    EXPECT_LT(mean_abs_diff(decode_jpeg_ok(progressive, t, seed), decode_jpeg_ok(baseline, t, seed)), 1.0);
  }
}

// ---- Corrupt input ---------------------------------------------------------------------------

TEST(ImageDecoder, GarbageAndEmptyInputAreCorrupt) {
  ImageDecoder decoder;
  std::vector<uint8_t> out(224 * 224 * 3);
  const std::string garbage = testing::random_bytes(5000, 9);
  const Status g = decoder.decode(testing::to_bytes(garbage), ImageTransform{}, 0, out);
  EXPECT_EQ(g.code(), ErrorCode::kCorrupt);
  EXPECT_NE(g.message().find("not a JPEG, PNG or WebP image"), std::string::npos) << g.message();
  const Status e = decoder.decode({}, ImageTransform{}, 0, out);
  EXPECT_EQ(e.code(), ErrorCode::kCorrupt);
  EXPECT_NE(e.message().find("empty"), std::string::npos) << e.message();
  // A PNG signature with nothing after it.
  const Bytes png_start = testing::to_bytes(std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(decoder.decode(png_start, ImageTransform{}, 0, out).code(), ErrorCode::kCorrupt);
  // And the decoder still works afterwards.
  decode_jpeg_ok(decoder, smooth_jpeg(300, 300), ImageTransform{}, 0);
}

// A JPEG without Huffman tables (an abbreviated file, or a damaged one) decodes with the standard
// tables, as it would in a new decoder, not with the tables of the JPEG decoded before it.
TEST(ImageDecoder, AJpegWithoutTablesDecodesAsInANewDecoderWhateverCameBefore) {
  const Bytes baseline = smooth_jpeg(96, 64);  // TurboJPEG writes the standard tables
  Bytes abbreviated;                            // the same file without its DHT segments
  for (size_t i = 0; i < baseline.size();) {
    const bool marker = baseline[i] == std::byte(0xff) && i + 3 < baseline.size();
    const uint8_t type = marker ? uint8_t(baseline[i + 1]) : 0;
    if (marker && type != 0xd8 && type != 0xda) {
      const size_t length = (size_t(baseline[i + 2]) << 8 | size_t(baseline[i + 3])) + 2;
      if (type != 0xc4) abbreviated.insert(abbreviated.end(), baseline.begin() + long(i),
                                           baseline.begin() + long(i + length));
      i += length;
      continue;
    }
    if (type == 0xda) {  // the scan runs to the end of the file
      abbreviated.insert(abbreviated.end(), baseline.begin() + long(i), baseline.end());
      break;
    }
    abbreviated.insert(abbreviated.end(), baseline.begin() + long(i),
                       baseline.begin() + long(i + 2));
    i += 2;
  }
  ASSERT_LT(abbreviated.size(), baseline.size());
  const ImageTransform t{.size = 32};
  const std::vector<uint8_t> alone = decode_jpeg_ok(abbreviated, t, 1);
  EXPECT_EQ(alone, decode_jpeg_ok(baseline, t, 1));
  // After a progressive JPEG, whose tables are optimised for its own pixels.
  ImageDecoder decoder;
  decode_jpeg_ok(decoder, encode(ramp_picture(300, 200), 300, 200, TJPF_RGB, TJSAMP_444, 75,
                            TJFLAG_PROGRESSIVE),
            t, 2);
  EXPECT_EQ(decode_jpeg_ok(decoder, abbreviated, t, 1), alone);
}

TEST(ImageDecoder, TruncatedJpegIsCorruptWhenTheCropNeedsTheMissingRows) {
  const Bytes jpeg = smooth_jpeg(256, 256, TJSAMP_444);
  const Bytes cut(jpeg.begin(), jpeg.begin() + long(jpeg.size() * 4 / 10));
  ImageDecoder decoder;
  std::vector<uint8_t> out(224 * 224 * 3);
  const ImageTransform centre{.mode = Mode::kResizeCenterCrop};
  const Status s = decoder.decode(cut, centre, 0, out);
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
}

// A header that claims 60000x60000 pixels (a few hundred bytes that would cost seconds and
// gigabytes) is refused before decoding.
TEST(ImageDecoder, HugeDimensionsAreRefused) {
  for (const bool progressive : {true, false}) {
    Bytes jpeg = encode(smooth_picture(16, 16), 16, 16, TJPF_RGB, TJSAMP_420, 90,
                        progressive ? TJFLAG_PROGRESSIVE : 0);
    const uint8_t sof = progressive ? 0xC2 : 0xC0;
    size_t at = 2;
    while (at + 9 < jpeg.size() && !(uint8_t(jpeg[at]) == 0xFF && uint8_t(jpeg[at + 1]) == sof)) {
      at += 2 + ((size_t(uint8_t(jpeg[at + 2])) << 8) | uint8_t(jpeg[at + 3]));
    }
    ASSERT_LT(at + 9, jpeg.size());
    for (const size_t field : {at + 5, at + 7}) {  // height, width
      jpeg[field] = std::byte(60000 >> 8);
      jpeg[field + 1] = std::byte(60000 & 0xFF);
    }
    ImageDecoder decoder;
    std::vector<uint8_t> out(224 * 224 * 3);
    const Status s = decoder.decode(jpeg, ImageTransform{}, 0, out);
    EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
    EXPECT_NE(s.message().find("60000x60000"), std::string::npos) << s.message();
  }
}

// Every prefix of a JPEG, and a JPEG with bytes overwritten, either decodes or fails as
// kCorrupt: no crash, no exit() from libjpeg, and the decoder keeps working.
TEST(ImageDecoder, DamagedJpegsFailCleanly) {
  for (const bool progressive : {false, true}) {
    const auto pixels = smooth_picture(200, 150);
    const Bytes jpeg =
        encode(pixels, 200, 150, TJPF_RGB, TJSAMP_420, 85, progressive ? TJFLAG_PROGRESSIVE : 0);
    ImageDecoder decoder;
    std::vector<uint8_t> out(64 * 64 * 3);
    const ImageTransform t{.size = 64};
    int corrupt = 0;
    for (size_t n = 0; n < jpeg.size(); n += 13) {
      const Bytes cut(jpeg.begin(), jpeg.begin() + long(n));
      const Status s = decoder.decode(cut, t, n, out);
      EXPECT_TRUE(s.is_ok() || s.code() == ErrorCode::kCorrupt) << s.to_string();
      corrupt += !s.is_ok();
    }
    EXPECT_GT(corrupt, 0);
    const std::string noise = testing::random_bytes(jpeg.size(), 5);
    for (size_t at = 0; at + 16 < jpeg.size(); at += 29) {
      Bytes damaged = jpeg;
      for (size_t i = 0; i < 16; ++i) damaged[at + i] = std::byte(noise[at + i]);
      const Status s = decoder.decode(damaged, t, at, out);
      EXPECT_TRUE(s.is_ok() || s.code() == ErrorCode::kCorrupt ||
                  s.code() == ErrorCode::kUnsupported)
          << s.to_string();
    }
    EXPECT_EQ(decode_jpeg_ok(decoder, jpeg, t, 0), decode_jpeg_ok(jpeg, t, 0));
  }
}

}  // namespace
}  // namespace zerowait
