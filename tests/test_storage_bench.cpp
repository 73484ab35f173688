// `zerowait bench storage`: the jobs' plan, fio's command line and JSON, the engines on a real
// O_DIRECT file, the checks before anything is written, and the command end to end (with fio
// where it is installed), including the test file's removal on SIGTERM.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "testing/testing.hpp"
#include "zerowait/diagnose/storage_bench.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using testing::run_cli;
using testing::TempDir;

using testing::kMiB;

// The bench's test files left in `dir` (there must be none once a run has ended).
std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".zerowait-bench-", 0) == 0) found.push_back(name);
  }
  return found;
}

void expect_sane(const JobMeasurement& m, uint64_t block_size, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_GT(m.ios, 0u);
  EXPECT_EQ(m.bytes, m.ios * block_size);
  EXPECT_GT(m.seconds, 0);
  EXPECT_GT(m.mb_s(), 0);
  EXPECT_GT(m.iops(), 0);
  EXPECT_GT(m.p50_us, 0);
  EXPECT_LE(m.p50_us, m.p99_us);
  EXPECT_LE(m.p99_us, m.p999_us);
}

bool fio_installed() { return fio_version("fio").is_ok(); }

TEST(StorageBenchPlan, CoversEveryPatternEngineAndDepth) {
  Result<std::vector<StorageJob>> jobs = plan_storage_jobs({1, 32});
  ASSERT_TRUE(jobs.is_ok()) << jobs.status().to_string();
  // 2 sequential patterns + 2 random block sizes x 2 depths, each through 2 engines.
  ASSERT_EQ(jobs->size(), 12u);
  std::set<std::string> names;
  for (const StorageJob& job : *jobs) names.insert(job.name());
  EXPECT_EQ(names.size(), jobs->size()) << "job names must be unique (they name fio's jobs)";
  EXPECT_EQ((*jobs)[0].pattern, StoragePattern::kSeqRead);
  EXPECT_EQ((*jobs)[0].depth, kSequentialDepth);
  EXPECT_EQ(jobs->back().pattern, StoragePattern::kSeqWrite) << "writes last, after the reads";
  EXPECT_TRUE(names.count("randread-4k-qd32-io_uring"));
  EXPECT_TRUE(names.count("randread-128k-qd1-psync"));
  EXPECT_TRUE(names.count("read-1M-qd4-psync"));
}

TEST(StorageBenchPlan, RefusesBadDepths) {
  EXPECT_EQ(plan_storage_jobs({}).status().code(), ErrorCode::kInvalidArgument);
  const Status zero = plan_storage_jobs({1, 0}).status();
  EXPECT_EQ(zero.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("--depths"), std::string::npos) << zero.message();
}

TEST(StorageBenchFio, ArgumentsMatchTheJob) {
  const StorageJob seq_psync{StoragePattern::kSeqRead, kSequentialBlock, 4, StorageEngine::kPsync};
  const std::vector<std::string> seq =
      fio_job_arguments(seq_psync, "/data/a:b", 64 * kMiB, 2.0, 0.25);
  const auto has = [](const std::vector<std::string>& args, const std::string& arg) {
    return std::find(args.begin(), args.end(), arg) != args.end();
  };
  EXPECT_TRUE(has(seq, "--filename=/data/a\\:b")) << "a ':' is fio's file separator";
  EXPECT_TRUE(has(seq, "--direct=1"));
  EXPECT_TRUE(has(seq, "--ioengine=psync"));
  EXPECT_TRUE(has(seq, "--numjobs=4"));
  // Each of the 4 threads streams through its own 16 MiB stripe.
  EXPECT_TRUE(has(seq, "--size=" + std::to_string(16 * kMiB)));
  EXPECT_TRUE(has(seq, "--offset_increment=" + std::to_string(16 * kMiB)));
  EXPECT_TRUE(has(seq, "--runtime=2000ms"));
  EXPECT_TRUE(has(seq, "--ramp_time=250ms"));
  EXPECT_TRUE(has(seq, "--time_based"));
  EXPECT_TRUE(has(seq, "--randrepeat=0"));
  EXPECT_TRUE(has(seq, "--group_reporting"));
  EXPECT_TRUE(has(seq, "--output-format=json+")) << "the bins, to merge runs exactly";
  EXPECT_TRUE(has(seq, "--mem_align=2097152")) << "buffers on a huge page, as zerowait's";

  const StorageJob rand_ring{StoragePattern::kRandRead, 4096, 32, StorageEngine::kIoUring};
  const std::vector<std::string> rand = fio_job_arguments(rand_ring, "/f", 64 * kMiB, 1, 0.2);
  EXPECT_TRUE(has(rand, "--ioengine=io_uring"));
  EXPECT_TRUE(has(rand, "--iodepth=32"));
  EXPECT_TRUE(has(rand, "--rw=randread"));
  EXPECT_TRUE(has(rand, "--bs=4096"));
  EXPECT_TRUE(has(rand, "--size=" + std::to_string(64 * kMiB)));
  EXPECT_FALSE(has(rand, "--numjobs=32"));
}

