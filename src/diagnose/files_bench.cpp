#include "zerowait/diagnose/files_bench.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "common/clock.hpp"
#include "common/file.hpp"
#include "common/random.hpp"
#include "zerowait/host/page_cache.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using internal::seconds_since;

// The share of `paths`' bytes in the page cache now; NaN when it cannot be told (a failure, or
// files this user cannot measure: page_cache.hpp). It is only evidence that "cold" was cold,
// never a reason to fail the benchmark.
double resident_share(const std::vector<std::string>& paths) {
  Result<Residency> r = residency(paths);
  return r.is_ok() ? r->share() : std::nan("");
}

// One file read as `open(path, "rb").read()` does it: open, fstat (for the size), read until
// read() returns 0, close. `buffer` is reused across files. Returns the bytes read.
Result<uint64_t> read_whole(const std::string& path, std::vector<char>& buffer) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno_status(errno, "cannot open", path);
  internal::File file(fd, path);
  struct stat info {};
  if (::fstat(fd, &info) != 0) return errno_status(errno, "cannot fstat", path);
  // One byte more than the size, so the read that sees the end is the second, as in Python.
  if (buffer.size() < uint64_t(info.st_size) + 1) buffer.resize(uint64_t(info.st_size) + 1);
  uint64_t done = 0;
  for (;;) {
    if (done == buffer.size()) buffer.resize(buffer.size() * 2);  // the file grew
    const ssize_t n = ::read(fd, buffer.data() + done, buffer.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(errno, "cannot read", path, (long long)done);
    if (n == 0) break;
    done += uint64_t(n);
  }
  return done;
}

// The Loader as the Python Loader makes it by default (io "auto", shuffle "random", checksums
// verified, raw bytes), with `threads` workers and the shuffle seed `seed`, at the caller's
// priority.
LoaderOptions packed_loader_options(unsigned threads, uint64_t seed) {
  LoaderOptions options;
  options.threads = threads;
  options.shuffle.mode = ShuffleMode::kRandom;
  options.shuffle.seed = seed;
  options.io = resolve_auto_io_backend();
  // At the caller's priority, as the per-file readers run (a DataLoader's workers do). The
  // default worker_nice (SCHED_BATCH, nice +5) yields to the training loop's thread; here it
  // would only yield to whatever else runs on the machine, and measure the load, not the format.
  // Either way round it is unfair: per-file readers made SCHED_BATCH wait a time slice after
  // every synchronous read on a busy machine (3-5x slower cold here at load 15), while the
  // loader's io_uring queue hides that wait.
  options.worker_nice = 0;
  return options;
}

// Reads `count` samples of `dataset` through a Loader in its shuffled order. Counts whole
// batches: the last one may pass `count`. The clock starts after Loader::create, which reads
// nothing but faults in the batch arenas (~0.3 GB/s on first touch here: about a second for the
// default 512 MiB), a cost paid once per training process; `start_seconds` gets it. `io` gets
// the backend the loader read with (its stats).
Result<ReadPass> read_samples(const std::shared_ptr<Dataset>& dataset, LoaderOptions options,
                              uint64_t count, double* start_seconds, std::string* io) {
  options.batch_size = std::min<uint64_t>(options.batch_size, std::max<uint64_t>(count, 1));
  ReadPass pass;
  const auto created = std::chrono::steady_clock::now();
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<Loader> loader, Loader::create(dataset, options));
  *start_seconds = seconds_since(created);
  const auto start = std::chrono::steady_clock::now();
  while (pass.items < count) {
    ZW_ASSIGN_OR_RETURN(std::shared_ptr<Batch> batch, loader->next());
    if (batch == nullptr) break;  // the epoch ended: the dataset has fewer samples
    pass.items += batch->samples();
    for (const std::string& field : dataset->fields()) {
      if (const BatchColumn* column = batch->column(field)) pass.bytes += column->bytes;
    }
  }
  pass.seconds = seconds_since(start);
  *io = loader->stats().io;
  return pass;  // the loader's prefetching threads end outside the timed part
}

}  // namespace

