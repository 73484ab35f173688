#include "loader/decode/image/resample.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace zerowait::internal {
namespace {

// Weights are int16 with this many fractional bits: 1.0 (an identity tap) still fits, and 255
// times the weights of a pixel (about 2^14 in all) stays far from int32 overflow.
constexpr int kWeightBits = 14;
constexpr int32_t kRoundingBias = 1 << (kWeightBits - 1);
constexpr int kChannels = 3;
// Spare bytes after the intermediate rows: the SIMD horizontal pass stores 4 bytes per pixel.
constexpr size_t kRowsSlack = 16;

// Pillow's bilinear filter: a triangle of support 1.
double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

uint8_t clip8(int32_t v) {
  if (v <= 0) return 0;
  if (v >= (255 << kWeightBits)) return 255;
  return static_cast<uint8_t>(v >> kWeightBits);
}

// Two adjacent int16 weights as the int32 that _mm_madd_epi16 pairs with two adjacent inputs.
int32_t weight_pair(const int16_t* w) {
  int32_t pair;
  std::memcpy(&pair, w, sizeof pair);
  return pair;
}

// One output pixel of the horizontal pass, portable: the reference for the SIMD version.
void horizontal_pixel(const uint8_t* in, const int16_t* w, int n, uint8_t* out) {
  int32_t r = kRoundingBias, g = kRoundingBias, b = kRoundingBias;
  for (int k = 0; k < n; ++k) {
    r += in[k * 3 + 0] * w[k];
    g += in[k * 3 + 1] * w[k];
    b += in[k * 3 + 2] * w[k];
  }
  out[0] = clip8(r);
  out[1] = clip8(g);
  out[2] = clip8(b);
}

#if defined(__SSE2__)
// Loads 8 bytes from `in` (two RGB pixels and two bytes more) and pairs the two pixels'
// channels as int16 (r0 r1 g0 g1 b0 b1 . .), ready for _mm_madd_epi16 with a weight pair.
__m128i load_pixel_pair(const uint8_t* in) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(in));
  const __m128i words = _mm_unpacklo_epi8(bytes, _mm_setzero_si128());
  return _mm_unpacklo_epi16(words, _mm_srli_si128(words, 6));
}

// Output pixels [begin, end) of a horizontal pass row with kPairs pairs of taps each, the same
// integers as horizontal_pixel. Reads up to 2 bytes past a pixel's last pair and writes 4 bytes
// per pixel. `pairs4` holds each pixel's weight pairs, each repeated for the 4 lanes.
template <int kPairs>
void horizontal_span_sse2(const uint8_t* in, const int32_t* first, const int32_t* pairs4, int begin,
                          int end, uint8_t* out) {
  for (int x = begin; x < end; ++x) {
    const uint8_t* p = in + size_t(first[x]) * 3;
    const __m128i* w = reinterpret_cast<const __m128i*>(pairs4 + size_t(x) * kPairs * 4);
    __m128i sum = _mm_set1_epi32(kRoundingBias);
    for (int j = 0; j < kPairs; ++j) {
      sum = _mm_add_epi32(sum, _mm_madd_epi16(load_pixel_pair(p + j * 6), _mm_loadu_si128(w + j)));
    }
    sum = _mm_srai_epi32(sum, kWeightBits);
    sum = _mm_packs_epi32(sum, sum);
    sum = _mm_packus_epi16(sum, sum);
    const int32_t rgbx = _mm_cvtsi128_si32(sum);
    std::memcpy(out + size_t(x) * 3, &rgbx, 4);
  }
}

// 16 bytes of one output row of the vertical pass: sum over tap pairs of two input rows
// interleaved byte by byte, so one _mm_madd_epi16 applies two taps.
void vertical_block_sse2(const uint8_t* in, size_t row_bytes, const int16_t* w, int n,
                         uint8_t* out) {
  const __m128i zero = _mm_setzero_si128();
  __m128i s0 = _mm_set1_epi32(kRoundingBias), s1 = s0, s2 = s0, s3 = s0;
  for (int k = 0; k < n; k += 2) {
    const uint8_t* row0 = in + size_t(k) * row_bytes;
    const uint8_t* row1 = k + 1 < n ? row0 + row_bytes : row0;  // weight 0 when past the end
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row0));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row1));
    const __m128i pair = _mm_set1_epi32(weight_pair(w + k));
    const __m128i lo = _mm_unpacklo_epi8(a, b), hi = _mm_unpackhi_epi8(a, b);
    s0 = _mm_add_epi32(s0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), pair));
    s1 = _mm_add_epi32(s1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), pair));
    s2 = _mm_add_epi32(s2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), pair));
    s3 = _mm_add_epi32(s3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), pair));
  }
  const __m128i lo =
      _mm_packs_epi32(_mm_srai_epi32(s0, kWeightBits), _mm_srai_epi32(s1, kWeightBits));
  const __m128i hi =
      _mm_packs_epi32(_mm_srai_epi32(s2, kWeightBits), _mm_srai_epi32(s3, kWeightBits));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(lo, hi));
}
#endif

}  // namespace

