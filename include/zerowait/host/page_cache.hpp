// How much of a set of files the kernel's page cache holds, reading the rest in ahead of
// training (`zerowait cache status|warm`: what vmtouch does, for a dataset's shards), and
// dropping files from it (the cold passes of `zerowait bench files` and `zerowait emulate`).
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

// Residency is known only to some users: since Linux 5.0 (CVE-2019-5489) mincore() on a file's
// mapping answers truthfully only to the file's owner, a process that may write it, or one with
// CAP_FOWNER; to anyone else every page looks resident. Such a file is "not measured": its
// resident_bytes are 0 (unknown), and a warm-up reads it whole.
struct FileResidency {
  std::string path;
  uint64_t bytes = 0;
  uint64_t resident_bytes = 0;  // whole pages, the last one counted as the file's tail
  bool measured = true;         // false: this user cannot learn it (above)
  // The share resident; NaN when not measured (null in JSON).
  double share() const;
};

struct Residency {
  std::vector<FileResidency> files;
  uint64_t bytes = 0;
  uint64_t resident_bytes = 0;
  uint64_t unmeasured_bytes = 0;  // of files this user cannot measure
  // The share of the measured bytes resident; NaN when nothing could be measured.
  double share() const;
};

// Why a file's residency was not measured, for output beside the numbers.
inline constexpr const char* kUnmeasuredResidency =
    "not measurable as this user: mincore() reports only the files a user owns or may write "
    "(Linux >= 5.0); to anyone else every page looks resident";

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

// Drops the pages of `paths` from the page cache: fdatasync (dirty pages cannot be dropped) and
// posix_fadvise(POSIX_FADV_DONTNEED). Errors name the file.
Status evict_from_page_cache(const std::vector<std::string>& paths);

}  // namespace zerowait
