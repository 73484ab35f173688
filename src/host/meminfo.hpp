// The kernel's memory counters: /proc/meminfo ("Name: value kB") and /proc/vmstat ("name value"),
// parsed in one place for the doctor's memory checks, the system sampler and the loader's memory
// budget (memory_headroom.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace zerowait::host {

// Every "Name: value [kB]" or "name value" line of `text`: kB values in bytes, others as counted.
// Lines that are not counters are skipped.
std::map<std::string, uint64_t> parse_counters(std::string_view text);

// The counter `name` of such a text (/proc/meminfo, /proc/vmstat, /proc/PID/io), as
// parse_counters reads it; nullopt when the text has no such line.
std::optional<uint64_t> counter_value(std::string_view text, std::string_view name);

// MemAvailable of a /proc/meminfo text, in bytes; nullopt when the line is missing.
std::optional<uint64_t> mem_available_bytes(std::string_view meminfo);

}  // namespace zerowait::host
