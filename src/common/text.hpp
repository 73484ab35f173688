// Small text helpers that several components need.
#pragma once

#include <cctype>
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

}  // namespace zerowait::internal
