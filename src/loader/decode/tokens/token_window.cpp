#include "zerowait/loader/token_window.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "common/random.hpp"

namespace zerowait {

namespace {

// Longer than any context a model trains on, and small enough that a batch's rows fit in memory.
constexpr uint32_t kMaxSeqLen = 1u << 24;

// Widens `count` little-endian tokens of type T at `src` into Out (a loop the compiler
// vectorizes: the copy runs at memory speed). False when a value does not fit Out.
template <typename T, typename Out>
bool widen(const std::byte* src, uint64_t count, Out* dst) {
  static_assert(std::endian::native == std::endian::little, "tokens are stored little-endian");
  bool fits = true;
  for (uint64_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, src + i * sizeof(T), sizeof(T));
    dst[i] = static_cast<Out>(value);
    if constexpr (sizeof(T) == sizeof(Out) && std::is_unsigned_v<T> && std::is_signed_v<Out>) {
      fits &= value <= T(std::numeric_limits<Out>::max());
    }
  }
  return fits;
}

template <typename Out>
bool widen_as(TokenWindow::DType dtype, const std::byte* src, uint64_t count, Out* dst) {
  switch (dtype) {
    case TokenWindow::DType::kUInt16:
      return widen<uint16_t>(src, count, dst);
    case TokenWindow::DType::kUInt32:
      return widen<uint32_t>(src, count, dst);
    case TokenWindow::DType::kInt32:
      return widen<int32_t>(src, count, dst);
  }
  return false;
}

}  // namespace

Status TokenWindow::validate() const {
  if (seq_len == 0 || seq_len > kMaxSeqLen) {
    return invalid_argument("token window seq_len must be between 1 and " +
                            std::to_string(kMaxSeqLen) + ", not " + std::to_string(seq_len));
  }
  if (int32_rows && (pad < std::numeric_limits<int32_t>::min() ||
                     pad > std::numeric_limits<int32_t>::max())) {
    return invalid_argument("token window pad " + std::to_string(pad) + " does not fit int32 rows");
  }
  return Status::ok();
}

Result<uint64_t> TokenWindow::decode(std::span<const std::byte> bytes, uint64_t seed,
                                     std::byte* row) const {
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
  if (int32_rows) {
    auto* out = reinterpret_cast<int32_t*>(row);
    if (!widen_as(dtype, src, taken, out)) {
      return corrupt("holds a uint32 token over 2147483647, which an int32 row cannot hold");
    }
    std::fill(out + taken, out + seq_len, static_cast<int32_t>(pad));
  } else {
    auto* out = reinterpret_cast<int64_t*>(row);
    widen_as(dtype, src, taken, out);
    std::fill(out + taken, out + seq_len, pad);
  }
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
