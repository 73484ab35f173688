#include "common/log.hpp"

#include <cstdio>
#include <map>
#include <mutex>

namespace zerowait::internal {
namespace {

std::mutex mutex;
std::map<std::string, uint64_t, std::less<>>& counts() {
  static auto* map = new std::map<std::string, uint64_t, std::less<>>();  // outlives exit
  return *map;
}

}  // namespace

void note_fallback(std::string_view kind, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = counts().find(kind);
  if (it == counts().end()) {
    std::fprintf(stderr, "zerowait: note: %s\n", message.c_str());
    counts().emplace(std::string(kind), 1);
  } else {
    ++it->second;
  }
}

uint64_t fallback_count(std::string_view kind) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = counts().find(kind);
  return it == counts().end() ? 0 : it->second;
}

}  // namespace zerowait::internal
