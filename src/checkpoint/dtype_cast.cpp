#include "checkpoint/dtype_cast.hpp"

#include <cmath>
#include <cstring>

namespace zerowait::internal {
namespace {

enum class Float { kF64, kF32, kF16, kBF16, kNone };

Float float_kind(std::string_view dtype) {
  if (dtype == "F64") return Float::kF64;
  if (dtype == "F32") return Float::kF32;
  if (dtype == "F16") return Float::kF16;
  if (dtype == "BF16") return Float::kBF16;
  return Float::kNone;
}

size_t size_of(Float kind) {
  switch (kind) {
    case Float::kF64: return 8;
    case Float::kF32: return 4;
    case Float::kF16:
    case Float::kBF16: return 2;
    case Float::kNone: break;
  }
  return 0;
}

// GCC and Clang's _Float16 converts with IEEE round-to-nearest-even (F16C where the CPU has it).
float load(Float kind, const std::byte* p) {
  switch (kind) {
    case Float::kF64: {
      double d;
      std::memcpy(&d, p, 8);
      return static_cast<float>(d);
    }
    case Float::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case Float::kF16: {
      _Float16 h;
      std::memcpy(&h, p, 2);
      return static_cast<float>(h);
    }
    case Float::kBF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      const uint32_t bits = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case Float::kNone: break;
  }
  return 0;
}

void store(Float kind, float f, std::byte* p) {
  switch (kind) {
    case Float::kF64: {
      const double d = f;
      std::memcpy(p, &d, 8);
      return;
    }
    case Float::kF32: std::memcpy(p, &f, 4); return;
    case Float::kF16: {
      const _Float16 h = static_cast<_Float16>(f);
      std::memcpy(p, &h, 2);
      return;
    }
    case Float::kBF16: {
      const uint16_t b = float_to_bf16_bits(f);
      std::memcpy(p, &b, 2);
      return;
    }
    case Float::kNone: return;
  }
}

// One loop per pair of dtypes, so the switches above fold away and the loop vectorizes.
template <Float From, Float To>
void cast_loop(const std::byte* src, std::byte* dst, uint64_t count) {
  constexpr size_t in = From == Float::kF64 ? 8 : From == Float::kF32 ? 4 : 2;
  constexpr size_t out = To == Float::kF64 ? 8 : To == Float::kF32 ? 4 : 2;
  for (uint64_t i = 0; i < count; ++i) store(To, load(From, src + i * in), dst + i * out);
}

template <Float From>
void cast_from(Float to, const std::byte* src, std::byte* dst, uint64_t count) {
  switch (to) {
    case Float::kF64: return cast_loop<From, Float::kF64>(src, dst, count);
    case Float::kF32: return cast_loop<From, Float::kF32>(src, dst, count);
    case Float::kF16: return cast_loop<From, Float::kF16>(src, dst, count);
    case Float::kBF16: return cast_loop<From, Float::kBF16>(src, dst, count);
    case Float::kNone: return;
  }
}

}  // namespace

uint16_t float_to_bf16_bits(float value) {
  if (std::isnan(value)) return 0x7FC0;
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

bool is_castable_float(std::string_view dtype) { return float_kind(dtype) != Float::kNone; }

void cast_floats(std::string_view from, std::span<const std::byte> src, std::string_view to,
                 std::span<std::byte> dst, uint64_t count) {
  const Float a = float_kind(from);
  const Float b = float_kind(to);
  if (a == b) {
    std::memcpy(dst.data(), src.data(), count * size_of(a));
    return;
  }
  switch (a) {
    case Float::kF64: return cast_from<Float::kF64>(b, src.data(), dst.data(), count);
    case Float::kF32: return cast_from<Float::kF32>(b, src.data(), dst.data(), count);
    case Float::kF16: return cast_from<Float::kF16>(b, src.data(), dst.data(), count);
    case Float::kBF16: return cast_from<Float::kBF16>(b, src.data(), dst.data(), count);
    case Float::kNone: return;
  }
}

}  // namespace zerowait::internal
