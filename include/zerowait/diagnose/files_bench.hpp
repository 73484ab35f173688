// The small-file cost for `zerowait bench files`: listing a tree, then reading every file the way
// a Dataset over loose files does (open, fstat, read it whole, close), cold and warm; beside it,
// the same number of samples read from the dataset packed from that tree, through the Loader the
// way training reads it (shuffled, raw bytes, checksums verified, io "auto").
//
// Both sides read in a shuffled order with the same number of threads at the same priority (the
// caller's: the Loader's worker_nice is 0 here, as a DataLoader's workers run), and the passes
// alternate (files cold, packed cold, files warm, packed warm), the side that goes first swapping
// every repeat, so that a drift of the disk weighs on both; each side keeps its fastest pass.
// "Cold" evicts a side's pages right before its own pass (fdatasync, then posix_fadvise DONTNEED)
// and measures what stayed: the page cache only; the kernel's dentry and inode caches stay warm,
// which flatters the per-file side.
//
// Library code: nothing is printed; progress goes to a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait {

// Threads on each side by default: two cores' worth, as the loader comparisons in
// bench/README.md give every contender (2 workers).
inline constexpr unsigned kFilesBenchThreads = 2;
// Passes of each kind on each side by default; the fastest is kept (run_files_bench).
inline constexpr unsigned kFilesBenchRepeats = 3;

// One pass over files or samples.
struct ReadPass {
  uint64_t items = 0;  // files or samples read
  uint64_t bytes = 0;  // their bytes (a sample's: every field's)
  double seconds = 0;
  // The share of the bytes the page cache held when the pass began; NaN when this user cannot
  // tell (files it neither owns nor may write: page_cache.hpp), null in JSON.
  double resident_before = 0;

  double items_per_s() const { return seconds > 0 ? double(items) / seconds : 0; }
  double mb_s() const { return seconds > 0 ? double(bytes) / seconds / 1e6 : 0; }  // decimal
};

struct FilesBenchOptions {
  std::string dir;      // the tree of small files
  std::string dataset;  // the dataset packed from it (zerowait pack); empty: per-file side only
  uint64_t max_files = 0;  // read at most this many (a random subset); 0: every file
  unsigned threads = kFilesBenchThreads;
  uint64_t seed = 0;  // of the shuffled orders
  unsigned repeats = kFilesBenchRepeats;  // cold and warm passes on each side
  // Which side reads first in the first repeat, cold and warm alike (the sides swap every
  // repeat): false, the files.
  bool packed_first = false;
  // "files: cold pass (20000 files)" before each step; called on the calling thread.
  std::function<void(const std::string& message)> progress;
};

// The packed side: the dataset read through the Loader.
struct PackedFilesBench {
  std::string dataset;
  uint64_t dataset_samples = 0;  // may differ from the files listed: rates are per sample
  double open_seconds = 0;       // Dataset::open (the manifest), against listing the tree
  // The backend the loader read the shards with (its stats()["io"]: "io_uring", or "pread"
  // where io_uring is not available), opened as the Python Loader opens them.
  std::string io;
  // Loader::create before the cold pass (its batch arenas faulted in), outside the passes' time:
  // paid once per training process, not per epoch.
  double loader_start_seconds = 0;
  ReadPass cold;  // the fastest of the repeats, as the files' passes
  ReadPass warm;
  // Samples per second over files per second, cold against cold and warm against warm.
  double speedup_cold = 0;
  double speedup_warm = 0;
};

struct FilesBenchReport {
  std::string dir;
  unsigned threads = 0;
  unsigned repeats = 0;
  uint64_t files_listed = 0;
  double list_seconds = 0;
  uint64_t files_read = 0;  // per pass: min(files listed, max_files)
  ReadPass cold;            // the fastest of the repeats (resident_before: the highest of them)
  ReadPass warm;
  std::optional<PackedFilesBench> packed;
  std::vector<std::string> notes;  // caveats worth printing with the numbers
};

// The regular files under `dir`, recursively (symbolic links are not followed), sorted; with the
// time the walk took (sorting excluded). kNotFound / kIo naming the directory.
struct ListedFiles {
  std::vector<std::string> paths;
  double seconds = 0;
};
Result<ListedFiles> list_files(const std::string& dir);

// Reads each file whole (open, fstat, read to the end, close) on `threads` new threads, in the
// order given (threads take the next file as they finish one; the caller waits). The first error
// names its file; kInvalidArgument for 0 threads.
Result<ReadPass> read_files(const std::vector<std::string>& paths, unsigned threads);

// The whole comparison (see the top of this file). kInvalidArgument for 0 threads or repeats,
// kNotFound for a tree without files; open and read errors name their file.
Result<FilesBenchReport> run_files_bench(const FilesBenchOptions& options);

}  // namespace zerowait
