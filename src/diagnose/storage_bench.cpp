#include "zerowait/diagnose/storage_bench.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "common/align.hpp"
#include "common/file.hpp"
#include "common/random.hpp"
#include "diagnose/bench/fio_run.hpp"
#include "diagnose/bench/storage_run.hpp"
#include "diagnose/doctor/mounts.hpp"
#include "host/system.hpp"
#include "zerowait/storage/byte_source.hpp"

extern char** environ;

namespace zerowait {
namespace {

using internal::File;
using namespace internal::bench;  // NOLINT: the two sides of a job, split into files

// Whether madvise(MADV_HUGEPAGE) can give huge pages ("always" or "madvise" selected).
// Read as the doctor reads it (memory.thp_enabled).
bool huge_pages_enabled() {
  const std::optional<std::string> modes =
      host::System().read_line("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!modes) return false;
  const std::string active = doctor::bracketed_choice(*modes);
  return active == "always" || active == "madvise";
}

// ---- the test file --------------------------------------------------------------------------

Status direct_unsupported(const std::string& dir, const std::string& detail) {
  return unsupported("the filesystem of '" + dir + "' does not accept O_DIRECT (" + detail +
                     "), which bench storage needs to measure the storage past the page cache "
                     "(tmpfs before Linux 6.6 and some FUSE filesystems refuse it); choose a "
                     "directory on the disk to measure");
}

// The test file, removed (unlinked) when this goes, whatever the path out. Its descriptor
// closes silently: the file is deleted, a failed close loses nothing.
class TestFile {
 public:
  static Result<TestFile> create(const std::string& dir) {
    const std::string path = dir + "/.zerowait-bench-" + std::to_string(::getpid());
    // O_EXCL: a file of that name is not ours to overwrite or remove.
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EINVAL) return direct_unsupported(dir, std::strerror(errno));
    if (fd < 0) return errno_status(errno, "cannot create the test file", path);
    TestFile test;
    test.file_ = File(fd, path);
    test.path_ = path;
    return test;
  }
  TestFile() = default;
  TestFile(TestFile&& other) noexcept
      : file_(std::move(other.file_)), path_(std::exchange(other.path_, {})) {}
  TestFile& operator=(TestFile&&) = delete;
  TestFile(const TestFile&) = delete;
  ~TestFile() {
    file_ = File();
    if (!path_.empty()) ::unlink(path_.c_str());
  }

  int fd() const { return file_.fd(); }
  const std::string& path() const { return path_; }

 private:
  File file_;
  std::string path_;
};

}  // namespace

// ---- public -----------------------------------------------------------------------------------

const char* storage_pattern_rw(StoragePattern pattern) {
  switch (pattern) {
    case StoragePattern::kSeqWrite: return "write";
    case StoragePattern::kSeqRead: return "read";
    case StoragePattern::kRandRead: return "randread";
  }
  return "?";
}

const char* storage_engine_name(StorageEngine engine) {
  return engine == StorageEngine::kIoUring ? "io_uring" : "psync";
}

std::string StorageJob::name() const {
  return std::string(storage_pattern_rw(pattern)) + "-" + size_suffix(block_size) + "-qd" +
         std::to_string(depth) + "-" + storage_engine_name(engine);
}

std::optional<double> StorageJobResult::ratio_mb_s() const {
  if (!fio || fio->mb_s() <= 0) return std::nullopt;
  return zerowait.mb_s() / fio->mb_s();
}

double storage_ramp_seconds(double runtime_s) { return std::min(kMaxRamp, runtime_s / 5); }

unsigned storage_bench_cycles(double runtime_s) {
  return unsigned(std::clamp(std::floor(runtime_s / kMinFioSlice), 1.0, double(kMaxCycles)));
}

Result<std::vector<StorageJob>> plan_storage_jobs(const std::vector<unsigned>& random_depths) {
  if (random_depths.empty()) return invalid_argument("--depths needs at least one queue depth");
  for (unsigned depth : random_depths) {
    if (depth == 0 || depth > kMaxDepth) {
      return invalid_argument("queue depth " + std::to_string(depth) + " is out of range: give "
                              "--depths values from 1 to " + std::to_string(kMaxDepth));
    }
  }
  std::vector<StorageJob> jobs;
  const StorageEngine engines[] = {StorageEngine::kIoUring, StorageEngine::kPsync};
  for (StorageEngine engine : engines) {
    jobs.push_back({StoragePattern::kSeqRead, kSequentialBlock, kSequentialDepth, engine});
  }
  for (uint64_t block : {uint64_t{4} << 10, uint64_t{128} << 10}) {
    for (unsigned depth : random_depths) {
      for (StorageEngine engine : engines) {
        jobs.push_back({StoragePattern::kRandRead, block, depth, engine});
      }
    }
  }
  for (StorageEngine engine : engines) {
    jobs.push_back({StoragePattern::kSeqWrite, kSequentialBlock, kSequentialDepth, engine});
  }
  return jobs;
}

uint64_t storage_bench_required_bytes(uint64_t size) {
  return size + size / 10 + kStorageBenchReserve;
}

Status check_storage_bench_dir(const std::string& dir, uint64_t size) {
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0) return errno_status(errno, "cannot measure", dir);
  if (!S_ISDIR(info.st_mode)) {
    return invalid_argument("'" + dir + "' is not a directory: give a directory on the storage "
                            "to measure (the test file is created in it)");
  }
  struct statvfs space {};
  if (::statvfs(dir.c_str(), &space) != 0) {
    return errno_status(errno, "cannot read the free space (statvfs) of", dir);
  }
  const uint64_t available = uint64_t(space.f_bavail) * space.f_frsize;
  const uint64_t needed = storage_bench_required_bytes(size);
  if (available < needed || needed < size) {
    return Status(ErrorCode::kResourceExhausted,
                  "not enough free space in '" + dir + "': a test file of " + gib_text(size) +
                      " needs " + gib_text(needed) + " free (the file, 10 % more and 1 GiB "
                      "kept free), and " + gib_text(available) +
                      " are available; choose a smaller --size");
  }
  // An unnamed file tells without leaving anything behind; where O_TMPFILE itself is not
  // supported, creating the test file tells later.
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
  } else if (errno == EINVAL) {
    return direct_unsupported(dir, "open(O_TMPFILE | O_DIRECT): Invalid argument");
  }
  return Status::ok();
}

