// Fuzzes the image transforms' decoders: whatever the bytes (a JPEG, PNG or WebP to start from,
// then anything), decode() returns ok, kCorrupt or kUnsupported, never crashes, and a decoder
// that failed decodes the next image as a fresh one would.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "zerowait/loader/image_transform.hpp"

namespace {

using namespace zerowait;

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ImageDecoder decoder;  // one per worker thread in the loader: kept across inputs too
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const uint64_t seed = size > 0 ? data[size - 1] : 0;
  for (const ImageTransform& t :
       {ImageTransform{.size = 24, .random_flip = true},
        ImageTransform{.mode = ImageTransform::Mode::kResizeCenterCrop, .size = 16},
        ImageTransform{.size = 20, .dct_downscale = false}}) {
    std::vector<uint8_t> out(size_t(t.size) * t.size * 3);
    const Status s = decoder.decode(bytes, t, seed, out);
    check(s.is_ok() || s.code() == ErrorCode::kCorrupt || s.code() == ErrorCode::kUnsupported);
    // Decoding the same input again with a fresh decoder gives the same answer and pixels.
    ImageDecoder fresh;
    std::vector<uint8_t> again(out.size());
    const Status t2 = fresh.decode(bytes, t, seed, again);
    check(t2.code() == s.code());
    if (s.is_ok()) check(again == out);
  }
  return 0;
}
