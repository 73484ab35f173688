// Small text helpers that several components need.
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace zerowait::internal {

// `text` with A-Z turned into a-z and every other byte kept: for names that compare without case
// (HTTP header names, URL schemes, file extensions), never for locale-dependent text.
inline std::string ascii_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// One number through a printf format ("%.1f %%"): the CLI's and the report's figures.
inline std::string printf_string(const char* format, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  return buffer;
}

// `value` with `digits` digits after the point ("12.35"), no grouping: table cells and figures.
inline std::string format_fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

// "0 B", "512 B", "1.50 KiB", "57.0 MiB", "2.00 GiB": binary units (like the CLI's size
// options), three significant digits. The CLI, the doctor and the report print sizes this way.
std::string format_bytes(uint64_t bytes);

// 1234.6 -> "1,235", 34000 -> "34,000"; `decimals` digits after the point (grouping the
// integer part); "-" for a value that is not finite.
std::string format_number(double value, int decimals = 0);

}  // namespace zerowait::internal
