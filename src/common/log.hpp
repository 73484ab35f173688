// Notes about fallbacks: STYLE says a fallback is never silent. Each kind of fallback is printed
// once per process on stderr and counted every time, so stats can report how often it happened.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace zerowait::internal {

// Counts one occurrence of fallback `kind` (in the process, and in the calling thread's
// FallbackTally if it has one); the first one prints "zerowait: note: <message>". Thread-safe.
void note_fallback(std::string_view kind, const std::string& message);
// How many times `kind` was noted in this process.
uint64_t fallback_count(std::string_view kind);

// The fallbacks noted by the threads that work for one owner (a Loader's): its own counts, where
// fallback_count() sums every owner in the process. Thread-safe.
class FallbackTally {
 public:
  uint64_t count(std::string_view kind) const;
  void add(std::string_view kind, uint64_t times = 1);
  void add_all(const FallbackTally& other);  // other's counts, added to these

 private:
  mutable std::mutex mutex_;
  std::map<std::string, uint64_t, std::less<>> counts_;
};

// While it lives, the fallbacks this thread notes count in `tally` too (null: in none); the
// tally installed before comes back when it ends. start_thread gives a new thread its creator's.
class FallbackScope {
 public:
  explicit FallbackScope(std::shared_ptr<FallbackTally> tally);
  ~FallbackScope();
  FallbackScope(const FallbackScope&) = delete;
  FallbackScope& operator=(const FallbackScope&) = delete;

 private:
  std::shared_ptr<FallbackTally> previous_;
};

// The tally this thread counts in now; null when none.
std::shared_ptr<FallbackTally> current_fallback_tally();

}  // namespace zerowait::internal