Result<std::string> fio_version(const std::string& fio_command) {
  ZW_ASSIGN_OR_RETURN(ProcessOutput output,
                      run_process({fio_command, "--version"}, 30, nullptr, {}));
  std::string version = output.out.substr(0, output.out.find('\n'));
  if (output.exit_code != 0 || version.empty()) {
    return not_found("'" + fio_command + " --version' failed (exit status " +
                     std::to_string(output.exit_code) + "): " + tail(output.err, 500));
  }
  return version;
}

Result<JobMeasurement> parse_fio_json(std::string_view output, StoragePattern pattern) {
  ZW_ASSIGN_OR_RETURN(FioRun run, parse_fio_run(output, pattern));
  return run.summary();
}

std::vector<std::string> fio_job_arguments(const StorageJob& job, const std::string& file,
                                           uint64_t size, double runtime_s, double ramp_s) {
  const bool psync = job.engine == StorageEngine::kPsync;
  const bool random = job.pattern == StoragePattern::kRandRead;
  // psync's sequential threads each stream through their own stripe, as run_psync's do.
  const uint64_t job_size =
      psync && !random ? internal::align_down(size / job.depth, job.block_size) : size;
  std::vector<std::string> args = {
      "--name=" + job.name(),
      "--filename=" + fio_file_name(file),
      "--size=" + std::to_string(job_size),
      "--direct=1",
      std::string("--ioengine=") + storage_engine_name(job.engine),
      std::string("--rw=") + storage_pattern_rw(job.pattern),
      "--bs=" + std::to_string(job.block_size),
      "--time_based",
      "--runtime=" + fio_time(runtime_s),
      "--randrepeat=0",
      "--group_reporting",
      "--thread",
      "--output-format=json+",
      "--mem_align=" + std::to_string(2 << 20),  // buffers on a huge page (fio_environment)
  };
  if (ramp_s > 0) args.push_back("--ramp_time=" + fio_time(ramp_s));
  // Uniform offsets with repeats, as zerowait draws them (fio's default map avoids repeats).
  if (random) args.push_back("--norandommap");
  if (psync) {
    args.push_back("--numjobs=" + std::to_string(job.depth));
    if (!random) args.push_back("--offset_increment=" + std::to_string(job_size));
  } else {
    args.push_back("--iodepth=" + std::to_string(job.depth));
  }
  return args;
}

