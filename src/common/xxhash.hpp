// xxHash with runtime CPU dispatch: on x86-64 the XXH3 calls pick the widest vector unit at run
// time (AVX2/AVX-512) instead of the SSE2 baseline the library is compiled for — several times
// faster on the hot paths of pack and verify. Include this instead of <xxhash.h>.
#pragma once

#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace zerowait::internal {

// An XXH3-64 over bytes that arrive in pieces (owns the library's streaming state).
class Xxh3Stream {
 public:
  Xxh3Stream() : state_(XXH3_createState()) { XXH3_64bits_reset(state_); }
  ~Xxh3Stream() { XXH3_freeState(state_); }
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;

  void update(const void* data, size_t size) { XXH3_64bits_update(state_, data, size); }
  void reset() { XXH3_64bits_reset(state_); }
  uint64_t digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

// Copies `size` bytes from `src` to `dst` and adds them to `stream`: each chunk is hashed right
// after it is copied, while it is still in the cache, so the bytes cross the memory bus once for
// both (a copy, then a hash, reads them twice).
inline void copy_into_xxh3(Xxh3Stream& stream, std::byte* dst, const std::byte* src, size_t size) {
  constexpr size_t kChunk = 128 << 10;  // with its source's lines, well inside a core's L2
  for (size_t offset = 0; offset < size; offset += kChunk) {
    const size_t n = std::min(kChunk, size - offset);
    std::memcpy(dst + offset, src + offset, n);
    stream.update(dst + offset, n);
  }
}

}  // namespace zerowait::internal
