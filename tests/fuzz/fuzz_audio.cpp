// Fuzzes the audio clips' decoding: whatever the bytes (a WAV or FLAC to start from, then
// anything libsndfile recognises), decode() returns ok, kCorrupt or kUnsupported, never crashes
// or reads outside them, writes the whole row, and gives the same answer and samples again.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "zerowait/loader/audio_clip.hpp"

namespace {

using namespace zerowait;

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The fuzzer's buffer is exactly `size` bytes, so ASan catches a read past them.
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const uint64_t seed = size > 0 ? data[size - 1] : 0;
  for (const AudioClip& clip :
       {AudioClip{.length = 64, .channels = 1, .random_crop = true},
        AudioClip{.length = 300, .channels = 2},
        AudioClip{.length = 16, .channels = 1, .sample_rate = 8000}}) {
    // Decoded twice over rows filled with different bytes: a value decode() did not write, or
    // one that differs between runs, shows as a difference. (Bits, not floats: a float file may
    // hold NaNs.)
    std::vector<float> row(clip.row_bytes() / sizeof(float));
    std::vector<float> again(row.size());
    std::memset(row.data(), 0x5a, row.size() * sizeof(float));
    std::memset(again.data(), 0xa5, again.size() * sizeof(float));
    const Result<uint64_t> r = clip.decode(bytes, seed, row.data());
    const ErrorCode code = r.status().code();
    check(r.is_ok() || code == ErrorCode::kCorrupt || code == ErrorCode::kUnsupported);
    check(!r.is_ok() || *r <= clip.length);
    const Result<uint64_t> r2 = clip.decode(bytes, seed, again.data());
    check(r2.status().code() == code && r2.status().message() == r.status().message());
    if (r.is_ok()) check(*r2 == *r);
    check(std::memcmp(again.data(), row.data(), row.size() * sizeof(float)) == 0);
  }
  return 0;
}