Result<JobMeasurement> run_storage_job(int fd, const std::string& path, uint64_t size,
                                       const StorageJob& job, double ramp_s, double runtime_s,
                                       const std::atomic<bool>* stop) {
  if (job.depth == 0 || job.block_size == 0 || job.block_size % kDirectIoAlignment != 0 ||
      size < job.block_size * job.depth || size % job.block_size != 0) {
    return invalid_argument("job " + job.name() + " does not fit a file of " +
                            std::to_string(size) + " bytes");
  }
  ZW_ASSIGN_OR_RETURN(RawRun run,
                      run_job_raw(fd, path, size, job, timed_window(ramp_s, runtime_s), stop));
  return run.summary();
}

Result<StorageBenchReport> run_storage_bench(const StorageBenchOptions& options) {
  if (!(options.runtime_s > 0) || options.runtime_s > 3600) {
    return invalid_argument("--runtime must be between 0 and 3600 seconds, not " +
                            std::to_string(options.runtime_s));
  }
  ZW_ASSIGN_OR_RETURN(std::vector<StorageJob> jobs, plan_storage_jobs(options.random_depths));
  // Whole blocks for every sequential stream, so that the fill covers the file exactly.
  const uint64_t size = internal::align_down(options.size, kStorageBenchMinSize);
  if (size < kStorageBenchMinSize) {
    return invalid_argument("--size " + std::to_string(options.size) + " is too small: the test "
                            "file needs at least " + std::to_string(kStorageBenchMinSize >> 20) +
                            " MiB");
  }
  ZW_RETURN_IF_ERROR(check_storage_bench_dir(options.dir, size));
  const auto progress = [&](const std::string& message) {
    if (options.progress) options.progress(message);
  };

  StorageBenchReport report;
  report.dir = options.dir;
  report.size = size;
  report.runtime_s = options.runtime_s;
  report.ramp_s = storage_ramp_seconds(options.runtime_s);
  if (!options.use_fio) {
    report.notes.push_back("fio not run (--no-fio)");
  } else if (Result<std::string> version = fio_version(options.fio_command); version.is_ok()) {
    report.fio_version = *version;
  } else {
    report.notes.push_back("fio not run: " + version.status().message() +
                           " (install it: apt-get install fio)");
  }
  if (!io_uring_available()) {
    std::erase_if(jobs, [](const StorageJob& j) { return j.engine == StorageEngine::kIoUring; });
    report.notes.push_back("io_uring jobs skipped: " + io_uring_unavailable_reason());
  }
  const bool with_fio = !report.fio_version.empty();
  if (!huge_pages_enabled()) {
    report.notes.push_back(
        "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled): buffers "
        "are in 4 KiB pages on both sides, and their physical layout moves the MB/s of 128 KiB "
        "and 1 MiB requests up to 2.4x from run to run");
  }

  ZW_ASSIGN_OR_RETURN(TestFile file, TestFile::create(options.dir));
  report.file = file.path();
  // A write run ends with fdatasync, which makes the virtual disk's host write back what it
  // cached: otherwise that write-back slows whichever run comes next (reads measured up to 1.8x
  // apart right after 40 GB of writes).
  const auto flush_writes = [&](const StorageJob& job) -> Status {
    if (job.pattern != StoragePattern::kSeqWrite) return Status::ok();
    if (::fdatasync(file.fd()) != 0) return errno_status(errno, "cannot fdatasync", file.path());
    return Status::ok();
  };
  const auto run_zerowait = [&](const StorageJob& job, double runtime_s) -> Result<RawRun> {
    ZW_ASSIGN_OR_RETURN(RawRun run,
                        run_job_raw(file.fd(), file.path(), size, job,
                                    timed_window(report.ramp_s, runtime_s), options.stop));
    ZW_RETURN_IF_ERROR(flush_writes(job));
    return run;
  };

  // Written whole before anything reads it: reading never-written blocks costs the disk nothing.
  progress("writing the " + std::to_string(size >> 20) + " MiB test file " + file.path());
  const StorageJob fill{StoragePattern::kSeqWrite, kSequentialBlock, kSequentialDepth,
                        StorageEngine::kPsync};
  ZW_RETURN_IF_ERROR(
      run_job_raw(file.fd(), file.path(), size, fill, {0, UINT64_MAX, true}, options.stop)
          .status());
  ZW_RETURN_IF_ERROR(flush_writes(fill));
  struct stat written {};
  if (::fstat(file.fd(), &written) != 0) return errno_status(errno, "cannot fstat", file.path());
  if (uint64_t(written.st_size) != size) {
    return Status(ErrorCode::kInternal, "the test file '" + file.path() + "' holds " +
                                            std::to_string(written.st_size) + " bytes after "
                                            "the fill, not " + std::to_string(size));
  }

  // With fio the sides alternate in slices, zerowait first and last (A BB AA BB ... BB A): a
  // drift of the disk during the job (linear in time) weighs the same on both, and a burst of
  // a few seconds (this disk has them) lands on both sides more often than with one swap.
  const unsigned cycles = with_fio ? storage_bench_cycles(options.runtime_s) : 1;
  const double slice = options.runtime_s / (2.0 * cycles);
  report.fio_slices = with_fio ? cycles : 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const StorageJob& job = jobs[i];
    const std::string step = "job " + std::to_string(i + 1) + "/" + std::to_string(jobs.size()) +
                             " " + job.name() + ": ";
    progress(step + "zerowait");
    ZW_ASSIGN_OR_RETURN(RawRun ours, run_zerowait(job, with_fio ? slice : options.runtime_s));
    std::vector<FioRun> fio_runs;
    for (unsigned cycle = 0; cycle < (with_fio ? cycles : 0); ++cycle) {
      progress(step + "fio" + (cycles > 1 ? " " + std::to_string(cycle + 1) + "/" +
                                                std::to_string(cycles)
                                          : std::string()));
      ZW_ASSIGN_OR_RETURN(FioRun fio,
                          run_fio_job(options.fio_command, job, file.path(), size, 2 * slice,
                                      report.ramp_s, options.stop));
      fio_runs.push_back(std::move(fio));
      ZW_RETURN_IF_ERROR(flush_writes(job));
      progress(step + "zerowait");
      ZW_ASSIGN_OR_RETURN(RawRun more,
                          run_zerowait(job, cycle + 1 < cycles ? 2 * slice : slice));
      ours.merge(more);
    }
    if (stopped(options.stop)) return cancelled();
    StorageJobResult result{job, ours.summary(), std::nullopt};
    if (!fio_runs.empty()) result.fio = merge_fio_runs(fio_runs);
    report.jobs.push_back(std::move(result));
  }
  return report;
}

}  // namespace zerowait
