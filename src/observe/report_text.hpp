// Text on the report page: HTML escaping, numbers as people read them, and the fixed colour of
// each cause (the same cause has the same colour in every chart and every report).
#pragma once

#include <string>
#include <string_view>

#include "common/text.hpp"

namespace zerowait::observe {

using internal::format_number;  // 1234.6 -> "1,235" (common/text.hpp)

// & < > " ' replaced by entities: safe in element text and in quoted attributes.
std::string html_escape(std::string_view text);

// 0.123 -> "12.3 %"; a share that is not zero but rounds to it -> "<0.1 %".
std::string format_percent(double share);
// An axis label: 0.25 -> "25 %", 0.125 -> "12.5 %".
std::string format_percent_tick(double share);
// An axis label: "0", "2.5", "12.5", "1,250".
std::string format_tick(double value);
// "4.5 ms", "0.25 s", "12.3 s", "4 min 05 s", "2 h 03 min".
std::string format_seconds(double seconds);
// "$1,234", and cents below `cents_below` ($10 unless said): "$7.50".
std::string format_money(double dollars, double cents_below = 10);
// Seconds since the epoch -> "2026-12-01 14:03:07 UTC".
std::string format_utc(double unix_seconds);
// A coordinate for SVG: at most one decimal, no trailing zeros ("12", "12.5").
std::string svg_number(double value);

// "#e4572e" for input, "#59a96a" for compute, ...; a cause no producer documents gets a colour
// from a spare palette by its position in the run's list.
std::string cause_colour(const std::string& cause, size_t index);
// "Input", "Host-to-device copy", ...; unknown causes as given.
std::string cause_label(const std::string& cause);

}  // namespace zerowait::observe
