// Antialiased bilinear resampling of 8-bit RGB with Pillow's filter (Image.resize(BILINEAR,
// box=...)): a triangle whose support widens with the downscale factor, taps clamped at the image
// edge, a horizontal pass into 8-bit rows, then a vertical pass. Weights are 14-bit fixed point
// (Pillow uses 22 bits) so that SSE2 multiplies two taps per instruction; results differ from
// Pillow's by at most one level, rarely. The SSE2 and portable paths compute the same integers, so
// every machine gives the same bytes. Rows are fed one at a time, so a decoder can resample
// scanlines as they come out of libjpeg.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace zerowait::internal {

// A rectangle in pixel coordinates (pixel i covers [i, i + 1)); fractional edges are allowed.
struct Box {
  double x0, y0, x1, y1;
};

// The filter taps of one axis: output i reads count[i] inputs from first[i] on, with weights
// weights[i * taps ...] (fixed point; taps is the largest count rounded up to even, the rest 0).
// Windows are Pillow's without the zero weights at their ends.
struct ResampleAxis {
  std::vector<int32_t> first;
  std::vector<int32_t> count;
  std::vector<int16_t> weights;
  int taps = 0;

  // Taps for `out_size` outputs covering [in0, in1) of an axis of `in_size` pixels. Output i takes
  // the taps of output out_size - 1 - i when `reverse`: a mirrored result for free. Keeps its
  // capacity between calls.
  void compute(double in0, double in1, int in_size, int out_size, bool reverse);
};

// Resamples `box` of an image of `width` x `height` RGB pixels to out_width x out_height.
// Call plan(), then add_row() for each input row in [first_row(), end_row()) in order, then
// finish(). Reuses its buffers from plan to plan. Not thread-safe.
class Resampler {
 public:
  // `flip` mirrors the result horizontally. The box must lie within the image.
  void plan(int width, int height, const Box& box, int out_width, int out_height, bool flip);

  // The input rows and columns the result depends on; the rest need not be decoded.
  int first_row() const { return first_row_; }
  int end_row() const { return end_row_; }
  int first_column() const { return first_column_; }
  int end_column() const { return end_column_; }

  // Bytes of intermediate rows the plan needs (allocated by the first add_row, so a caller can
  // refuse an absurd plan first).
  uint64_t intermediate_bytes() const;

  // Takes the next input row: `rgb` points at its pixel first_column(), and
  // end_column() - first_column() pixels follow.
  void add_row(const uint8_t* rgb);

  // Writes the out_height rows of out_width * 3 bytes, once every row has been added.
  void finish(std::span<uint8_t> out);

 private:
  ResampleAxis horizontal_;
  ResampleAxis vertical_;
  int first_row_ = 0, end_row_ = 0, first_column_ = 0, end_column_ = 0;
  int out_width_ = 0;
  int out_height_ = 0;
  int rows_added_ = 0;
  int simd_begin_ = 0, simd_end_ = 0;   // output pixels the SIMD horizontal pass handles
  std::vector<int32_t> weight_pairs4_;  // horizontal weight pairs, each repeated 4 times
  std::vector<uint8_t> rows_;           // horizontally resampled rows first_row() .. end_row() - 1
};

// A whole-image convenience over Resampler: `box` of the `width` x `height` RGB image whose rows
// are `stride` bytes apart, into out (out_width * out_height * 3 bytes).
void resample_rgb(const uint8_t* pixels, int width, int height, size_t stride, const Box& box,
                  int out_width, int out_height, bool flip, std::span<uint8_t> out);

}  // namespace zerowait::internal
