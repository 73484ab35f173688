#include "zerowait/loader/token_window.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>

#include "common/random.hpp"

namespace zerowait {

namespace {

// Longer than any context a model trains on, and small enough that a batch's rows fit in memory.
constexpr uint32_t kMaxSeqLen = 1u << 24;

// Widens `count` little-endian tokens of type T at `src` into int64 (a loop the compiler
// vectorizes: the copy runs at memory speed).
template <typename T>
void widen(const std::byte* src, uint64_t count, int64_t* dst) {
  static_assert(std::endian::native == std::endian::little, "tokens are stored little-endian");
  for (uint64_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, src + i * sizeof(T), sizeof(T));
    dst[i] = static_cast<int64_t>(value);
  }
}

}  // namespace

Status TokenWindow::validate() const {
  if (seq_len == 0 || seq_len > kMaxSeqLen) {
    return invalid_argument("token window seq_len must be between 1 and " +
                            std::to_string(kMaxSeqLen) + ", not " + std::to_string(seq_len));
  }
  return Status::ok();
}

Result<uint64_t> TokenWindow::decode(std::span<const std::byte> bytes, uint64_t seed,
                                     int64_t* row) const {
  const size_t width = token_bytes();
  if (bytes.size() % width != 0) {
    return corrupt("holds " + std::to_string(bytes.size()) + " bytes, not a whole number of " +
                   token_dtype_name(dtype) + " tokens");
  }
  const uint64_t tokens = bytes.size() / width;
  const uint64_t taken = std::min<uint64_t>(tokens, seq_len);
  uint64_t first = 0;
  if (random_offset && tokens > seq_len) {
    first = internal::mix64(seed) % (tokens - seq_len + 1);
  }
  const std::byte* src = bytes.data() + first * width;
  switch (dtype) {
    case DType::kUInt16:
      widen<uint16_t>(src, taken, row);
      break;
    case DType::kUInt32:
      widen<uint32_t>(src, taken, row);
      break;
    case DType::kInt32:
      widen<int32_t>(src, taken, row);
      break;
  }
  std::fill(row + taken, row + seq_len, pad);
  return taken;
}

Result<TokenWindow::DType> parse_token_dtype(const std::string& name) {
  if (name == "uint16") return TokenWindow::DType::kUInt16;
  if (name == "uint32") return TokenWindow::DType::kUInt32;
  if (name == "int32") return TokenWindow::DType::kInt32;
  return invalid_argument("unknown token dtype '" + name + "' (uint16, uint32 or int32)");
}

const char* token_dtype_name(TokenWindow::DType dtype) {
  switch (dtype) {
    case TokenWindow::DType::kUInt16:
      return "uint16";
    case TokenWindow::DType::kUInt32:
      return "uint32";
    case TokenWindow::DType::kInt32:
      return "int32";
  }
  return "?";
}

}  // namespace zerowait
