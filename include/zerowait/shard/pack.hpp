// `zerowait pack`: turns trees of small files, ImageFolder trees and WebDataset tars into shards
// plus a manifest. Corrupt inputs are quarantined (listed, never packed).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait {

struct PackProgress {
  uint64_t files_done = 0;
  uint64_t files_total = 0;  // 0 while unknown (tar inputs are counted as they stream)
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

struct PackOptions {
  std::vector<std::string> sources;  // directories, .tar, .tar.gz / .tgz files
  std::string out_dir;
  uint64_t shard_size = 256ull << 20;  // a shard is closed once it reaches this many bytes
  unsigned threads = 0;                // file readers; 0 = number of CPUs
  bool align = false;                  // 4 KiB-align every sample
  bool imagefolder = false;            // CLASS/FILE.ext -> fields <ext> and "cls"
  bool verify_images = false;          // full JPEG/PNG decode instead of a header check
  bool overwrite = false;              // replace an existing dataset in out_dir
  bool sync = true;                    // fsync shards, manifest and directory
  std::function<void(const PackProgress&)> on_progress;  // called from the writer thread
};

struct QuarantineEntry {
  std::string path;  // the input file, or "archive.tar:member"
  std::string reason;
};

struct PackReport {
  uint64_t samples = 0;
  uint64_t files = 0;      // input files packed
  uint64_t ignored = 0;    // inputs that are not sample files (no extension, directories, links)
  uint64_t bytes_in = 0;   // payload bytes packed
  uint64_t bytes_out = 0;  // shard bytes written
  uint64_t shards = 0;
  double seconds = 0;
  std::string manifest_path;
  std::vector<QuarantineEntry> quarantined;
};

// Packs `options.sources` into `options.out_dir`. Same inputs and options give byte-identical
// output. Shards are written under temporary names and renamed once complete; the manifest is
// written last, so an interrupted pack never leaves a manifest pointing at partial shards.
// A non-empty quarantine is not an error: the report lists it and quarantine.json records it.
// Blocks: the calling thread is the writer (and runs `on_progress`); `threads` reader threads are
// started and joined before it returns, also on error. Errors name the input or output file:
// kInvalidArgument for options, kAlreadyExists for an existing dataset without `overwrite`,
// kIo for reads and writes (a full disk), never a partially published dataset.
Result<PackReport> pack(const PackOptions& options);

}  // namespace zerowait
