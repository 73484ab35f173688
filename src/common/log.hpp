// Notes about fallbacks: STYLE says a fallback is never silent. Each kind of fallback is printed
// once per process on stderr and counted every time, so stats can report how often it happened.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zerowait::internal {

// Counts one occurrence of fallback `kind`; the first one prints "zerowait: note: <message>".
// Thread-safe.
void note_fallback(std::string_view kind, const std::string& message);
// How many times `kind` was noted in this process.
uint64_t fallback_count(std::string_view kind);

}  // namespace zerowait::internal
