#include "storage/cache/cache_trace.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace zerowait::internal {

namespace {

std::mutex trace_mutex;
std::string trace_path;           // guarded by trace_mutex: the file trace_file appends to
std::FILE* trace_file = nullptr;  // guarded by trace_mutex

}  // namespace

CacheTrace* CacheTrace::get() {
  static CacheTrace instance;
  const char* path = std::getenv("ZEROWAIT_TRACE_CACHE");
  if (path == nullptr || *path == '\0') return nullptr;
  std::lock_guard<std::mutex> lock(trace_mutex);
  if (trace_file == nullptr || trace_path != path) {
    if (trace_file != nullptr) std::fclose(trace_file);
    trace_path = path;
    trace_file = std::fopen(path, "a");
  }
  return trace_file != nullptr ? &instance : nullptr;
}

void CacheTrace::event(std::string_view event, std::string_view origin, uint64_t block,
                       std::string_view detail) {
  const double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::lock_guard<std::mutex> lock(trace_mutex);
  if (trace_file == nullptr) return;
  std::fprintf(trace_file, "%.6f %d %.*s %.*s %llu %.*s\n", now, static_cast<int>(::getpid()),
               static_cast<int>(event.size()), event.data(), static_cast<int>(origin.size()),
               origin.data(), static_cast<unsigned long long>(block),
               static_cast<int>(detail.size()), detail.data());
  std::fflush(trace_file);
}

}  // namespace zerowait::internal
