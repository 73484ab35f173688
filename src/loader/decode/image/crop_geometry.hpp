// The crop geometry behind ImageDecoder (image_transform.hpp): where in the source image a
// transform's output lies, and how coarsely a JPEG may be decoded for it.
#pragma once

#include <cstdint>

#include "loader/decode/image/resample.hpp"
#include "zerowait/loader/image_transform.hpp"

namespace zerowait::internal {

// The crop in full-resolution pixels: `box` is what the output shows, `domain` where the
// filter's edge clamps (the crop itself for RandomResizedCrop, which crops before resizing;
// the whole image for Resize + CenterCrop, which resizes first).
struct CropGeometry {
  Box box, domain;
  bool flip = false;
};

// The geometry of `t` for a width x height image (both > 0, `t` valid) and a sample's seed.
CropGeometry crop_geometry(int width, int height, const ImageTransform& t, uint64_t seed);

// The smallest DCT scale M/8 (M = 1, 2, 4 or 8) at which `box` still covers size x size pixels.
int dct_scale_for(const Box& box, int size);

}  // namespace zerowait::internal
