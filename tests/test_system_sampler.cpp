// The system sampler against fixture /proc and /sys trees written here: two readings give the
// rates, shares, queue and latency by hand computation; partitions and idle loop devices are
// skipped; missing files give zeros, not a crash; merged neighbours by hand computation. Two
// tests sample the live machine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "testing/doctor_fixture.hpp"
#include "zerowait/observe/system_sampler.hpp"

namespace zerowait {
namespace {

using observe::SystemSample;
using observe::SystemSampler;
using observe::SystemSamplerOptions;
using testing::DoctorFixture;

constexpr pid_t kPid = 100;

// A /proc/PID/stat line: the fields the sampler reads (ppid 4, utime 14, stime 15, rss 24) and
// filler for the rest. The command name holds a space and a ')' as real ones may.
std::string stat_line(pid_t pid, char state, pid_t ppid, uint64_t utime, uint64_t stime,
                      uint64_t rss_pages) {
  return std::to_string(pid) + " (py thon) x) " + state + " " + std::to_string(ppid) +
         " 1 1 0 -1 4194304 0 0 0 0 " + std::to_string(utime) + " " + std::to_string(stime) +
         " 0 0 20 0 1 0 5000 100000 " + std::to_string(rss_pages) + " 0 0 0 0 0 0 0\n";
}

void process(DoctorFixture& fx, pid_t pid, pid_t ppid, uint64_t utime, uint64_t stime,
             uint64_t rss_pages, uint64_t read_bytes, uint64_t write_bytes) {
  const std::string dir = "/proc/" + std::to_string(pid);
  fx.file(dir + "/stat", stat_line(pid, 'S', ppid, utime, stime, rss_pages));
  fx.file(dir + "/io", "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: " +
                           std::to_string(read_bytes) + "\nwrite_bytes: " +
                           std::to_string(write_bytes) + "\ncancelled_write_bytes: 0\n");
}

void task(DoctorFixture& fx, pid_t pid, pid_t tid, char state) {
  fx.file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) + "/stat",
          stat_line(tid, state, 1, 0, 0, 0));
}

// major minor name, reads merged sectors ms, writes merged sectors ms, in_flight io_ms weighted
std::string disk_line(const std::string& name, uint64_t reads, uint64_t sectors_read,
                      uint64_t read_ms, uint64_t writes, uint64_t sectors_written,
                      uint64_t write_ms, uint64_t io_ms, uint64_t weighted_ms) {
  return " 254 0 " + name + " " + std::to_string(reads) + " 0 " + std::to_string(sectors_read) +
         " " + std::to_string(read_ms) + " " + std::to_string(writes) + " 0 " +
         std::to_string(sectors_written) + " " + std::to_string(write_ms) + " 0 " +
         std::to_string(io_ms) + " " + std::to_string(weighted_ms) + " 0 0 0 0\n";
}

// The machine at the first reading.
void first_reading(DoctorFixture& fx) {
  fx.file("/proc/stat", "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n");
  fx.file("/proc/meminfo", "MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 400 kB\n");
  fx.file("/proc/vmstat", "nr_free_pages 5\npswpin 100\npswpout 10\n");
  fx.dir("/sys/block/vda");
  fx.dir("/sys/block/loop0");
  fx.dir("/sys/block/loop1");
  fx.file("/proc/diskstats", disk_line("vda", 100, 1000, 500, 50, 0, 300, 1000, 2000) +
                                 disk_line("vda1", 100, 1000, 500, 50, 0, 300, 1000, 2000) +
                                 disk_line("loop0", 0, 0, 0, 0, 0, 0, 0, 0) +
                                 disk_line("loop1", 10, 80, 5, 0, 0, 0, 5, 5));
  process(fx, kPid, 1, 10, 0, 1000, 0, 0);
  process(fx, 101, kPid, 0, 5, 500, 0, 0);
  process(fx, 200, 1, 0, 0, 99999, 0, 0);  // not in the tree
  task(fx, kPid, kPid, 'R');
  task(fx, 101, 101, 'S');
}

