// Synthetic data sets for the quick start, benchmarks and tests: real, decodable JPEG files in
// an ImageFolder tree, deterministic for a given seed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "zerowait/common/status.hpp"

namespace zerowait {

struct SyntheticImageFolderOptions {
  std::string out_dir;
  uint64_t files = 1000;
  uint32_t classes = 10;
  uint64_t min_bytes = 10 * 1000;  // each JPEG's size lands in [min_bytes, max_bytes]
  uint64_t max_bytes = 60 * 1000;
  uint64_t seed = 0;
  unsigned threads = 0;  // 0 = number of CPUs
  std::function<void(uint64_t files_done, uint64_t files_total)> on_progress;
};

struct SyntheticReport {
  uint64_t files = 0;
  uint64_t bytes = 0;
};

// Writes out_dir/class_XXX/img_XXXXXXXX.jpg. Same options -> same bytes. Existing files with the
// same names are overwritten.
Result<SyntheticReport> generate_imagefolder(const SyntheticImageFolderOptions& options);

}  // namespace zerowait
