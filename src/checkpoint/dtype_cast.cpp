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

uint32_t bits_of(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

float float_of(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// IEEE binary16 <-> binary32 by hand, round-to-nearest-even, NaN -> 0x7E00 (sign kept): the
// algorithm of the FP16 library (Maratyszcza/FP16), which torch's c10::Half uses, so results
// match `tensor.to(torch.float16)` bit for bit. Not _Float16: GCC lowers it to libgcc calls
// whose GCC_12 symbol versions a manylinux wheel may not need, and clang 14 (the sanitizer
// build) refuses it on x86-64.
float f16_bits_to_float(uint16_t h) {
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = float_of((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = float_of((two_w >> 17) | (126u << 23)) - 0.5f;
  return float_of(sign | (two_w < (1u << 27) ? bits_of(denormalized) : bits_of(normalized)));
}

uint16_t float_to_f16_bits(float f) {
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = bits_of(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = float_of((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = bits_of(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

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
      uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_bits_to_float(h);
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
      const uint16_t h = float_to_f16_bits(f);
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
