// zstd compression of tensor bytes, with optional byte grouping: an element of k bytes is split
// into k planes (byte 0 of every element, then byte 1, ...) before compression, so the exponent
// bytes of floating-point values, which repeat a lot, sit together and compress, instead of being
// interleaved with mantissa bytes, which look random. Data is cut into chunks of `chunk_bytes` raw
// bytes (a multiple of the element size) compressed independently, so several threads can
// compress or decompress one large tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

struct CodecOptions {
  int zstd_level = 3;
  uint32_t element_size = 1;  // byte grouping is off when 1
  uint64_t chunk_bytes = 4 << 20;
};

// Splits `raw` (a whole number of `element_size` elements; a trailing partial one is copied as
// is) into byte planes in `grouped` (same size), and back.
void group_bytes(std::span<const std::byte> raw, uint32_t element_size,
                 std::span<std::byte> grouped);
void ungroup_bytes(std::span<const std::byte> grouped, uint32_t element_size,
                   std::span<std::byte> raw);

// The raw size of chunk `index` of a tensor of `raw_size` bytes cut into `chunk_bytes` chunks.
uint64_t chunk_raw_size(uint64_t raw_size, uint64_t chunk_bytes, uint64_t index);
uint64_t chunk_count(uint64_t raw_size, uint64_t chunk_bytes);

// Compresses one chunk (byte grouping first when options.element_size > 1); appends the zstd frame
// to `out` and returns its size. `scratch` is reused between calls.
Result<uint64_t> compress_chunk(std::span<const std::byte> raw, const CodecOptions& options,
                                std::vector<std::byte>& out, std::vector<std::byte>& scratch);

// Decompresses one frame into `raw` (its exact raw size) and undoes byte grouping. kCorrupt
// naming `what` when the frame is damaged or decompresses to another size.
Status decompress_chunk(std::span<const std::byte> frame, const CodecOptions& options,
                        std::span<std::byte> raw, std::vector<std::byte>& scratch,
                        const std::string& what);

}  // namespace zerowait::internal
