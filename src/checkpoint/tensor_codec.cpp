#include "checkpoint/tensor_codec.hpp"

#include <zstd.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>

namespace zerowait::internal {
namespace {

// Grouping moves byte b of element i between raw[i * k + b] and grouped[b * count + i]; kSplit
// says which way.
//
// Element sizes 2 and 4 (bf16/fp16, fp32) are nearly all checkpoint bytes: one pass with a constant
// stride, which GCC vectorises (with the dynamic cost model CMakeLists.txt sets for this file) to
// ~14 GB/s on a 4 MB chunk, 4x the scalar loop.
template <bool kSplit, uint32_t K>
void move_planes(const uint8_t* __restrict from, size_t count, uint8_t* __restrict to) {
  for (size_t i = 0; i < count; ++i) {
#pragma GCC unroll 4
    for (uint32_t b = 0; b < K; ++b) {
      if constexpr (kSplit) {
        to[b * count + i] = from[i * K + b];
      } else {
        to[i * K + b] = from[b * count + i];
      }
    }
  }
}

// Other sizes: a plane at a time, over blocks of elements small enough that the k passes over a
// block find it in L1 rather than memory.
template <bool kSplit>
void move_planes_generic(const uint8_t* __restrict from, size_t count, uint32_t k,
                         uint8_t* __restrict to) {
  constexpr size_t kBlockElements = 2048;
  for (size_t start = 0; start < count; start += kBlockElements) {
    const size_t end = std::min(count, start + kBlockElements);
    for (uint32_t b = 0; b < k; ++b) {
      for (size_t i = start; i < end; ++i) {
        if constexpr (kSplit) {
          to[b * count + i] = from[i * k + b];
        } else {
          to[i * k + b] = from[b * count + i];
        }
      }
    }
  }
}

template <bool kSplit>
void regroup(std::span<const std::byte> from, uint32_t element_size, std::span<std::byte> to) {
  assert(from.size() == to.size());
  const size_t count = element_size == 0 ? 0 : from.size() / element_size;
  const auto* in = reinterpret_cast<const uint8_t*>(from.data());
  auto* out = reinterpret_cast<uint8_t*>(to.data());
  switch (element_size) {
    case 2:
      move_planes<kSplit, 2>(in, count, out);
      break;
    case 4:
      move_planes<kSplit, 4>(in, count, out);
      break;
    default:
      move_planes_generic<kSplit>(in, count, element_size, out);
  }
  // A trailing partial element (not expected) is kept as is, so the transform always inverts.
  const size_t whole = count * element_size;
  if (whole < from.size()) std::memcpy(out + whole, in + whole, from.size() - whole);
}

// One context per thread, reused: creating one costs more than compressing a small chunk.
struct ZstdContexts {
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  ~ZstdContexts() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }
};

ZstdContexts& thread_contexts() {
  thread_local ZstdContexts contexts;
  return contexts;
}

}  // namespace

void group_bytes(std::span<const std::byte> raw, uint32_t element_size,
                 std::span<std::byte> grouped) {
  regroup<true>(raw, element_size, grouped);
}

void ungroup_bytes(std::span<const std::byte> grouped, uint32_t element_size,
                   std::span<std::byte> raw) {
  regroup<false>(grouped, element_size, raw);
}

uint64_t chunk_count(uint64_t raw_size, uint64_t chunk_bytes) {
  assert(chunk_bytes > 0);
  return raw_size / chunk_bytes + (raw_size % chunk_bytes != 0);
}

uint64_t chunk_raw_size(uint64_t raw_size, uint64_t chunk_bytes, uint64_t index) {
  assert(chunk_bytes > 0);
  if (index >= chunk_count(raw_size, chunk_bytes)) return 0;
  return std::min(chunk_bytes, raw_size - index * chunk_bytes);
}

Result<uint64_t> compress_chunk(std::span<const std::byte> raw, const CodecOptions& options,
                                std::vector<std::byte>& out, std::vector<std::byte>& scratch) {
  ZstdContexts& contexts = thread_contexts();
  if (contexts.cctx == nullptr) {
    return Status(ErrorCode::kResourceExhausted, "cannot allocate a zstd compression context");
  }
  std::span<const std::byte> source = raw;
  if (options.element_size > 1) {
    scratch.resize(raw.size());
    group_bytes(raw, options.element_size, scratch);
    source = std::span<const std::byte>(scratch.data(), raw.size());
  }
  const size_t start = out.size();
  const size_t bound = ZSTD_compressBound(source.size());
  out.resize(start + bound);
  const size_t written = ZSTD_compressCCtx(contexts.cctx, out.data() + start, bound, source.data(),
                                           source.size(), options.zstd_level);
  if (ZSTD_isError(written)) {
    out.resize(start);
    return Status(ErrorCode::kInternal, "zstd cannot compress a chunk of " +
                                            std::to_string(raw.size()) +
                                            " bytes: " + ZSTD_getErrorName(written));
  }
  out.resize(start + written);
  return static_cast<uint64_t>(written);
}

Status decompress_chunk(std::span<const std::byte> frame, const CodecOptions& options,
                        std::span<std::byte> raw, std::vector<std::byte>& scratch,
                        const std::string& what) {
  auto fail = [&](const std::string& why) {
    return corrupt(what + ": compressed chunk of " + std::to_string(frame.size()) + " bytes " +
                   why);
  };
  const unsigned long long content_size = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (content_size == ZSTD_CONTENTSIZE_ERROR) return fail("is not a zstd frame");
  if (content_size == ZSTD_CONTENTSIZE_UNKNOWN) return fail("does not state its raw size");
  if (content_size != raw.size()) {
    return fail("holds " + std::to_string(content_size) + " raw bytes, expected " +
                std::to_string(raw.size()));
  }
  // Bytes after the frame mean the chunk boundaries are wrong; zstd would decode them as more
  // frames.
  const size_t frame_size = ZSTD_findFrameCompressedSize(frame.data(), frame.size());
  if (ZSTD_isError(frame_size) || frame_size != frame.size()) {
    return fail(ZSTD_isError(frame_size)
                    ? std::string("is truncated or damaged: ") + ZSTD_getErrorName(frame_size)
                    : "has " + std::to_string(frame.size() - frame_size) +
                          " bytes after its zstd frame");
  }

  ZstdContexts& contexts = thread_contexts();
  if (contexts.dctx == nullptr) {
    return Status(ErrorCode::kResourceExhausted, "cannot allocate a zstd decompression context");
  }
  std::span<std::byte> target = raw;
  if (options.element_size > 1) {
    scratch.resize(raw.size());
    target = std::span<std::byte>(scratch.data(), raw.size());
  }
  const size_t produced =
      ZSTD_decompressDCtx(contexts.dctx, target.data(), target.size(), frame.data(), frame.size());
  if (ZSTD_isError(produced)) {
    return fail(std::string("is damaged: ") + ZSTD_getErrorName(produced));
  }
  if (produced != raw.size()) {
    return fail("decompressed to " + std::to_string(produced) + " bytes, expected " +
                std::to_string(raw.size()));
  }
  if (options.element_size > 1) ungroup_bytes(target, options.element_size, raw);
  return Status::ok();
}

}  // namespace zerowait::internal