// The shape of fio 3.33's --output-format=json, cut to what is read, after a warning line.
constexpr const char* kFioOutput = R"(fio: some warning before the JSON
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "randread-4k-qd32-io_uring",
      "error" : 0,
      "read" : {
        "io_bytes" : 409600000, "bw_bytes" : 204800000, "iops" : 50000.0,
        "runtime" : 2000, "total_ios" : 100000,
        "clat_ns" : { "percentile" : { "1.000000" : 100, "50.000000" : 250000,
                                       "99.000000" : 900000, "99.900000" : 1500000 } }
      },
      "write" : { "io_bytes" : 0, "total_ios" : 0, "runtime" : 0 }
    }
  ]
})";

TEST(StorageBenchFio, ParsesTheJsonOutput) {
  Result<JobMeasurement> m = parse_fio_json(kFioOutput, StoragePattern::kRandRead);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->bytes, 409600000u);
  EXPECT_EQ(m->ios, 100000u);
  EXPECT_DOUBLE_EQ(m->seconds, 2.0);
  EXPECT_DOUBLE_EQ(m->mb_s(), 204.8);
  EXPECT_DOUBLE_EQ(m->iops(), 50000);
  EXPECT_DOUBLE_EQ(m->p50_us, 250);
  EXPECT_DOUBLE_EQ(m->p99_us, 900);
  EXPECT_DOUBLE_EQ(m->p999_us, 1500);
  // The write side of that job did nothing: asking for it is an error, not zeros.
  EXPECT_EQ(parse_fio_json(kFioOutput, StoragePattern::kSeqWrite).status().code(),
            ErrorCode::kCorrupt);
}

TEST(StorageBenchFio, PercentilesComeFromTheBinsOfJsonPlus) {
  // 100 reads: 50 at 10 us, 49 at 20 us, 1 at 900 us; fio's own percentiles say otherwise, so
  // the test sees which were used.
  const std::string output = R"({"jobs": [{"jobname": "j", "error": 0, "read": {
      "io_bytes": 409600, "total_ios": 100, "runtime": 1000,
      "clat_ns": {"percentile": {"50.000000": 1, "99.000000": 2, "99.900000": 3},
                  "bins": {"10000": 50, "20000": 49, "900000": 1}}}}]})";
  Result<JobMeasurement> m = parse_fio_json(output, StoragePattern::kRandRead);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->ios, 100u);
  EXPECT_NEAR(m->p50_us, 10, 0.1);
  EXPECT_NEAR(m->p99_us, 20, 0.2);
  EXPECT_NEAR(m->p999_us, 900, 9);
}