// 0.5 s later.
void second_reading(DoctorFixture& fx) {
  fx.file("/proc/stat", "cpu  130 0 70 830 70 0 0 0 0 0\n");
  fx.file("/proc/meminfo", "MemTotal: 1000 kB\nMemFree: 10 kB\nMemAvailable: 300 kB\n");
  fx.file("/proc/vmstat", "nr_free_pages 5\npswpin 150\npswpout 10\n");
  fx.file("/proc/diskstats", disk_line("vda", 150, 3048, 700, 100, 1024, 500, 1400, 3000) +
                                 disk_line("vda1", 150, 3048, 700, 100, 1024, 500, 1400, 3000) +
                                 disk_line("loop0", 0, 0, 0, 0, 0, 0, 0, 0) +
                                 disk_line("loop1", 10, 80, 5, 0, 0, 0, 5, 5));
  process(fx, kPid, 1, 40, 0, 1000, 1 << 20, 0);
  process(fx, 101, kPid, 0, 15, 500, 1 << 20, 0);
  process(fx, 102, 101, 10, 0, 100, 0, 512 << 10);  // forked during the interval
  process(fx, 200, 1, 5000, 0, 99999, 1 << 30, 1 << 30);
  task(fx, kPid, kPid, 'R');
  task(fx, kPid, 110, 'D');
  task(fx, kPid, 111, 'S');
  task(fx, 101, 101, 'S');
  task(fx, 102, 102, 'D');
}

TEST(SystemSampler, TwoReadingsGiveEveryRate) {
  DoctorFixture fx;
  first_reading(fx);
  SystemSampler sampler(SystemSamplerOptions{.pid = kPid, .root = fx.root()});
  EXPECT_FALSE(sampler.take(10.0).has_value()) << "the first reading only sets baselines";
  second_reading(fx);
  const std::optional<SystemSample> s = sampler.take(10.5);
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(s->t, 10.5);
  EXPECT_DOUBLE_EQ(s->cpu, 0.5);  // busy +50 (user 30, system 20) of +100
  // Tree ticks: 100 +30, 101 +10, 102 new with 10; 200 is not in the tree.
  const double ticks_per_s = double(sysconf(_SC_CLK_TCK));
  EXPECT_NEAR(s->proc_cpu, 50 / ticks_per_s / 0.5, 1e-9);
  EXPECT_EQ(s->rss, (1000 + 500 + 100) * uint64_t(sysconf(_SC_PAGESIZE)));
  EXPECT_EQ(s->mem_available, 300u * 1024);
  EXPECT_DOUBLE_EQ(s->swap_in, 100);  // +50 pages in 0.5 s
  EXPECT_DOUBLE_EQ(s->swap_out, 0);
  EXPECT_DOUBLE_EQ(s->read_bps, 2.0 * (1 << 20) / 0.5);
  EXPECT_DOUBLE_EQ(s->write_bps, 512.0 * 1024 / 0.5);
  ASSERT_EQ(s->disk.size(), 2u) << "vda1 is a partition, loop0 never did I/O";
  ASSERT_EQ(s->disk.count("vda"), 1u);
  ASSERT_EQ(s->disk.count("loop1"), 1u);
  const observe::DiskRates& vda = s->disk.at("vda");
  EXPECT_DOUBLE_EQ(vda.busy, 0.8);   // 400 ms of 500
  EXPECT_DOUBLE_EQ(vda.queue, 2.0);  // 1000 weighted ms / 500 ms
  ASSERT_TRUE(vda.await_ms.has_value());
  EXPECT_DOUBLE_EQ(*vda.await_ms, 4.0);  // (200 + 200) ms / 100 requests
  EXPECT_DOUBLE_EQ(vda.read_bps, 2048.0 * 512 / 0.5);
  EXPECT_DOUBLE_EQ(vda.write_bps, 1024.0 * 512 / 0.5);
  EXPECT_FALSE(s->disk.at("loop1").await_ms.has_value()) << "no request completed";
  EXPECT_EQ(s->threads.running, 1);
  EXPECT_EQ(s->threads.io, 2);
  EXPECT_EQ(s->threads.sleeping, 2);
  EXPECT_TRUE(s->has_children);
  EXPECT_FALSE(s->gpu_util.has_value()) << "NVML is never asked under a fixture root";
  EXPECT_FALSE(s->main.has_value()) << "main_thread was not asked for";
}