// The geometry of Pillow's precompute_coeffs (libImaging/Resample.c), so the same box reads the
// same pixels with the same (normalised) weights.
void ResampleAxis::compute(double in0, double in1, int in_size, int out_size, bool reverse) {
  const double scale = (in1 - in0) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;
  const double inv_scale = 1.0 / filter_scale;
  first.resize(out_size);
  count.resize(out_size);
  auto center_of = [&](int i) { return in0 + (i + 0.5) * scale; };
  int max_count = 0;
  for (int i = 0; i < out_size; ++i) {
    const double center = center_of(i);
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    const int slot = reverse ? out_size - 1 - i : i;
    first[slot] = lo;
    count[slot] = std::max(hi - lo, 0);
    max_count = std::max(max_count, count[slot]);
  }
  taps = std::max(2, (max_count + 1) & ~1);
  weights.assign(size_t(out_size) * taps, 0);
  for (int i = 0; i < out_size; ++i) {
    const int slot = reverse ? out_size - 1 - i : i;
    const double center = center_of(i);
    const int lo = first[slot], n = count[slot];
    const auto tap = [&](int k) { return triangle((k + lo - center + 0.5) * inv_scale); };
    double sum = 0.0;
    for (int k = 0; k < n; ++k) sum += tap(k);
    int16_t* fixed = &weights[size_t(slot) * taps];
    for (int k = 0; k < n; ++k) {
      const double normalized = sum != 0.0 ? tap(k) / sum : tap(k);
      fixed[k] = static_cast<int16_t>(normalized * (1 << kWeightBits) + 0.5);  // weights >= 0
    }
  }
  // Pillow keeps zero weights at either end of a window (an upscale's windows have 2 or 3 taps
  // for 2 non-zero weights); they only cost time, so drop them and narrow the rows to match.
  int widest = 0;
  for (int slot = 0; slot < out_size; ++slot) {
    int16_t* w = &weights[size_t(slot) * taps];
    int b = 0, e = count[slot];
    while (b < e && w[b] == 0) ++b;
    while (e > b && w[e - 1] == 0) --e;
    std::memmove(w, w + b, sizeof(int16_t) * (e - b));
    std::fill(w + (e - b), w + taps, int16_t{0});
    first[slot] += b;
    count[slot] = e - b;
    widest = std::max(widest, e - b);
  }
  const int narrow = std::max(2, (widest + 1) & ~1);
  if (narrow < taps) {
    for (int slot = 0; slot < out_size; ++slot) {  // moves left only: in order is safe
      std::memmove(&weights[size_t(slot) * narrow], &weights[size_t(slot) * taps],
                   sizeof(int16_t) * narrow);
    }
    weights.resize(size_t(out_size) * narrow);
    taps = narrow;
  }
}

void Resampler::plan(int width, int height, const Box& box, int out_width, int out_height,
                     bool flip) {
  assert(out_width > 0 && out_height > 0);
  horizontal_.compute(box.x0, box.x1, width, out_width, flip);
  vertical_.compute(box.y0, box.y1, height, out_height, false);
  auto bounds = [](const ResampleAxis& axis, int* begin, int* end) {
    *begin = *std::min_element(axis.first.begin(), axis.first.end());
    *end = 0;
    for (size_t i = 0; i < axis.first.size(); ++i) {
      *end = std::max(*end, axis.first[i] + axis.count[i]);
    }
  };
  bounds(horizontal_, &first_column_, &end_column_);
  bounds(vertical_, &first_row_, &end_row_);
  // Taps relative to the first needed input, which is where add_row's pointer and rows_ start.
  for (int32_t& f : horizontal_.first) f -= first_column_;
  for (int32_t& f : vertical_.first) f -= first_row_;
  out_width_ = out_width;
  out_height_ = out_height;
  rows_added_ = 0;

  // The SIMD horizontal pass applies all taps of the axis to every pixel (the extra weights are
  // 0) and reads 8 bytes at each pair: pixels near the row's end whose reads would run past it
  // go the portable way. first[] is monotonic, so the others form one range.
  const int taps = horizontal_.taps;
  const size_t in_bytes = size_t(end_column_ - first_column_) * kChannels;
  auto simd_safe = [&](int x) {
    return size_t(horizontal_.first[x] + taps - 2) * kChannels + 8 <= in_bytes;
  };
  simd_begin_ = 0;
  while (simd_begin_ < out_width && !simd_safe(simd_begin_)) ++simd_begin_;
  simd_end_ = simd_begin_;
  while (simd_end_ < out_width && simd_safe(simd_end_)) ++simd_end_;
  weight_pairs4_.resize(size_t(out_width) * taps * 2);
  for (size_t i = 0; i < size_t(out_width) * taps / 2; ++i) {
    const int32_t pair = weight_pair(&horizontal_.weights[i * 2]);
    for (int lane = 0; lane < 4; ++lane) weight_pairs4_[i * 4 + lane] = pair;
  }
}