TEST(StorageBenchPlan, CyclesGrowWithTheRuntime) {
  EXPECT_EQ(storage_bench_cycles(0.2), 1u);
  EXPECT_EQ(storage_bench_cycles(3), 2u);
  EXPECT_EQ(storage_bench_cycles(5), 3u);
  EXPECT_EQ(storage_bench_cycles(600), 4u);
  EXPECT_DOUBLE_EQ(storage_ramp_seconds(0.2), 0.04);
  EXPECT_DOUBLE_EQ(storage_ramp_seconds(60), 0.5);
}

TEST(StorageBenchFio, ReportsBrokenOrFailedOutput) {
  EXPECT_EQ(parse_fio_json("fio: command not understood", StoragePattern::kSeqRead)
                .status()
                .code(),
            ErrorCode::kCorrupt);
  EXPECT_EQ(parse_fio_json("{\"jobs\": [}", StoragePattern::kSeqRead).status().code(),
            ErrorCode::kCorrupt);
  const Status failed =
      parse_fio_json(R"({"jobs": [{"jobname": "j", "error": 5, "read": {}}]})",
                     StoragePattern::kSeqRead)
          .status();
  EXPECT_EQ(failed.code(), ErrorCode::kIo);
  EXPECT_NE(failed.message().find("error 5"), std::string::npos) << failed.message();
}

// A file of `size` random bytes opened O_RDWR | O_DIRECT, as the bench opens its test file.
class DirectFile : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_ / "data";
    testing::write_file(path_, testing::random_bytes(kSize, 7));
    fd_ = ::open(path_.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (fd_ < 0 && errno == EINVAL) GTEST_SKIP() << "no O_DIRECT in " << dir_.path();
    ASSERT_GE(fd_, 0) << std::strerror(errno);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
  }

  static constexpr uint64_t kSize = 8 * kMiB;
  TempDir dir_;
  std::string path_;
  int fd_ = -1;
};

TEST_F(DirectFile, EveryJobMeasuresRequests) {
  Result<std::vector<StorageJob>> jobs = plan_storage_jobs({1, 3});
  ASSERT_TRUE(jobs.is_ok());
  for (const StorageJob& job : *jobs) {
    Result<JobMeasurement> m = run_storage_job(fd_, path_, kSize, job, 0.01, 0.05);
    ASSERT_TRUE(m.is_ok()) << job.name() << ": " << m.status().to_string();
    expect_sane(*m, job.block_size, job.name());
  }
  EXPECT_EQ(fs::file_size(path_), kSize) << "sequential writes wrap inside the file";
}

// The kernel's own count of this process's reads from storage (/proc/self/io read_bytes).
uint64_t storage_read_bytes() {
  std::ifstream in("/proc/self/io");
  std::string name;
  uint64_t value = 0;
  while (in >> name >> value) {
    if (name == "read_bytes:") return value;
  }
  return 0;
}

// Ground truth beside the bench's own count: O_DIRECT reads all go to the device, which the
// kernel counts per process. With no ramp, every byte read is a measured byte, but for the
// requests still in flight when the window closed (at most `depth`), which are not measured.
TEST_F(DirectFile, ReadBytesMatchWhatTheKernelCounted) {
  for (const StorageJob& job :
       {StorageJob{StoragePattern::kRandRead, 4096, 1, StorageEngine::kPsync},
        StorageJob{StoragePattern::kSeqRead, kSequentialBlock, 1, StorageEngine::kPsync}}) {
    const uint64_t before = storage_read_bytes();
    Result<JobMeasurement> m = run_storage_job(fd_, path_, kSize, job, 0, 0.05);
    const uint64_t counted = storage_read_bytes() - before;
    ASSERT_TRUE(m.is_ok()) << job.name() << ": " << m.status().to_string();
    if (counted == 0)
      GTEST_SKIP() << "this kernel does not count the reads (no task I/O accounting)";
    EXPECT_GE(counted, m->bytes) << job.name();
    EXPECT_LE(counted - m->bytes, job.depth * job.block_size) << job.name();
    EXPECT_EQ(m->bytes, m->ios * job.block_size) << job.name();
  }
}

