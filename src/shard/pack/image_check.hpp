// Cheap and full integrity checks of image files, used by pack to quarantine corrupt inputs.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

enum class ImageCheck {
  kHeader,  // structure only: markers/chunks walk, end marker present (microseconds)
  kDecode,  // full decode with libjpeg-turbo / libpng (warnings count as corruption)
};

// Checks `bytes` when `field` names an image type (jpg, jpeg, png, case-insensitive, also as the
// last part of a dotted field such as "seg.png"); any other field returns ok. A bad image is
// kCorrupt with a reason that says what is wrong ("truncated: no JPEG end-of-image marker").
Status check_image(std::string_view field, std::span<const std::byte> bytes, ImageCheck mode);

}  // namespace zerowait::internal
