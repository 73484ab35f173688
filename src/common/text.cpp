#include "common/text.hpp"

#include <cmath>
#include <iterator>

namespace zerowait::internal {

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  // Three significant digits: "1.50 GiB", "57.0 MiB", "512 KiB".
  const char* format = value < 10 ? "%.2f " : value < 100 ? "%.1f " : "%.0f ";
  return printf_string(format, value) + kUnits[unit];
}

std::string format_number(double value, int decimals) {
  if (!std::isfinite(value)) return "-";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, std::fabs(value));
  const std::string digits = buffer;
  const size_t point = digits.find('.');
  const std::string whole = digits.substr(0, point);
  std::string out = value < 0 && digits.find_first_not_of("0.") != std::string::npos ? "-" : "";
  for (size_t i = 0; i < whole.size(); ++i) {
    if (i != 0 && (whole.size() - i) % 3 == 0) out += ',';
    out += whole[i];
  }
  if (point != std::string::npos) out += digits.substr(point);
  return out;
}

}  // namespace zerowait::internal
