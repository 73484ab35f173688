// A small packed dataset of synthetic JPEGs (ImageFolder classes), for the tests that need real
// shards to serve or read: the remote dataset and cache tests.
#pragma once

#include <cstdint>
#include <string>

namespace zerowait::testing {

struct ImageDatasetOptions {
  uint64_t files = 120;
  uint32_t classes = 3;
  uint64_t min_bytes = 2000;
  uint64_t max_bytes = 6000;
  uint64_t shard_size = 150 << 10;
};

// Generates the images under `work_dir`/images and packs them into `out_dir` (one thread, no
// fsync); fails the test (ADD_FAILURE + exception) on error. Returns the number of shards.
uint64_t pack_image_dataset(const std::string& work_dir, const std::string& out_dir,
                            const ImageDatasetOptions& options = {});

}  // namespace zerowait::testing
