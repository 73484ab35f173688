// xxHash with runtime CPU dispatch: on x86-64 the XXH3 calls pick the widest vector unit at run
// time (AVX2/AVX-512) instead of the SSE2 baseline the library is compiled for — several times
// faster on the hot paths of pack and verify. Include this instead of <xxhash.h>.
#pragma once

#include <xxhash.h>
#if defined(__x86_64__)
#include <emmintrin.h>
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

// Copies with non-temporal stores where the CPU has them (x86-64): each line of `dst` goes to
// memory without being read into the cache first, as a cached store does, and without evicting
// what the threads beside the copy work on. glibc's memcpy does the same above a few MiB, not
// for the chunks copy_into_xxh3 copies. Measured here (2 cores, 8 MiB L3), 50 MB in 128 KiB
// chunks: 7.8-8.9 ms with memcpy, 5.9-6.3 ms this way (one memcpy of all 50 MB: 5.2-5.6 ms).
inline void copy_bypassing_cache(std::byte* dst, const std::byte* src, size_t size) {
#if defined(__x86_64__)
  const size_t head = std::min(size, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= size; i += 64) {
    const auto* from = reinterpret_cast<const __m128i*>(src + i);
    auto* to = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_loadu_si128(from), b = _mm_loadu_si128(from + 1);
    const __m128i c = _mm_loadu_si128(from + 2), d = _mm_loadu_si128(from + 3);
    _mm_stream_si128(to, a);
    _mm_stream_si128(to + 1, b);
    _mm_stream_si128(to + 2, c);
    _mm_stream_si128(to + 3, d);
  }
  std::memcpy(dst + i, src + i, size - i);
  _mm_sfence();  // the streamed stores are seen before anything this thread stores next
#else
  std::memcpy(dst, src, size);
#endif
}

// Copies `size` bytes from `src` to `dst` and adds them to `stream`: each chunk is hashed right
// after it is copied, from the source's lines the copy has just brought into the cache, so the
// bytes cross the memory bus once for both (a copy, then a hash of `dst`, would read them twice:
// the copy's stores bypass the cache). The source and the copy are the same bytes unless
// something changes the source during the copy; a checkpoint's copy then fails the save (the
// tensors' versions are checked), and if the change escaped that check the stored checksum
// disagrees with the stored bytes, so a restore rejects the tensor instead of loading it torn.
inline void copy_into_xxh3(Xxh3Stream& stream, std::byte* dst, const std::byte* src, size_t size) {
  constexpr size_t kChunk = 128 << 10;  // its source's lines stay well inside a core's L2
  for (size_t offset = 0; offset < size; offset += kChunk) {
    const size_t n = std::min(kChunk, size - offset);
    copy_bypassing_cache(dst + offset, src + offset, n);
    stream.update(src + offset, n);
  }
}

}  // namespace zerowait::internal
