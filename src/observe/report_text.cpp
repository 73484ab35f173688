#include "observe/report_text.hpp"

#include <array>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "common/text.hpp"
#include "zerowait/observe/causes.hpp"

namespace zerowait::observe {

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

using internal::printf_string;

std::string format_percent(double share) {
  const double percent = share * 100;
  if (percent != 0 && std::fabs(percent) < 0.05) return "<0.1 %";
  return printf_string("%.1f %%", percent);
}

std::string format_percent_tick(double share) {
  return printf_string("%.3g %%", share * 100);
}

std::string format_tick(double value) {
  if (std::fabs(value) >= 100) return format_number(value);
  return printf_string("%.3g", value);
}

std::string format_seconds(double seconds) {
  if (!std::isfinite(seconds)) return "-";
  const double magnitude = std::fabs(seconds);
  if (magnitude == 0) return "0 s";
  if (magnitude < 0.01) return printf_string("%.1f ms", seconds * 1000);
  if (magnitude < 1) return printf_string("%.2f s", seconds);
  if (magnitude < 100) return printf_string("%.1f s", seconds);
  const long long whole = std::llround(seconds);
  char buffer[64];
  if (whole < 3600) {
    std::snprintf(buffer, sizeof buffer, "%lld min %02lld s", whole / 60, whole % 60);
  } else {
    std::snprintf(buffer, sizeof buffer, "%lld h %02lld min", whole / 3600, whole / 60 % 60);
  }
  return buffer;
}

std::string format_money(double dollars, double cents_below) {
  const std::string sign = dollars < 0 ? "-" : "";
  const double magnitude = std::fabs(dollars);
  return sign + "$" + format_number(magnitude, magnitude < cents_below ? 2 : 0);
}

std::string format_utc(double unix_seconds) {
  const std::time_t seconds = static_cast<std::time_t>(std::floor(unix_seconds));
  std::tm parts{};
  if (gmtime_r(&seconds, &parts) == nullptr) return "-";
  char buffer[64];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M:%S UTC", &parts);
  return buffer;
}

std::string svg_number(double value) {
  if (!std::isfinite(value)) return "0";
  std::string text = printf_string("%.1f", value);
  if (text.size() > 2 && text.compare(text.size() - 2, 2, ".0") == 0) text.resize(text.size() - 2);
  if (text == "-0") text = "0";
  return text;
}

namespace {

struct CauseStyle {
  const char* colour;
  const char* label;
};

// kCauses's styles, in its order. Waits in warm colours, compute in green: the eye goes to what
// costs money.
constexpr std::array<CauseStyle, kCauses.size()> kCauseStyles = {{
    {"#e4572e", "Input"},
    {"#f0a202", "Checkpoint"},
    {"#a06cd5", "Host-to-device copy"},
    {"#3c91e6", "Communication"},
    {"#59a96a", "Compute"},
    {"#a0a4ab", "Other"},
}};

constexpr std::array<const char*, 6> kSpareColours = {"#d1495b", "#00798c", "#edae49",
                                                      "#66a182", "#8d96a3", "#2e4057"};

// The style of a cause of kCauses; nullptr for any other name (a run may list its own).
const CauseStyle* style_of(const std::string& cause) {
  for (size_t i = 0; i < kCauses.size(); ++i) {
    if (cause == kCauses[i]) return &kCauseStyles[i];
  }
  return nullptr;
}

}  // namespace

std::string cause_colour(const std::string& cause, size_t index) {
  if (const CauseStyle* style = style_of(cause)) return style->colour;
  return kSpareColours[index % kSpareColours.size()];
}

std::string cause_label(const std::string& cause) {
  if (const CauseStyle* style = style_of(cause)) return style->label;
  return cause;
}

}  // namespace zerowait::observe