TEST(SystemSampler, JsonLineHoldsTheFieldsOfSystemJsonl) {
  DoctorFixture fx;
  first_reading(fx);
  SystemSampler sampler(SystemSamplerOptions{.pid = kPid, .root = fx.root()});
  (void)sampler.take(1.0);
  second_reading(fx);
  const nlohmann::json line = nlohmann::json::parse(observe::to_json(*sampler.take(1.5)));
  for (const char* key : {"t", "cpu", "proc_cpu", "rss", "mem_available", "swap_in", "swap_out",
                          "read_bps", "write_bps", "disk", "threads", "gpu_util", "gpu_mem"}) {
    EXPECT_TRUE(line.contains(key)) << key;
  }
  EXPECT_FALSE(line.contains("main"));
  EXPECT_TRUE(line["gpu_util"].is_null());
  EXPECT_TRUE(line["gpu_mem"].is_null());
  EXPECT_EQ(line["disk"]["vda"]["queue"], 2.0);
  EXPECT_TRUE(line["disk"]["loop1"]["await_ms"].is_null());
  EXPECT_EQ(line["threads"]["io"], 2);
}

// Between releasing its memory and becoming a zombie, an exiting process still shows a live
// main thread; that moment is the end of the job, not a share of its time.
TEST(SystemSampler, MainThreadIsClassifiedWhenAskedUntilTheProcessExits) {
  DoctorFixture fx;
  first_reading(fx);
  fx.file("/proc/100/task/100/syscall", "running\n");
  SystemSampler sampler(
      SystemSamplerOptions{.pid = kPid, .root = fx.root(), .main_thread = true});
  (void)sampler.take(1.0);
  second_reading(fx);
  const std::optional<SystemSample> s = sampler.take(1.5);
  ASSERT_TRUE(s && s->main.has_value());
  EXPECT_EQ(*s->main, "compute");
  fx.file("/proc/100/stat", stat_line(kPid, 'R', 1, 40, 0, /*rss_pages=*/0));
  const std::optional<SystemSample> exiting = sampler.take(2.0);
  ASSERT_TRUE(exiting.has_value());
  EXPECT_FALSE(exiting->main.has_value()) << "the process had released its memory";
  // Gone altogether, reaped between the read of its main thread and the read of the tree: no
  // sample of the job either (it once gave one with an RSS of 0, under load).
  std::filesystem::remove(fx.root() + "/proc/100/stat");
  const std::optional<SystemSample> gone = sampler.take(2.5);
  ASSERT_TRUE(gone.has_value());
  EXPECT_FALSE(gone->main.has_value()) << "the process was gone";
}

TEST(SystemSampler, MissingFilesGiveZerosNotACrash) {
  DoctorFixture fx;
  fx.dir("/proc");
  SystemSampler sampler(
      SystemSamplerOptions{.pid = kPid, .root = fx.root(), .main_thread = true});
  EXPECT_FALSE(sampler.take(1.0).has_value());
  const std::optional<SystemSample> s = sampler.take(2.0);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->cpu, 0);
  EXPECT_EQ(s->proc_cpu, 0);
  EXPECT_EQ(s->rss, 0u);
  EXPECT_EQ(s->mem_available, 0u);
  EXPECT_TRUE(s->disk.empty());
  EXPECT_EQ(s->threads.running + s->threads.io + s->threads.sleeping, 0);
  EXPECT_FALSE(s->main.has_value()) << "no main thread to classify";
  // A process that exits between readings: its counters vanish, nothing goes negative.
  first_reading(fx);
  SystemSampler gone(SystemSamplerOptions{.pid = kPid, .root = fx.root()});
  (void)gone.take(1.0);
  std::filesystem::remove_all(fx.root() + "/proc/101");
  const std::optional<SystemSample> after = gone.take(1.5);
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->proc_cpu, 0);
  EXPECT_FALSE(after->has_children);
}

TEST(SystemSampler, ThreadSamplesThisProcessLive) {
  SystemSampler sampler(SystemSamplerOptions{.interval = 0.01});
  ASSERT_TRUE(sampler.start().is_ok());
  EXPECT_TRUE(sampler.running());
  EXPECT_FALSE(sampler.start().is_ok()) << "a second start is refused";
  volatile uint64_t sink = 0;
  const double until = observe::monotonic_seconds() + 0.2;
  while (observe::monotonic_seconds() < until) sink = sink + 1;  // busy: proc_cpu > 0
  sampler.stop();
  EXPECT_FALSE(sampler.running());
  const std::vector<SystemSample> samples = sampler.samples();
  ASSERT_GE(samples.size(), 2u);
  double cpu_seconds = 0;
  for (size_t i = 1; i < samples.size(); ++i) {
    EXPECT_GT(samples[i].t, samples[i - 1].t);
    cpu_seconds += samples[i].proc_cpu * (samples[i].t - samples[i - 1].t);
  }
  EXPECT_GT(cpu_seconds, 0) << "this process was busy";
  EXPECT_GT(samples.back().rss, 0u);
  EXPECT_GT(samples.back().mem_available, 0u);
  EXPECT_GE(samples.back().threads.running + samples.back().threads.sleeping, 2)
      << "the test thread and the sampler's";
}

