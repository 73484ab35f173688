// Fuzzes the image transforms' decoders: whatever the bytes (a JPEG, PNG or WebP to start from,
// then anything), decode() returns ok, kCorrupt or kUnsupported, never crashes, and a decoder
// that failed decodes the next image as a fresh one would.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include <turbojpeg.h>

#include "zerowait/loader/image_transform.hpp"

namespace {

using namespace zerowait;

void check(bool ok) {
  if (!ok) std::abort();
}

// A JPEG that declares more pixels than this is not decoded. An 881-byte file can declare
// 32785 x 4121 pixels; the six decodes below took 14 s of it under the sanitizers (the two at
// full resolution, without DCT scaling, most of that), past libFuzzer's 10 s timeout. Large
// images test nothing small ones do not: OSS-Fuzz's libjpeg-turbo fuzzer bails out above
// 1 Mpixel for the same reason. (ImageDecoder refuses, from the header, what passes its own
// limit: Pillow's, 179 Mpixel.)
constexpr uint64_t kMaxFuzzPixels = 4 << 20;

bool declares_too_many_pixels(const uint8_t* data, size_t size) {
  // A handle per input: one kept across inputs kept the state of the last error too, and let
  // large images through.
  tjhandle handle = tjInitDecompress();
  if (handle == nullptr) return false;
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  const int read = tjDecompressHeader3(handle, data, static_cast<unsigned long>(size), &width,
                                       &height, &subsampling, &colorspace);
  // A warning (extraneous bytes before a marker...) still gives the size; an error means no
  // JPEG header was read, and decode() decides.
  const bool sized = read == 0 || tjGetErrorCode(handle) == TJERR_WARNING;
  tjDestroy(handle);
  return sized && uint64_t(width) * uint64_t(height) > kMaxFuzzPixels;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (declares_too_many_pixels(data, size)) return 0;
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
