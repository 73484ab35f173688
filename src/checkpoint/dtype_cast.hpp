// Casts between the floating-point dtypes an export writes (safetensors names "F64", "F32",
// "F16", "BF16"), with torch's rounding: every cast goes through float32 (as torch's scalar
// conversions do) and rounds to nearest even; float32 -> bf16 maps NaN to 0x7FC0, as
// c10::BFloat16 does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace zerowait::internal {

// Whether `dtype` is one of the four dtypes cast_floats converts.
bool is_castable_float(std::string_view dtype);

// Converts `count` elements of dtype `from` in `src` into dtype `to` in `dst` (which holds
// count × the size of `to`). Both dtypes must be castable (see above); equal dtypes copy.
void cast_floats(std::string_view from, std::span<const std::byte> src, std::string_view to,
                 std::span<std::byte> dst, uint64_t count);

// float32 -> bfloat16 bits, rounding to nearest even.
uint16_t float_to_bf16_bits(float value);

}  // namespace zerowait::internal
