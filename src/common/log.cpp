#include "common/log.hpp"

#include <cstdio>
#include <map>
#include <mutex>
#include <utility>

namespace zerowait::internal {
namespace {

std::mutex mutex;
thread_local std::shared_ptr<FallbackTally> this_thread_tally;
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
  if (this_thread_tally != nullptr) this_thread_tally->add(kind);
}

uint64_t fallback_count(std::string_view kind) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = counts().find(kind);
  return it == counts().end() ? 0 : it->second;
}

uint64_t FallbackTally::count(std::string_view kind) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = counts_.find(kind);
  return it == counts_.end() ? 0 : it->second;
}

void FallbackTally::add(std::string_view kind, uint64_t times) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = counts_.find(kind);
  if (it == counts_.end()) {
    counts_.emplace(std::string(kind), times);
  } else {
    it->second += times;
  }
}

void FallbackTally::add_all(const FallbackTally& other) {
  std::map<std::string, uint64_t, std::less<>> counts;
  {
    std::lock_guard<std::mutex> lock(other.mutex_);
    counts = other.counts_;
  }
  for (const auto& [kind, times] : counts) add(kind, times);
}

FallbackScope::FallbackScope(std::shared_ptr<FallbackTally> tally)
    : previous_(std::exchange(this_thread_tally, std::move(tally))) {}

FallbackScope::~FallbackScope() { this_thread_tally = std::move(previous_); }

std::shared_ptr<FallbackTally> current_fallback_tally() { return this_thread_tally; }

}  // namespace zerowait::internal
