// zw_bench_read: the read side of bench/pack_read.py. Reads every sample of a packed dataset, or
// every file of a tree, once, in order, and prints one JSON object with what it read and how long
// it took. The bytes land in one reused, pre-faulted buffer and are touched (one byte per 4 KiB),
// so the number is the cost of getting bytes into memory the program can use, nothing else.
//
//   zw_bench_read shards PATH [--chunk-kib N] [--prefetch-mib N] [--verify]   (PATH: anything
//   Dataset::open takes) zw_bench_read files DIR                                 (every regular
//   file under DIR)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/reader.hpp"

namespace zerowait {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kTouchStride = 4096;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Reads one byte per page so the data is really used (and the loop cannot be optimised away).
uint64_t touch(std::span<const std::byte> bytes) {
  uint64_t sum = 0;
  for (size_t i = 0; i < bytes.size(); i += kTouchStride) sum += uint8_t(bytes[i]);
  if (!bytes.empty()) sum += uint8_t(bytes.back());
  return sum;
}

struct Totals {
  uint64_t samples = 0;
  uint64_t bytes = 0;  // bytes read from storage
  uint64_t touch = 0;
  double seconds = 0;
};

void print_json(const char* mode, const Totals& t, const std::string& extra) {
  std::printf(
      "{\"mode\": \"%s\", \"samples\": %llu, \"bytes\": %llu, \"seconds\": %.6f, \"touch\": "
      "%llu%s}\n",
      mode, static_cast<unsigned long long>(t.samples), static_cast<unsigned long long>(t.bytes),
      t.seconds, static_cast<unsigned long long>(t.touch), extra.c_str());
}

// Every sample of every shard, in order, through ShardReader::scan: reads of about `chunk` bytes
// of consecutive samples with the next chunks hinted ahead, the access pattern of a sequential
// epoch.
Status read_shards(const std::string& path, uint64_t chunk, uint64_t prefetch_mib, bool verify) {
  ShardReader::ScanOptions options;
  options.chunk_bytes = chunk;
  options.prefetch_bytes = prefetch_mib << 20;
  options.verify = verify;
  Totals t;
  const auto start = Clock::now();
  ZW_ASSIGN_OR_RETURN(std::shared_ptr<Dataset> dataset, Dataset::open(path));
  double open_seconds = 0;  // the part of `seconds` spent opening shards and reading indexes
  for (size_t s = 0; s < dataset->shard_count(); ++s) {
    const auto open_start = Clock::now();
    ZW_ASSIGN_OR_RETURN(std::shared_ptr<ShardReader> shard, dataset->shard(s));
    open_seconds += seconds_since(open_start);
    ZW_RETURN_IF_ERROR(shard->scan(
        [&](std::span<const SampleView> views) {
          for (const SampleView& v : views) {
            t.touch += touch(v.bytes);
            t.bytes += v.bytes.size();
          }
          t.samples += views.size();
          return Status::ok();
        },
        options));
  }
  t.seconds = seconds_since(start);
  char open_json[48];
  std::snprintf(open_json, sizeof open_json, ", \"open_seconds\": %.6f", open_seconds);
  print_json("shards", t,
             open_json + (", \"shards\": " + std::to_string(dataset->shard_count())) +
                 ", \"chunk_bytes\": " + std::to_string(chunk) +
                 ", \"verify\": " + (verify ? "true" : "false"));
  return Status::ok();
}

// Every regular file under `dir` in sorted path order, each with open, fstat, read to the end and
// close: what a per-file Dataset (PIL/ImageFolder style) does per sample.
Status read_files(const std::string& dir) {
  const auto list_start = Clock::now();
  std::vector<std::string> paths;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file()) paths.push_back(it->path().string());
  }
  if (ec) return errno_status(ec.value(), "list", dir);
  std::sort(paths.begin(), paths.end());
  const double list_seconds = seconds_since(list_start);

  std::vector<std::byte> buffer(1 << 20);
  Totals t;
  const auto start = Clock::now();
  for (const std::string& path : paths) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno_status(errno, "open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const int err = errno;
      close(fd);
      return errno_status(err, "fstat", path);
    }
    // One byte of room past the size, so the read that sees EOF needs no second buffer.
    if (uint64_t(st.st_size) + 1 > buffer.size()) buffer.resize(uint64_t(st.st_size) + 1);
    size_t got = 0;
    while (true) {
      const ssize_t n = read(fd, buffer.data() + got, buffer.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        close(fd);
        return errno_status(err, "read", path, static_cast<long long>(got));
      }
      if (n == 0) break;
      got += size_t(n);
      if (got == buffer.size()) buffer.resize(buffer.size() * 2);  // the file grew
    }
    close(fd);
    t.touch += touch(std::span(buffer).first(got));
    t.bytes += got;
    ++t.samples;
  }
  t.seconds = seconds_since(start);
  char extra[64];
  std::snprintf(extra, sizeof extra, ", \"list_seconds\": %.6f", list_seconds);
  print_json("files", t, extra);
  return Status::ok();
}

int usage() {
  std::fprintf(stderr,
               "usage: zw_bench_read shards PATH [--chunk-kib N] [--prefetch-mib N] [--verify]\n"
               "       zw_bench_read files DIR\n");
  return 2;
}

}  // namespace
}  // namespace zerowait

int main(int argc, char** argv) {
  using namespace zerowait;
  if (argc < 3) return usage();
  const std::string mode = argv[1], path = argv[2];
  uint64_t chunk_kib = ShardReader::ScanOptions().chunk_bytes >> 10;
  uint64_t prefetch_mib = ShardReader::ScanOptions().prefetch_bytes >> 20;
  bool verify = false;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--chunk-kib" && i + 1 < argc) {
      chunk_kib = std::strtoull(argv[++i], nullptr, 10);
      if (chunk_kib == 0) return usage();
    } else if (arg == "--prefetch-mib" && i + 1 < argc) {
      prefetch_mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--verify") {
      verify = true;
    } else {
      return usage();
    }
  }
  Status status;
  if (mode == "shards") {
    status = read_shards(path, chunk_kib << 10, prefetch_mib, verify);
  } else if (mode == "files") {
    status = read_files(path);
  } else {
    return usage();
  }
  if (!status.is_ok()) {
    std::fprintf(stderr, "zw_bench_read: %s\n", status.to_string().c_str());
    return 1;
  }
  return 0;
}