Result<ListedFiles> list_files(const std::string& dir) {
  ListedFiles listed;
  const auto start = std::chrono::steady_clock::now();
  std::error_code error;
  fs::recursive_directory_iterator it(dir, error);
  if (error) return errno_status(error.value(), "cannot list", dir);
  for (const fs::recursive_directory_iterator end; it != end; it.increment(error)) {
    if (error) break;
    // The type readdir() gave (d_type): no stat per entry, as os.scandir would not need one.
    std::error_code type_error;
    if (it->is_regular_file(type_error) && !it->is_symlink(type_error)) {
      listed.paths.push_back(it->path().string());
    }
  }
  if (error) return errno_status(error.value(), "cannot list a directory under", dir);
  listed.seconds = seconds_since(start);
  std::sort(listed.paths.begin(), listed.paths.end());
  return listed;
}

Result<ReadPass> read_files(const std::vector<std::string>& paths, unsigned threads) {
  if (threads == 0) return invalid_argument("--threads must be at least 1");
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  Status error;
  const auto work = [&] {
    std::vector<char> buffer;
    uint64_t my_bytes = 0;
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t i = next++;
      if (i >= paths.size()) break;
      Result<uint64_t> read = read_whole(paths[i], buffer);
      if (!read.is_ok()) {
        std::lock_guard lock(error_mutex);
        if (error.is_ok()) error = read.status();
        failed = true;
        break;
      }
      my_bytes += *read;
    }
    bytes += my_bytes;
  };
  const auto start = std::chrono::steady_clock::now();
  {
    // The caller only waits, as the Loader's consumer only collects batches: `threads` readers
    // on each side.
    std::vector<std::jthread> workers;
    for (unsigned t = 0; t < threads; ++t) workers.emplace_back(work);
  }
  const double seconds = seconds_since(start);
  if (!error.is_ok()) return error;
  return ReadPass{paths.size(), bytes.load(), seconds, 0};
}

Result<FilesBenchReport> run_files_bench(const FilesBenchOptions& options) {
  if (options.threads == 0) return invalid_argument("--threads must be at least 1");
  if (options.repeats == 0) return invalid_argument("--repeats must be at least 1");
  const auto progress = [&](const std::string& message) {
    if (options.progress) options.progress(message);
  };
  FilesBenchReport report;
  report.dir = options.dir;
  report.threads = options.threads;
  report.repeats = options.repeats;

  progress("listing " + options.dir);
  ZW_ASSIGN_OR_RETURN(ListedFiles listed, list_files(options.dir));
  if (listed.paths.empty()) {
    return not_found("no files under '" + options.dir + "': give the tree of small files "
                     "(zerowait generate imagefolder DIR --files 20000 makes one)");
  }
  report.files_listed = listed.paths.size();
  report.list_seconds = listed.seconds;
  // A shuffled order, as DataLoader(shuffle=True) reads; --max-files keeps a random subset.
  std::vector<std::string> files = std::move(listed.paths);
  internal::Rng rng(internal::combine_seed(options.seed, 0x66696c6573));  // "files"
  internal::shuffle_range(files.begin(), files.end(), rng);
  if (options.max_files != 0 && files.size() > options.max_files) files.resize(options.max_files);
  report.files_read = files.size();

  std::shared_ptr<Dataset> dataset;
  std::vector<std::string> shards;
  const LoaderOptions loader_options = packed_loader_options(options.threads, options.seed);
  if (!options.dataset.empty()) {
    progress("opening the dataset " + options.dataset);
    PackedFilesBench packed;
    packed.dataset = options.dataset;
    const auto start = std::chrono::steady_clock::now();
    ZW_ASSIGN_OR_RETURN(dataset, open_loader_dataset(options.dataset, loader_options));
    packed.open_seconds = seconds_since(start);
    packed.dataset_samples = dataset->size();
    for (size_t s = 0; s < dataset->shard_count(); ++s) shards.push_back(dataset->shard_path(s));
    if (packed.dataset_samples != report.files_listed) {
      report.notes.push_back("the dataset holds " + std::to_string(packed.dataset_samples) +
                             " samples and the tree " + std::to_string(report.files_listed) +
                             " files: compare the per-sample rates");
    }
    report.packed = std::move(packed);
  }

  // Each side is evicted right before its own cold pass and its residency taken then, so that
  // what the other side's pass left in the page cache cannot warm it, whichever ran first.
  const auto files_pass = [&](bool cold) -> Result<ReadPass> {
    if (cold) {
      progress("files: evicting " + std::to_string(files.size()) + " files from the page cache");
      ZW_RETURN_IF_ERROR(evict_from_page_cache(files));
    }
    const double resident = resident_share(files);
    progress(std::string("files: ") + (cold ? "cold" : "warm") + " pass (" +
             std::to_string(files.size()) + " files)");
    ZW_ASSIGN_OR_RETURN(ReadPass pass, read_files(files, options.threads));
    pass.resident_before = resident;
    return pass;
  };
  const uint64_t samples = report.files_read;
  const auto packed_pass = [&](bool cold) -> Result<ReadPass> {
    PackedFilesBench& packed = *report.packed;
    if (cold) {
      progress("packed: evicting " + std::to_string(shards.size()) + " shards from the page cache");
      ZW_RETURN_IF_ERROR(evict_from_page_cache(shards));
    }
    const double resident = resident_share(shards);
    progress(std::string("packed: ") + (cold ? "cold" : "warm") + " pass (" +
             std::to_string(samples) + " samples)");
    // The same seed on every pass: the warm pass rereads the cold pass's samples, as the files'
    // warm pass rereads its files. The loader's start-up and backend are the first cold pass's.
    double start_seconds = 0;
    std::string io;
    ZW_ASSIGN_OR_RETURN(ReadPass pass,
                        read_samples(dataset, loader_options, samples, &start_seconds, &io));
    if (cold && packed.io.empty()) {  // the first cold pass's
      packed.loader_start_seconds = start_seconds;
      packed.io = std::move(io);
    }
    pass.resident_before = resident;
    return pass;
  };
  // Each side keeps its fastest pass of the repeats: other work on the machine only ever slows
  // a pass, so the fastest is the least disturbed, on both sides alike. Its residency is the
  // highest of the side's passes, so "cold" is shown for every cold pass, not only the one kept.
  const auto keep_faster = [](ReadPass& kept, const ReadPass& pass, bool first) {
    const double resident =
        first ? pass.resident_before : std::max(kept.resident_before, pass.resident_before);
    if (first || pass.items_per_s() > kept.items_per_s()) kept = pass;
    kept.resident_before = resident;  // NaN (unknown) stays NaN: std::max keeps its first
  };
  // The sides take turns, cold then warm, and swap who goes first every repeat (--packed-first:
  // the packed side in the first), so that neither always follows the other's page-cache and
  // disk state, and a drift of the disk weighs on both.
  for (unsigned repeat = 0; repeat < options.repeats; ++repeat) {
    const bool packed_first = options.packed_first != (repeat % 2 == 1);
    for (const bool cold : {true, false}) {
      for (const bool packed_turn : {packed_first, !packed_first}) {
        if (!packed_turn) {
          ZW_ASSIGN_OR_RETURN(const ReadPass pass, files_pass(cold));
          keep_faster(cold ? report.cold : report.warm, pass, repeat == 0);
        } else if (dataset != nullptr) {
          ZW_ASSIGN_OR_RETURN(const ReadPass pass, packed_pass(cold));
          keep_faster(cold ? report.packed->cold : report.packed->warm, pass, repeat == 0);
        }
      }
    }
  }
  if (dataset != nullptr) {
    PackedFilesBench& packed = *report.packed;
    const auto speedup = [](const ReadPass& packed_pass, const ReadPass& files_pass) {
      return files_pass.items_per_s() > 0 ? packed_pass.items_per_s() / files_pass.items_per_s()
                                          : 0;
    };
    packed.speedup_cold = speedup(packed.cold, report.cold);
    packed.speedup_warm = speedup(packed.warm, report.warm);
  }
  // How "cold" was made is said by the command with the numbers (kColdByFadvise).
  return report;
}

}  // namespace zerowait
