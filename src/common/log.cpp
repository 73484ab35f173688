#include "common/log.hpp"

#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

#include "common/xxhash.hpp"

namespace zerowait::internal {
namespace {

std::mutex mutex;
thread_local std::shared_ptr<FallbackTally> this_thread_tally;
std::map<std::string, uint64_t, std::less<>>& counts() {
  static auto* map = new std::map<std::string, uint64_t, std::less<>>();  // outlives exit
  return *map;
}

// The kinds already noted in this process tree. Processes forked from here on share one table:
// a MAP_SHARED anonymous page made when the library loads (before any fork), one 64-bit hash of a
// kind per slot, claimed by compare-and-swap, so that of several processes noting a kind at once
// (the ranks of one job) exactly one prints it. Programs exec'd below learn the kinds from the
// environment instead (kNotedVariable), which every process that meets a kind extends.
constexpr size_t kSlots = 4096 / sizeof(uint64_t);
constexpr const char* kNotedVariable = "ZEROWAIT_NOTED";  // "kind,kind,..."

uint64_t hash_of(std::string_view kind) {
  return XXH3_64bits(kind.data(), kind.size()) | 1;  // 0 marks a free slot
}

// True for the first process of the tree to claim `kind`; true as well when the table cannot
// be had (no shared page, or full): a note printed twice beats a note lost.
bool first_in_tree(std::atomic<uint64_t>* slots, std::string_view kind) {
  if (slots == nullptr) return true;
  const uint64_t hash = hash_of(kind);
  for (size_t i = 0; i < kSlots; ++i) {
    uint64_t seen = 0;
    std::atomic<uint64_t>& slot = slots[(hash + i) % kSlots];
    if (slot.compare_exchange_strong(seen, hash)) return true;
    if (seen == hash) return false;
  }
  return true;
}

std::atomic<uint64_t>* tree_slots() {
  static std::atomic<uint64_t>* const slots = [] {
    void* page = ::mmap(nullptr, kSlots * sizeof(uint64_t), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return static_cast<std::atomic<uint64_t>*>(nullptr);
    auto* table = static_cast<std::atomic<uint64_t>*>(page);  // zero-filled: every slot free
    // What the programs above this one noted already.
    if (const char* noted = std::getenv(kNotedVariable)) {
      const std::string_view list(noted);
      for (size_t start = 0; start <= list.size();) {
        const size_t end = std::min(list.find(',', start), list.size());
        if (end > start) first_in_tree(table, list.substr(start, end - start));
        start = end + 1;
      }
    }
    return table;
  }();
  return slots;
}

// Made at load, so that it exists before the program forks.
[[maybe_unused]] const bool kTreeSlotsAtLoad = tree_slots() != nullptr;

// Adds `kind` to kNotedVariable for the programs this process execs. Called under `mutex`, once
// per kind and process.
void remember_in_environment(std::string_view kind) {
  const char* noted = std::getenv(kNotedVariable);
  std::string list = noted != nullptr ? noted : "";
  if (("," + list + ",").find("," + std::string(kind) + ",") != std::string::npos) return;
  list += (list.empty() ? "" : ",") + std::string(kind);
  ::setenv(kNotedVariable, list.c_str(), 1);
}

}  // namespace

void note_fallback(std::string_view kind, const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = counts().find(kind);
  if (it == counts().end()) {
    if (first_in_tree(tree_slots(), kind)) {
      std::fprintf(stderr, "zerowait: note: %s\n", message.c_str());
    }
    remember_in_environment(kind);
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
