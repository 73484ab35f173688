// xxHash with runtime CPU dispatch: on x86-64 the XXH3 calls pick the widest vector unit at run
// time (AVX2/AVX-512) instead of the SSE2 baseline the library is compiled for — several times
// faster on the hot paths of pack and verify. Include this instead of <xxhash.h>.
#pragma once

#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif
