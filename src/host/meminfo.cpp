#include "host/meminfo.hpp"

#include <sstream>

namespace zerowait::host {

std::map<std::string, uint64_t> parse_counters(std::string_view text) {
  std::map<std::string, uint64_t> counters;
  std::istringstream lines{std::string(text)};
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string name, unit;
    uint64_t value = 0;
    if (!(fields >> name >> value)) continue;
    if (!name.empty() && name.back() == ':') name.pop_back();
    counters[name] = fields >> unit && unit == "kB" ? value * 1024 : value;
  }
  return counters;
}

std::optional<uint64_t> counter_value(std::string_view text, std::string_view name) {
  const std::map<std::string, uint64_t> counters = parse_counters(text);
  const auto it = counters.find(std::string(name));
  if (it == counters.end()) return std::nullopt;
  return it->second;
}

std::optional<uint64_t> mem_available_bytes(std::string_view meminfo) {
  return counter_value(meminfo, "MemAvailable");
}

}  // namespace zerowait::host
