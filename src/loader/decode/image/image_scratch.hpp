// What an image decoder ("image", "image_device") reuses on one thread: its libjpeg state and
// buffers (ImageDecoder is not thread-safe; one per thread).
#pragma once

#include "zerowait/loader/field_decoder.hpp"
#include "zerowait/loader/image_transform.hpp"

namespace zerowait::internal {

struct ImageScratch final : DecodeScratch {
  ImageDecoder decoder;
};

}  // namespace zerowait::internal