TEST(SystemSampler, StartRefusesAnIntervalThatIsNotPositive) {
  SystemSampler sampler(SystemSamplerOptions{.interval = 0});
  const Status status = sampler.start();
  EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(status.message().find("interval"), std::string::npos) << status.message();
}

SystemSample sample_at(double t, double cpu, uint64_t rss, const char* main) {
  SystemSample s;
  s.t = t;
  s.cpu = cpu;
  s.read_bps = cpu * 1000;
  s.rss = rss;
  s.main = main;
  return s;
}

TEST(CompactSamples, RatesAreAveragedOverTheIntervalAndPointReadingsAreTheLaterOnes) {
  // Intervals: (0, 1], (1, 4], (4, 5], (5, 6], and (6, 7] left alone at the end.
  std::vector<SystemSample> samples = {
      sample_at(1, 0.8, 100, "input"), sample_at(4, 0.4, 200, "compute"),
      sample_at(5, 1.0, 300, "input"), sample_at(6, 0.0, 400, "checkpoint"),
      sample_at(7, 0.5, 500, "compute")};
  samples[0].disk["vda"] = {.busy = 1.0, .queue = 4, .await_ms = 2.0};
  samples[1].disk["vda"] = {.busy = 0.0, .queue = 0};
  samples[1].gpu_util = 0.9;
  samples[3].disk["vdb"] = {.busy = 0.5, .read_bps = 100};
  observe::compact_samples(samples, 0);
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_DOUBLE_EQ(samples[0].t, 4);
  EXPECT_DOUBLE_EQ(samples[0].cpu, (0.8 * 1 + 0.4 * 3) / 4);
  EXPECT_DOUBLE_EQ(samples[0].read_bps, (800 * 1 + 400 * 3) / 4.0);
  EXPECT_EQ(samples[0].rss, 200u);
  EXPECT_EQ(samples[0].main, "compute");
  EXPECT_DOUBLE_EQ(samples[0].disk.at("vda").busy, 0.25);
  EXPECT_DOUBLE_EQ(samples[0].disk.at("vda").queue, 1.0);
  EXPECT_EQ(samples[0].disk.at("vda").await_ms, 2.0) << "the one interval that completed any";
  EXPECT_EQ(samples[0].gpu_util, 0.9);
  EXPECT_DOUBLE_EQ(samples[1].t, 6);
  EXPECT_DOUBLE_EQ(samples[1].cpu, 0.5);
  EXPECT_EQ(samples[1].main, "checkpoint");
  EXPECT_DOUBLE_EQ(samples[1].disk.at("vdb").busy, 0.25) << "idle in the first half";
  EXPECT_DOUBLE_EQ(samples[1].disk.at("vdb").read_bps, 50);
  EXPECT_DOUBLE_EQ(samples[2].t, 7);
  EXPECT_DOUBLE_EQ(samples[2].cpu, 0.5);
}

TEST(SystemSampler, AtMaxSamplesNeighboursMergeAndTheIntervalDoubles) {
  SystemSampler sampler(SystemSamplerOptions{.interval = 0.01, .max_samples = 8});
  ASSERT_TRUE(sampler.start().is_ok());
  const double started = observe::monotonic_seconds();
  while (sampler.current_interval() < 0.04 && observe::monotonic_seconds() < started + 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  sampler.stop();
  EXPECT_GE(sampler.current_interval(), 0.04) << "two compactions within 30 s";
  const std::vector<SystemSample> samples = sampler.samples();
  ASSERT_GE(samples.size(), 2u);
  EXPECT_LE(samples.size(), 8u);
  for (size_t i = 1; i < samples.size(); ++i) EXPECT_GT(samples[i].t, samples[i - 1].t);
  EXPECT_GT(samples.back().rss, 0u);
  EXPECT_EQ(SystemSampler(SystemSamplerOptions{.max_samples = 1}).start().code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zerowait