uint64_t Resampler::intermediate_bytes() const {
  return uint64_t(end_row_ - first_row_) * uint64_t(out_width_) * kChannels;
}

void Resampler::add_row(const uint8_t* rgb) {
  const size_t row_bytes = size_t(out_width_) * kChannels;
  if (rows_added_ == 0 && rows_.size() < intermediate_bytes() + kRowsSlack) {
    rows_.resize(intermediate_bytes() + kRowsSlack);
  }
  assert(rows_added_ < end_row_ - first_row_);
  uint8_t* out = rows_.data() + size_t(rows_added_) * row_bytes;
  ++rows_added_;
  int begin = 0, end = 0;  // the pixels done with SIMD
#if defined(__SSE2__)
  begin = simd_begin_;
  end = simd_end_;
  const int32_t* first = horizontal_.first.data();
  const int32_t* pairs4 = weight_pairs4_.data();
  switch (horizontal_.taps / 2) {
    case 1:
      horizontal_span_sse2<1>(rgb, first, pairs4, begin, end, out);
      break;
    case 2:
      horizontal_span_sse2<2>(rgb, first, pairs4, begin, end, out);
      break;
    case 3:
      horizontal_span_sse2<3>(rgb, first, pairs4, begin, end, out);
      break;
    case 4:
      horizontal_span_sse2<4>(rgb, first, pairs4, begin, end, out);
      break;
    default:
      begin = end = 0;  // strong downscales: few output pixels per input, portable path
  }
#endif
  const int taps = horizontal_.taps;
  for (int x = 0; x < out_width_; ++x) {
    if (x == begin) x = end;
    if (x >= out_width_) break;
    horizontal_pixel(rgb + size_t(horizontal_.first[x]) * kChannels,
                     &horizontal_.weights[size_t(x) * taps], horizontal_.count[x],
                     out + size_t(x) * kChannels);
  }
}

void Resampler::finish(std::span<uint8_t> out) {
  const size_t row_bytes = size_t(out_width_) * kChannels;
  assert(out.size() == row_bytes * out_height_);
  assert(rows_added_ == end_row_ - first_row_);
  const int taps = vertical_.taps;
  for (int y = 0; y < out_height_; ++y) {
    const uint8_t* in = rows_.data() + size_t(vertical_.first[y]) * row_bytes;
    const int16_t* w = &vertical_.weights[size_t(y) * taps];
    const int n = vertical_.count[y];
    uint8_t* o = out.data() + size_t(y) * row_bytes;
    size_t i = 0;
#if defined(__SSE2__)
    for (; i + 16 <= row_bytes; i += 16) vertical_block_sse2(in + i, row_bytes, w, n, o + i);
#endif
    for (; i < row_bytes; ++i) {
      int32_t sum = kRoundingBias;
      for (int k = 0; k < n; ++k) sum += in[size_t(k) * row_bytes + i] * w[k];
      o[i] = clip8(sum);
    }
  }
}

void resample_rgb(const uint8_t* pixels, int width, int height, size_t stride, const Box& box,
                  int out_width, int out_height, bool flip, std::span<uint8_t> out) {
  Resampler resampler;
  resampler.plan(width, height, box, out_width, out_height, flip);
  for (int y = resampler.first_row(); y < resampler.end_row(); ++y) {
    resampler.add_row(pixels + size_t(y) * stride + size_t(resampler.first_column()) * kChannels);
  }
  resampler.finish(out);
}

}  // namespace zerowait::internal
