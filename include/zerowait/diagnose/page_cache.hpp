// How much of a set of files the kernel's page cache holds, and reading the rest in ahead of
// training: `zerowait cache status|warm` (what vmtouch does, for a dataset's shards).
//
// Residency is mincore() over read-only mappings of each file, a window at a time, so address
// space stays bounded whatever the file size. Warming reads only the chunks that are not already
// resident, synchronously (the time it reports is what the warm-up cost), and stops at a byte
// budget: a warm-up larger than the memory it lands in only evicts what it read first.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait {

struct FileResidency {
  std::string path;
  uint64_t bytes = 0;
  uint64_t resident_bytes = 0;  // whole pages, the last one counted as the file's tail
  double share() const { return bytes == 0 ? 1.0 : double(resident_bytes) / double(bytes); }
};

struct Residency {
  std::vector<FileResidency> files;
  uint64_t bytes = 0;
  uint64_t resident_bytes = 0;
  double share() const { return bytes == 0 ? 1.0 : double(resident_bytes) / double(bytes); }
};

// kNotFound / kIo naming the path. An empty file is resident.
Result<FileResidency> file_residency(const std::string& path);
Result<Residency> residency(const std::vector<std::string>& paths);

struct WarmOptions {
  // At most this many bytes read, in whole chunks (0: no cap); files warmed in the order given.
  uint64_t max_bytes = 0;
  // Called after each chunk with the bytes read so far and the bytes the warm-up will read.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct WarmReport {
  Residency before;
  Residency after;
  uint64_t bytes_read = 0;
  double seconds = 0;  // reading only
  bool capped = false;  // stopped at max_bytes with non-resident bytes left
};

Result<WarmReport> warm_page_cache(const std::vector<std::string>& paths,
                                   const WarmOptions& options);

}  // namespace zerowait
