// xxHash with runtime CPU dispatch: on x86-64 the XXH3 calls pick the widest vector unit at run
// time (AVX2/AVX-512) instead of the SSE2 baseline the library is compiled for — several times
// faster on the hot paths of pack and verify. Include this instead of <xxhash.h>.
#pragma once

#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#include <cstddef>
#include <cstdint>

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

}  // namespace zerowait::internal
