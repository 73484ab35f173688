// Little-endian encoding of the on-disk integers, independent of the host's byte order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zerowait::internal {

inline void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
// Overwrite 4 / 8 bytes of `out` at `offset` (which must leave room for them).
inline void set_u32(std::string& out, size_t offset, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[offset + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void set_u64(std::string& out, size_t offset, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[offset + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
inline uint32_t get_u32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint32_t>(p[i]);
  return v;
}
inline uint64_t get_u64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

}  // namespace zerowait::internal