TEST_F(DirectFile, StopsWhenAsked) {
  const std::atomic<bool> stop{true};
  const StorageJob job{StoragePattern::kRandRead, 4096, 2, StorageEngine::kIoUring};
  EXPECT_EQ(run_storage_job(fd_, path_, kSize, job, 0, 30, &stop).status().code(),
            ErrorCode::kCancelled);
}

TEST_F(DirectFile, ReadErrorsNameTheFile) {
  // A file shorter than the job thinks: a read past its end returns 0 bytes.
  const StorageJob job{StoragePattern::kRandRead, 4096, 1, StorageEngine::kPsync};
  const Status s = run_storage_job(fd_, path_, 4 * kSize, job, 0, 0.5).status();
  // Random offsets land past the end three times in four: the first one fails the job.
  ASSERT_EQ(s.code(), ErrorCode::kIo) << s.to_string();
  EXPECT_NE(s.message().find(path_), std::string::npos) << s.message();
}

TEST(StorageBenchChecks, RefusesMoreThanTheFreeSpace) {
  TempDir dir;
  const Status s = check_storage_bench_dir(dir.path(), uint64_t{1} << 60);
  ASSERT_EQ(s.code(), ErrorCode::kResourceExhausted) << s.to_string();
  EXPECT_NE(s.message().find("--size"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(std::to_string(storage_bench_required_bytes(uint64_t{1} << 60))),
            std::string::npos)
      << "the message gives the space needed: " << s.message();
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

TEST(StorageBenchChecks, RefusesWhatIsNotADirectory) {
  TempDir dir;
  testing::write_file(dir / "file", "x");
  EXPECT_EQ(check_storage_bench_dir(dir / "file", 16 * kMiB).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(check_storage_bench_dir(dir / "missing", 16 * kMiB).code(), ErrorCode::kNotFound);
}

TEST(StorageBenchChecks, RefusesAFilesystemWithoutODirect) {
  const std::string shm = "/dev/shm";
  if (!fs::is_directory(shm)) GTEST_SKIP() << "no " << shm;
  const int fd = ::open(shm.c_str(), O_TMPFILE | O_RDWR | O_DIRECT, 0600);
  if (fd >= 0) {
    ::close(fd);
    GTEST_SKIP() << "SKIPPED LOUDLY: tmpfs at " << shm
                 << " accepts O_DIRECT on this kernel (Linux >= 6.6): no filesystem here refuses "
                    "it, so the refusal cannot be seen";
  }
  const Status s = check_storage_bench_dir(shm, 16 * kMiB);
  ASSERT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  EXPECT_NE(s.message().find("O_DIRECT"), std::string::npos) << s.message();
}

TEST(StorageBench, RunsEveryJobAndRemovesTheFile) {
  TempDir dir;
  StorageBenchOptions options;
  options.dir = dir.path();
  options.size = 18 * kMiB;  // rounded down to whole 4 MiB: a 1 MiB block per sequential stream
  options.runtime_s = 0.05;
  options.random_depths = {2};
  options.use_fio = false;
  std::vector<std::string> steps;
  options.progress = [&](const std::string& message) { steps.push_back(message); };
  Result<StorageBenchReport> report = run_storage_bench(options);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->size, 16 * kMiB);
  EXPECT_TRUE(report->fio_version.empty());
  ASSERT_FALSE(report->notes.empty());
  EXPECT_NE(report->notes[0].find("--no-fio"), std::string::npos);
  ASSERT_EQ(report->jobs.size(), 8u);
  for (const StorageJobResult& r : report->jobs) {
    expect_sane(r.zerowait, r.job.block_size, r.job.name());
    EXPECT_FALSE(r.fio.has_value());
    EXPECT_FALSE(r.ratio_mb_s().has_value());
  }
  EXPECT_EQ(report->file, dir.path() + "/.zerowait-bench-" + std::to_string(::getpid()));
  EXPECT_FALSE(fs::exists(report->file));
  EXPECT_TRUE(leftovers(dir.path()).empty());
  EXPECT_GE(steps.size(), report->jobs.size()) << "one progress line per job at least";
}

// A window shorter than one request: every job still measures at least one, the one that ended
// after the window, and its time runs to that request (a busy machine gives the same shape).
TEST(StorageBench, AWindowShorterThanOneRequestStillMeasuresOne) {
  TempDir dir;
  StorageBenchOptions options;
  options.dir = dir.path();
  options.size = 16 * kMiB;
  options.runtime_s = 1e-9;
  options.random_depths = {1};
  options.use_fio = false;
  Result<StorageBenchReport> report = run_storage_bench(options);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  ASSERT_FALSE(report->jobs.empty());
  for (const StorageJobResult& r : report->jobs) {
    expect_sane(r.zerowait, r.job.block_size, r.job.name());
  }
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

TEST(StorageBench, StopRemovesTheFile) {
  TempDir dir;
  std::atomic<bool> stop{false};
  StorageBenchOptions options;
  options.dir = dir.path();
  options.size = 16 * kMiB;
  options.runtime_s = 60;
  options.use_fio = false;
  options.stop = &stop;
  // Stop as soon as the first measured job starts (the file exists then).
  options.progress = [&](const std::string& message) {
    if (message.find("job 1/") != std::string::npos) {
      EXPECT_EQ(leftovers(dir.path()).size(), 1u);
      stop = true;
    }
  };
  const Status s = run_storage_bench(options).status();
  EXPECT_EQ(s.code(), ErrorCode::kCancelled) << s.to_string();
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

TEST(StorageBench, RefusesATooSmallFile) {
  TempDir dir;
  StorageBenchOptions options;
  options.dir = dir.path();
  options.size = kMiB;
  options.use_fio = false;
  const Status s = run_storage_bench(options).status();
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

// ---- the command ----------------------------------------------------------------------------

nlohmann::json parse_output(const testing::CommandResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

void expect_sane_json(const nlohmann::json& m, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(m.is_object());
  EXPECT_GT(m["mb_s"].get<double>(), 0);
  EXPECT_GT(m["iops"].get<double>(), 0);
  const nlohmann::json& lat = m["lat_us"];
  EXPECT_GT(lat["p50"].get<double>(), 0);
  EXPECT_LE(lat["p50"].get<double>(), lat["p99"].get<double>());
  EXPECT_LE(lat["p99"].get<double>(), lat["p99_9"].get<double>());
}

TEST(BenchStorageCli, JsonWithoutFio) {
  TempDir dir;
  const testing::CommandResult r = run_cli({"bench", "storage", dir.path(), "--size", "16M",
                                            "--runtime", "0.2", "--depths", "1,2", "--no-fio",
                                            "--json"});
  const nlohmann::json out = parse_output(r);
  EXPECT_EQ(out["path"], dir.path());
  EXPECT_EQ(out["size"], 16 * kMiB);
  EXPECT_TRUE(out["fio_version"].is_null());
  EXPECT_EQ(out["fio_slices"], 0);
  ASSERT_EQ(out["jobs"].size(), 12u);
  for (const nlohmann::json& job : out["jobs"]) {
    const std::string name = job["name"];
    expect_sane_json(job["zerowait"], name);
    EXPECT_TRUE(job["fio"].is_null()) << name;
    EXPECT_TRUE(job["ratio_mb_s"].is_null()) << name;
    EXPECT_TRUE(job["engine"] == "io_uring" || job["engine"] == "psync") << name;
  }
  EXPECT_TRUE(r.err.empty()) << "no progress lines with --json: " << r.err;
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

TEST(BenchStorageCli, SideBySideWithFio) {
  if (!fio_installed()) {
    GTEST_SKIP() << "SKIPPED LOUDLY: fio is not installed (apt-get install fio)";
  }
  TempDir dir;
  const testing::CommandResult r = run_cli({"bench", "storage", dir.path(), "--size", "16M",
                                            "--runtime", "0.2", "--depths", "2", "--json"});
  const nlohmann::json out = parse_output(r);
  ASSERT_TRUE(out["fio_version"].is_string());
  EXPECT_EQ(out["fio_version"].get<std::string>().rfind("fio-", 0), 0u);
  EXPECT_EQ(out["fio_slices"], 1) << "0.2 s per side is one fio run per job";
  ASSERT_EQ(out["jobs"].size(), 8u);
  for (const nlohmann::json& job : out["jobs"]) {
    const std::string name = job["name"];
    expect_sane_json(job["zerowait"], name);
    expect_sane_json(job["fio"], name + " (fio)");
    EXPECT_GT(job["ratio_mb_s"].get<double>(), 0) << name;
  }
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

TEST(BenchStorageCli, TablePrintsEveryJob) {
  TempDir dir;
  const testing::CommandResult r = run_cli({"bench", "storage", dir.path(), "--size", "16M",
                                            "--runtime", "0.1", "--depths", "3", "--no-fio"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("seq write 1M"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rand read 128K"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("note: fio not run (--no-fio)"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("job 1/8"), std::string::npos) << "progress on stderr: " << r.err;
}

TEST(BenchStorageCli, AnUnprivilegedUserIsToldThePageCacheIsBypassed) {
  TempDir dir;
  fs::permissions(dir.path(), fs::perms::all);  // the unprivileged user writes the test file
  const testing::CommandResult json =
      testing::run_cli_unprivileged({"bench", "storage", dir.path(), "--size", "16M", "--runtime",
                                     "0.1", "--depths", "1", "--no-fio", "--json"});
  const nlohmann::json out = parse_output(json);
  EXPECT_EQ(out["cold_cache"]["method"], "O_DIRECT");
  EXPECT_EQ(out["cold_cache"]["needs_root"], false);
  EXPECT_NE(out["cold_cache"]["stays_warm"].get<std::string>().find("storage's own caches"),
            std::string::npos)
      << out["cold_cache"];
  ASSERT_EQ(out["jobs"].size(), 8u);
  for (const nlohmann::json& job : out["jobs"]) expect_sane_json(job["zerowait"], job["name"]);

  const testing::CommandResult text =
      testing::run_cli_unprivileged({"bench", "storage", dir.path(), "--size", "16M", "--runtime",
                                     "0.1", "--depths", "1", "--no-fio"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("cold cache: O_DIRECT, no root needed"), std::string::npos) << text.out;
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

TEST(BenchStorageCli, RefusesMoreThanTheFreeSpace) {
  TempDir dir;
  const testing::CommandResult r =
      run_cli({"bench", "storage", dir.path(), "--size", "1000000G", "--no-fio"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("free"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--size"), std::string::npos) << r.err;
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

TEST(BenchStorageCli, SigtermRemovesTheFile) {
  TempDir dir;
  testing::CommandResult r;
  std::thread command([&] {
    r = run_cli({"bench", "storage", dir.path(), "--size", "16M", "--runtime", "60", "--no-fio"});
  });
  // The file's name carries the command's pid: wait for it to appear, then signal that pid.
  pid_t pid = 0;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (pid == 0 && std::chrono::steady_clock::now() < give_up) {
    for (const std::string& name : leftovers(dir.path())) {
      pid = std::stoi(name.substr(std::string(".zerowait-bench-").size()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (pid != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(::kill(pid, SIGTERM), 0);
  }
  command.join();
  ASSERT_NE(pid, 0) << "the test file never appeared: " << r.err;
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("SIGTERM"), std::string::npos) << r.err;
  EXPECT_TRUE(leftovers(dir.path()).empty());
}

}  // namespace
}  // namespace zerowait
