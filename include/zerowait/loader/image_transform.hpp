// JPEG, PNG or WebP bytes -> a fixed-size RGB image with torchvision's training and evaluation
// crops; a JPEG is decoded only as far and as finely as the crop needs. What the loader's decode
// stage runs per sample.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "zerowait/common/status.hpp"

namespace zerowait {

// What to make of a decoded image. The defaults are torchvision's RandomResizedCrop(224).
struct ImageTransform {
  enum class Mode {
    kRandomResizedCrop,  // RandomResizedCrop(size, scale, ratio): training
    kResizeCenterCrop,   // Resize(resize) then CenterCrop(size): evaluation
  };
  Mode mode = Mode::kRandomResizedCrop;
  int size = 224;  // the output is size x size x 3
  // kResizeCenterCrop: the shorter side is resized to this first; 0 = round(size * 256 / 224),
  // torchvision's evaluation convention (256 for 224). Must be >= size otherwise.
  int resize = 0;
  double scale_min = 0.08, scale_max = 1.0;         // crop area as a fraction of the image
  double ratio_min = 3.0 / 4, ratio_max = 4.0 / 3;  // crop width / height
  bool random_flip = false;  // mirror horizontally with p = 0.5 (RandomHorizontalFlip)
  // Decode at a DCT scale of M/8 (the smallest that keeps the crop at least `size` pixels in both
  // dimensions) instead of at full resolution. Much faster on large images; off gives PIL's
  // arithmetic on the full-resolution pixels.
  bool dct_downscale = true;

  // kInvalidArgument naming the first bad field and its value.
  Status validate() const;
  // `resize` with 0 replaced by its default.
  int resize_or_default() const;
};

// A crop rectangle in pixels of the full-resolution image, and whether the result is mirrored.
struct CropBox {
  int x = 0, y = 0, width = 0, height = 0;
  bool flip = false;
};

// The crop of torchvision.transforms.RandomResizedCrop.get_params for a width x height image:
// up to 10 tries of area = uniform(scale) * width * height and a log-uniform aspect ratio,
// w = round(sqrt(area * ratio)), h = round(sqrt(area / ratio)), taken when it fits, at a uniform
// position; otherwise the whole image cut to the nearest allowed ratio, centred. `flip` is drawn
// when t.random_flip. Every draw comes from `random_seed` through a PRNG of our own and IEEE
// arithmetic only (no std:: distributions, no libm), so a seed gives the same box everywhere.
// Needs width, height > 0 and a valid `t`; returns an empty box otherwise.
CropBox random_resized_crop_box(int width, int height, const ImageTransform& t,
                                uint64_t random_seed);

// The area of a width x height image that ImageDecoder::decode shows for `random_seed`, in pixels
// of the full-resolution image: random_resized_crop_box's for kRandomResizedCrop; for
// kResizeCenterCrop the centre crop of the resized image mapped back (fractional edges).
// Needs width, height > 0 and a valid `t`; returns an empty area otherwise.
struct CropArea {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  bool flip = false;
};
CropArea crop_area(int width, int height, const ImageTransform& t, uint64_t random_seed);

// What a decoder elsewhere (the loader's GPU stage, python/zerowait/gpu_decode.py) needs to make
// decode()'s output from a JPEG: the image's size and the area to show.
struct DeviceCrop {
  int width = 0, height = 0;  // of the full-resolution JPEG, from its header (0 for PNG, WebP)
  CropArea area;
  // The image was decoded here instead (into prepare_for_device's `pixels`): it is not a JPEG
  // that the device decodes like libjpeg (see prepare_for_device).
  bool decoded = false;
};

// The columns of an "image_device" field's "<field>.crop" rows (each row's DeviceCrop): the area
// shown (x0, y0, x1, y1, in pixels of the full-resolution image), flip (0 or 1), the JPEG's width
// and height, and decoded (1: the row's bytes are the output pixels, decoded on the CPU).
enum DeviceCropColumn : int {
  kDeviceCropX0,
  kDeviceCropY0,
  kDeviceCropX1,
  kDeviceCropY1,
  kDeviceCropFlip,
  kDeviceCropWidth,
  kDeviceCropHeight,
  kDeviceCropDecoded,
  kDeviceCropColumns,
};

// Decodes images into transformed images, reusing its buffers and its libjpeg state from call to
// call, so a worker that decodes image after image does not allocate once the buffers have grown
// to the largest image seen (the libraries' own per-image allocations aside). Not thread-safe: one
// decoder per thread; different decoders run in parallel freely. Move-only.
class ImageDecoder {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(ImageDecoder&&) noexcept;
  ImageDecoder& operator=(ImageDecoder&&) noexcept;
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Decodes `jpeg` (a JPEG, or a PNG or WebP, told by its signature) and writes
  // t.size * t.size * 3 bytes (rows top to bottom, RGB per pixel) to `out`. The crop and flip
  // depend only on (image dimensions, t, random_seed): the same seed gives the same pixels on any
  // machine and thread. Grayscale and CMYK JPEGs come out as RGB; PNG and WebP as Pillow's
  // convert("RGB") gives them (rgb_decode.hpp), with their own kCorrupt / kUnsupported reasons,
  // and other data is kCorrupt ("not a JPEG, PNG or WebP image").
  // Errors: kInvalidArgument for an invalid `t` or out.size() != t.size * t.size * 3; kCorrupt
  // when libjpeg-turbo cannot decode the part of the image the crop needs (the message gives
  // libjpeg's reason; data that ends before the needed rows is "truncated"), including progressive
  // files of more than 500 scans; kUnsupported for more than 178956970 pixels (Pillow's
  // decompression-bomb limit), colour spaces without an RGB conversion, or a decode needing more
  // than 1 GiB.
  Status decode(std::span<const std::byte> jpeg, const ImageTransform& t, uint64_t random_seed,
                std::span<uint8_t> out);

  // For a decode on a GPU: reads only the header of a JPEG and returns its size and the area
  // decode() would show. Images a GPU decoder would not decode as libjpeg does are decoded here
  // instead, exactly as decode() does, into `pixels` (t.size * t.size * 3 bytes; untouched
  // otherwise) and come back with `decoded` set: PNG and WebP, and JPEGs that are not 8-bit
  // 3-component YCbCr with Huffman coding (grayscale, CMYK, RGB, arithmetic-coded, 12-bit) or
  // whose data does not end with an EOI marker (truncated, or with trailing bytes; libjpeg then
  // says whether it decodes). Errors: decode()'s, for a header that does not parse, an image
  // over the pixel limit, and every image decoded here.
  Result<DeviceCrop> prepare_for_device(std::span<const std::byte> bytes, const ImageTransform& t,
                                        uint64_t random_seed, std::span<uint8_t> pixels);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zerowait
