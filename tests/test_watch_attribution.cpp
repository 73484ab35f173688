// What `zerowait watch` concludes: the main thread's class from fixture task/stat, syscall and fd
// trees; the verdict at its thresholds; drop events explained by a planted disk-queue spike; the
// cost and comparison arithmetic against hand computation; the run directory on disk.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "host/system.hpp"
#include "observe/run/run_directory.hpp"
#include "observe/run/run_json.hpp"
#include "observe/thread_activity.hpp"
#include "testing/doctor_fixture.hpp"
#include "zerowait/observe/attribution.hpp"
#include "zerowait/observe/causes.hpp"
#include "zerowait/observe/cost.hpp"
#include "zerowait/observe/watch_run.hpp"

namespace zerowait {
namespace {

using observe::Activity;
using observe::SystemSample;
using testing::contains;
using testing::DoctorFixture;

constexpr pid_t kJobPid = 4242;

// The job's main thread in `state`, inside `syscall` ("running", or a name from the table with
// its first argument), with fds planted by the caller.
class MainThread {
 public:
  explicit MainThread(char state = 'S') { set_state(state); }
  void set_state(char state) {
    fx_.file(task_ + "/stat", std::to_string(kJobPid) + " (python3) " + state +
                                  " 1 1 1 0 -1 0 0 0 0 0 5 6 0 0 20 0 3 0 100 1000 50\n");
  }
  void in_syscall(const std::string& name, uint64_t first_arg = 0) {
    const std::optional<long> number = observe::syscall_number(name);
    ASSERT_TRUE(number.has_value()) << name;
    char text[200];
    std::snprintf(text, sizeof(text), "%ld 0x%llx 0x0 0x1000 0x0 0x0 0x0 0x7ffd0000 0x7f000000\n",
                  *number, static_cast<unsigned long long>(first_arg));
    fx_.file(task_ + "/syscall", text);
  }
  void syscall_text(const std::string& text) { fx_.file(task_ + "/syscall", text); }
  void thread_named(pid_t tid, const std::string& name) {
    fx_.file("/proc/" + std::to_string(kJobPid) + "/task/" + std::to_string(tid) + "/comm",
             name + "\n");
  }
  // /proc/PID/net/unix's rows, after its header line.
  void net_unix(const std::string& rows) {
    fx_.file("/proc/" + std::to_string(kJobPid) + "/net/unix",
             "Num       RefCount Protocol Flags    Type St Inode Path\n" + rows);
  }
  void fd(int number, const std::string& target) {
    fx_.link("/proc/" + std::to_string(kJobPid) + "/fd/" + std::to_string(number), target);
  }
  std::optional<observe::ThreadActivity> classify(bool has_children = false) const {
    return observe::classify_thread(host::System(fx_.root()), kJobPid, kJobPid, has_children);
  }
  // The class, "gone" when there is none.
  std::string activity(bool has_children = false) const {
    const auto a = classify(has_children);
    return a ? observe::activity_name(a->activity) : "gone";
  }

 private:
  DoctorFixture fx_;
  std::string task_ = "/proc/" + std::to_string(kJobPid) + "/task/" + std::to_string(kJobPid);
};

TEST(FdKind, LinkTargetsName) {
  EXPECT_EQ(observe::fd_kind_of_link("/data/train/x.jpg"), observe::FdKind::kRegularFile);
  EXPECT_EQ(observe::fd_kind_of_link("/ckpt/step-5/model.safetensors (deleted)"),
            observe::FdKind::kRegularFile);
  EXPECT_EQ(observe::fd_kind_of_link("pipe:[1234]"), observe::FdKind::kPipe);
  EXPECT_EQ(observe::fd_kind_of_link("socket:[99]"), observe::FdKind::kSocket);
  EXPECT_EQ(observe::fd_kind_of_link("/dev/nvidia0"), observe::FdKind::kNvidiaDevice);
  EXPECT_EQ(observe::fd_kind_of_link("/dev/nvidiactl"), observe::FdKind::kNvidiaDevice);
  EXPECT_EQ(observe::fd_kind_of_link("/dev/pts/0"), observe::FdKind::kOther);
  EXPECT_EQ(observe::fd_kind_of_link("anon_inode:[eventpoll]"), observe::FdKind::kOther);
}

TEST(ThreadActivity, InputIsReadingFilesOrWaitingOnWorkers) {
  MainThread t('D');
  t.fd(7, "/data/train/shard-0001.tar");
  t.in_syscall("pread64", 7);
  EXPECT_EQ(t.activity(), "input");
  t.in_syscall("read", 7);
  EXPECT_EQ(t.activity(), "input");
  t.in_syscall("openat", 0xffffff9c);  // AT_FDCWD: paths are not resolved, opening is input
  EXPECT_EQ(t.activity(), "input");
  t.in_syscall("newfstatat", 0xffffff9c);
  EXPECT_EQ(t.activity(), "input");
  t.syscall_text("-1 0x7ffd0000 0x7f000000\n");  // blocked outside a call, in D: a page fault
  EXPECT_EQ(t.activity(), "input");
  // A DataLoader's shape: workers (children) feed the main process through a pipe.
  MainThread loader('S');
  loader.fd(3, "pipe:[5501]");
  loader.fd(4, "socket:[77]");
  loader.in_syscall("read", 3);
  EXPECT_EQ(loader.activity(/*has_children=*/true), "input");
  loader.in_syscall("poll", 0x7ffd1000);
  EXPECT_EQ(loader.activity(true), "input");
  loader.in_syscall("futex", 0x7f001000);
  EXPECT_EQ(loader.activity(true), "input");
  // Its workers pass each batch's shared memory over a unix socket: input too, as long as the
  // socket is in the process's /proc/PID/net/unix table (a TCP one is communication below).
  loader.net_unix("0000000000000000: 00000003 00000000 00000000 0001 03    77\n");
  loader.in_syscall("recvmsg", 4);
  EXPECT_EQ(loader.activity(true), "input");
  EXPECT_EQ(loader.activity(false), "communication");  // no children: no workers behind it
  loader.fd(6, "socket:[78]");
  loader.in_syscall("recvmsg", 6);
  EXPECT_EQ(loader.activity(true), "communication");
  // zerowait's Loader: C++ threads, no children; next() waits on a futex for a batch.
  MainThread zw('S');
  zw.in_syscall("futex", 0x7f001000);
  EXPECT_EQ(zw.activity(), "other");  // a lock wait of some other kind
  zw.thread_named(4250, "zw-loader-0");
  EXPECT_EQ(zw.activity(), "input");
}

TEST(ThreadActivity, CheckpointIsWritingFiles) {
  MainThread t('D');
  t.fd(9, "/ckpt/step-100.tmp/model.safetensors");
  for (const char* call : {"write", "pwrite64", "fsync", "fdatasync", "ftruncate"}) {
    t.in_syscall(call, 9);
    EXPECT_EQ(t.activity(), "checkpoint") << call;
  }
  t.in_syscall("renameat2", 0xffffff9c);
  EXPECT_EQ(t.activity(), "checkpoint");
}

TEST(ThreadActivity, CommunicationIsSockets) {
  MainThread t('S');
  t.fd(5, "socket:[31337]");
  t.in_syscall("recvfrom", 5);
  EXPECT_EQ(t.activity(), "communication");
  t.in_syscall("read", 5);
  EXPECT_EQ(t.activity(), "communication");
  t.in_syscall("poll", 0x7ffd1000);  // no children: the sockets are what it waits on
  EXPECT_EQ(t.activity(), "communication");
  t.in_syscall("futex", 0x7f001000);  // a lock wait says nothing about sockets
  EXPECT_EQ(t.activity(), "other");
}

TEST(ThreadActivity, ComputeIsUserSpaceSleepOrTheGpuDriver) {
  MainThread t('R');
  t.syscall_text("running\n");
  EXPECT_EQ(t.activity(), "compute");
  t.set_state('S');
  t.in_syscall("clock_nanosleep", 1);
  EXPECT_EQ(t.activity(), "compute");
  t.fd(11, "/dev/nvidia0");
  t.in_syscall("ioctl", 11);
  EXPECT_EQ(t.activity(), "compute");
}

TEST(ThreadActivity, TheRestIsOther) {
  MainThread t('S');
  t.fd(1, "/dev/pts/0");
  t.in_syscall("write", 1);  // printing a log line
  EXPECT_EQ(t.activity(), "other");
  t.fd(3, "pipe:[8]");
  t.in_syscall("read", 3);  // a pipe but no children: not a loader's workers
  EXPECT_EQ(t.activity(), "other");
  t.in_syscall("futex", 0x7f000000);
  EXPECT_EQ(t.activity(), "other");
  t.syscall_text("9999 0x0 0x0 0x0 0x0 0x0 0x0 0x7ffd0000 0x7f000000\n");
  EXPECT_EQ(t.activity(), "other");
  t.syscall_text("-1 0x7ffd0000 0x7f000000\n");  // blocked outside a call but not in D
  EXPECT_EQ(t.activity(), "other");
}

TEST(ThreadActivity, GoneZombieOrUnreadable) {
  MainThread t('Z');
  t.syscall_text("running\n");
  EXPECT_EQ(t.activity(), "gone") << "a zombie is not the job any more";
  DoctorFixture empty;
  empty.dir("/proc");
  EXPECT_FALSE(observe::classify_thread(host::System(empty.root()), kJobPid, kJobPid, false));
  // No syscall file (no ptrace rights): the state alone says running or not.
  MainThread r('R');
  EXPECT_EQ(r.activity(), "compute");
  MainThread s('S');
  EXPECT_EQ(s.activity(), "other");
}

TEST(Verdict, Thresholds) {
  EXPECT_EQ(observe::verdict_of({{"input", 0.25}, {"compute", 0.75}}), "input-bound");
  EXPECT_EQ(observe::verdict_of({{"input", 0.24}, {"compute", 0.6}, {"other", 0.16}}),
            "compute-bound");
  EXPECT_EQ(observe::verdict_of({{"input", 0.24}, {"compute", 0.59}, {"other", 0.17}}),
            "unknown");
  EXPECT_EQ(observe::verdict_of({{"input", 0.3}, {"checkpoint", 0.4}, {"compute", 0.3}}),
            "checkpoint-bound")
      << "the largest wait names it";
  EXPECT_EQ(observe::verdict_of({{"communication", 0.5}, {"compute", 0.5}}),
            "communication-bound");
  EXPECT_EQ(observe::verdict_of({{"other", 0.9}, {"compute", 0.1}}), "unknown");
}

// Ten seconds at 10 samples/s, the main thread computing, except the window from 6 s.
std::vector<SystemSample> run_with_a_stall() {
  std::vector<SystemSample> samples;
  for (int i = 0; i < 100; ++i) {
    SystemSample s;
    s.t = 1000.0 + i * 0.1;
    s.main = i >= 60 && i < 70 ? "input" : "compute";
    s.disk["vda"].queue = 0.5;
    s.write_bps = 1 << 20;
    samples.push_back(s);
  }
  // Just before the stall: the disk queue spikes and two threads block on I/O.
  samples[52].disk["vda"].queue = 131;
  samples[52].threads.io = 2;
  samples[55].threads.io = 3;
  samples[55].disk["nvme0n1"].queue = 7;
  return samples;
}

TEST(Drops, AStallAfterADiskQueueSpikeIsAnEventThatNamesIt) {
  const std::vector<SystemSample> samples = run_with_a_stall();
  const std::vector<observe::DropEvent> events = observe::find_drops(samples);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NEAR(events[0].t, 1006.0, 1e-9);
  EXPECT_EQ(events[0].what, "compute share fell from 1.00 to 0.00");
  EXPECT_TRUE(contains(events[0].before, "disk queue 131.0 on vda"));
  EXPECT_TRUE(contains(events[0].before, "3 threads blocked on I/O"));
  EXPECT_FALSE(contains(events[0].before, "swap"));
  EXPECT_FALSE(contains(events[0].before, "write burst"));
}

TEST(Drops, SwapInAndAWriteBurstAreNamed) {
  std::vector<SystemSample> samples = run_with_a_stall();
  samples[58].swap_in = 1200;
  samples[59].write_bps = 200.0 * (1 << 20);  // 200x the median and above 16 MiB/s
  const std::vector<observe::DropEvent> events = observe::find_drops(samples);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(contains(events[0].before, "swap-in 1200 pages/s"));
  EXPECT_TRUE(contains(events[0].before, "write burst 200.0 MiB/s"));
}

TEST(Drops, NoEventWhenTheMedianIsLowOrNothingDrops) {
  std::vector<SystemSample> samples = run_with_a_stall();
  for (SystemSample& s : samples) s.main = "input";  // median 0 < 0.2: no baseline to fall from
  EXPECT_TRUE(observe::find_drops(samples).empty());
  for (SystemSample& s : samples) s.main = "compute";
  EXPECT_TRUE(observe::find_drops(samples).empty());
}

TEST(Drops, GpuUtilisationIsTheMeasureWhenPresent) {
  std::vector<SystemSample> samples = run_with_a_stall();
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].main = "compute";  // the main thread looks busy throughout...
    samples[i].gpu_util = i >= 30 && i < 40 ? 0.1 : 0.9;  // ...but the GPU idled from 3 s
  }
  const std::vector<observe::DropEvent> events = observe::find_drops(samples);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_NEAR(events[0].t, 1003.0, 1e-9);
  EXPECT_EQ(events[0].what, "GPU utilisation fell from 0.90 to 0.10");
  EXPECT_EQ(events[0].before, "no disk queue, swap-in, blocked threads or write burst");
}

TEST(Attribution, SharesSecondsAndVerdictFromSamples) {
  std::vector<SystemSample> samples = run_with_a_stall();
  samples.push_back(SystemSample{.t = 1010.0});  // after the job: no main, not counted
  const observe::Attribution a = observe::attribute(samples, 20.0);
  EXPECT_EQ(a.classified, 100u);
  EXPECT_NEAR(a.shares.at("compute"), 0.9, 1e-9);
  EXPECT_NEAR(a.shares.at("input"), 0.1, 1e-9);
  EXPECT_DOUBLE_EQ(a.shares.at("checkpoint"), 0.0);
  EXPECT_NEAR(a.seconds.at("compute"), 18.0, 1e-6);
  EXPECT_NEAR(a.seconds.at("input"), 2.0, 1e-6);
  EXPECT_EQ(a.verdict, "compute-bound");
  EXPECT_EQ(a.events.size(), 1u);
  EXPECT_EQ(observe::attribute({}, 0).verdict, "unknown");
}

TEST(Attribution, EachSampleWeighsTheTimeUntilTheNext) {
  // Half the time computing, half waiting for input, but the compute samples came half as
  // often (a running main thread takes longer to read): counted, compute would be a third.
  std::vector<SystemSample> samples;
  double t = 1000.0;
  for (int step = 0; step < 10; ++step) {
    samples.push_back(SystemSample{.t = t, .main = "compute"});
    t += 0.04;
    for (int i = 0; i < 2; ++i, t += 0.02) samples.push_back(SystemSample{.t = t, .main = "input"});
  }
  samples.push_back(SystemSample{.t = t});  // the end of the last input wait
  const observe::Attribution a = observe::attribute(samples, 0.8);
  EXPECT_EQ(a.classified, 30u);
  EXPECT_NEAR(a.shares.at("compute"), 0.5, 1e-9);
  EXPECT_NEAR(a.shares.at("input"), 0.5, 1e-9);
  // Samples all taken at one time say nothing about time: each counts once.
  const observe::Attribution flat = observe::attribute(
      {SystemSample{.t = 5, .main = "input"}, SystemSample{.t = 5, .main = "compute"},
       SystemSample{.t = 5, .main = "compute"}, SystemSample{.t = 5, .main = "compute"}},
      1.0);
  EXPECT_DOUBLE_EQ(flat.shares.at("input"), 0.25);
}

TEST(Cost, EveryCausePricedAndWaitsSummed) {
  const observe::WaitCost cost = observe::wait_cost(
                                     {{"input", 0.2}, {"checkpoint", 0.05}, {"compute", 0.75}},
                                     8, 2.0)
                                     .value();
  // share x 8 GPUs x $2/h x 24 h
  EXPECT_DOUBLE_EQ(cost.per_day.at("input"), 0.2 * 8 * 2 * 24);         // 76.80
  EXPECT_DOUBLE_EQ(cost.per_day.at("checkpoint"), 0.05 * 8 * 2 * 24);    // 19.20
  EXPECT_DOUBLE_EQ(cost.per_day.at("compute"), 0.75 * 8 * 2 * 24);       // 288.00
  EXPECT_DOUBLE_EQ(cost.per_year.at("input"), 0.2 * 8 * 2 * 24 * 365);   // 28032
  EXPECT_NEAR(cost.wait_per_day, 96.0, 1e-9);                            // compute excluded
  EXPECT_NEAR(cost.wait_per_year, 96.0 * 365, 1e-6);
}

TEST(Cost, BadArgumentsNameTheField) {
  const auto message = [](const Result<observe::WaitCost>& r) {
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    return r.status().message();
  };
  EXPECT_TRUE(contains(message(observe::wait_cost({{"input", 1.5}}, 8, 2)), "shares['input']"));
  EXPECT_TRUE(contains(message(observe::wait_cost({{"input", -0.1}}, 8, 2)), "[0, 1]"));
  EXPECT_TRUE(contains(message(observe::wait_cost({}, 0, 2)), "gpus = 0"));
  EXPECT_TRUE(contains(message(observe::wait_cost({}, 8, -1)), "gpu_hourly_cost = -1"));
}

TEST(Comparison, ThroughputFirstThenComputeShare) {
  // 100 -> 125 samples/s: the same work takes 1 - 100/125 = 20 % less GPU time.
  const observe::Comparison by_throughput =
      observe::compare_runs({100.0, 0.5}, {125.0, 0.9}, "runs/before", 8, 2.0).value();
  EXPECT_EQ(by_throughput.basis, "throughput");
  EXPECT_EQ(by_throughput.before, "runs/before");
  EXPECT_NEAR(by_throughput.saving_share, 0.2, 1e-12);
  EXPECT_NEAR(*by_throughput.saving_per_day, 0.2 * 8 * 2 * 24, 1e-9);  // 76.80
  EXPECT_NEAR(*by_throughput.saving_per_year, 0.2 * 8 * 2 * 24 * 365, 1e-6);
  // Compute 0.4 -> 0.8: GPU time for the same work halves.
  const observe::Comparison by_share =
      observe::compare_runs({std::nullopt, 0.4}, {125.0, 0.8}, "b", 0, 0).value();
  EXPECT_EQ(by_share.basis, "compute share");
  EXPECT_NEAR(by_share.saving_share, 0.5, 1e-12);
  EXPECT_FALSE(by_share.saving_per_day.has_value()) << "no GPUs given: no money";
  // A regression stays negative.
  const observe::Comparison worse =
      observe::compare_runs({std::nullopt, 0.8}, {std::nullopt, 0.5}, "b", 1, 1).value();
  EXPECT_NEAR(worse.saving_share, 1 - 0.8 / 0.5, 1e-12);
  EXPECT_LT(*worse.saving_per_day, 0);
  // A before run that never computed: all of its GPU time was waiting.
  EXPECT_DOUBLE_EQ(
      observe::compare_runs({std::nullopt, 0.0}, {std::nullopt, 0.7}, "b", 0, 0)->saving_share,
      1.0);
  EXPECT_FALSE(observe::compare_runs({std::nullopt, 0.7}, {std::nullopt, 0.0}, "b", 0, 0).is_ok())
      << "an after run that never computed gives no ratio";
  const Result<observe::Comparison> neither =
      observe::compare_runs({100.0, std::nullopt}, {std::nullopt, 0.5}, "b", 1, 1);
  EXPECT_EQ(neither.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(neither.status().message(), "shares.compute"));
}

TEST(WatchRun, WrittenAndReadBack) {
  testing::TempDir dir;
  observe::WatchRun run;
  run.title = "python train.py";
  run.command = {"zerowait", "watch", "--", "python", "train.py"};
  run.started_unix = 1796284800.0;
  run.duration_s = 10;
  run.samples = run_with_a_stall();
  run.attribution = observe::attribute(run.samples, run.duration_s);
  run.cost = observe::wait_cost(run.attribution.shares, 8, 2.0).value();
  ASSERT_TRUE(observe::write_watch_run(dir / "run", run).is_ok());
  const nlohmann::json doc = nlohmann::json::parse(testing::read_file(dir / "run/run.json"));
  EXPECT_EQ(doc["schema"], "zerowait.run/1");
  EXPECT_EQ(doc["kind"], "watch");
  EXPECT_EQ(doc["verdict"], "compute-bound");
  EXPECT_EQ(doc["causes"].size(), 5u);
  EXPECT_EQ(doc["shares"]["compute"], 0.9);
  EXPECT_EQ(doc["cost"]["wait_per_day"], 38.4);  // input 0.1 x 8 x 2 x 24
  EXPECT_TRUE(doc["comparison"].is_null());
  ASSERT_EQ(doc["events"].size(), 1u);
  EXPECT_EQ(doc["events"][0]["t"], 1006.0);
  const std::string lines = testing::read_file(dir / "run/system.jsonl");
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 100);
  EXPECT_EQ(nlohmann::json::parse(lines.substr(0, lines.find('\n')))["main"], "compute");

  const observe::RunFigures figures = observe::read_run_figures(dir / "run").value();
  EXPECT_DOUBLE_EQ(*figures.compute_share, 0.9);
  EXPECT_FALSE(figures.samples_per_s.has_value());
  const Result<observe::RunFigures> missing = observe::read_run_figures(dir / "nowhere");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(contains(missing.status().message(), "no run.json in"));
  testing::write_file(dir / "bad/run.json", "{\"shares\": {\"compute\": \"lots\"}}");
  const Result<observe::RunFigures> bad = observe::read_run_figures(dir / "bad");
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(bad.status().message(), "shares.compute"));
}

// The one summary of every producer: causes in run.json's order, shares of the wall time, the
// verdict from unrounded shares.
TEST(CauseSummary, OrdersRoundsAndJudges) {
  const nlohmann::ordered_json summary =
      observe::cause_summary({{"other", 1.0}, {"compute", 2.0}, {"input", 7.0 / 3.0}}, 10.0, 4)
          .value();
  EXPECT_EQ(summary["causes"], nlohmann::ordered_json({"input", "compute", "other"}));
  EXPECT_EQ(summary["seconds"]["input"], 2.3333);
  EXPECT_EQ(summary["shares"]["input"], 0.2333);
  EXPECT_EQ(summary["shares"]["compute"], 0.2);
  EXPECT_EQ(summary["verdict"], "unknown");  // no wait reaches 0.25, compute below 0.6
  EXPECT_EQ(observe::cause_summary({{"input", 2.5}}, 10.0).value()["verdict"], "input-bound");
  const nlohmann::ordered_json empty = observe::cause_summary({{"input", 0.0}}, 0.0).value();
  EXPECT_EQ(empty["shares"]["input"], 0.0);
  EXPECT_EQ(empty["verdict"], "unknown");
  const Result<nlohmann::ordered_json> unknown = observe::cause_summary({{"disk", 1.0}}, 1.0);
  EXPECT_EQ(unknown.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(unknown.status().message(), "'disk'"));
}

// The one writer of run directories: the JSON Lines files, then run.json; a run.json that breaks
// the schema is refused before anything is written.
TEST(RunDirectory, WritesTheFilesThenRunJson) {
  testing::TempDir dir;
  nlohmann::ordered_json run = {{"schema", "zerowait.run/1"},
                                {"kind", "emulate"},
                                {"causes", {"input", "compute", "other"}},
                                {"shares", {{"input", 0.5}, {"compute", 0.5}, {"other", 0.0}}}};
  const std::vector<observe::RunFile> files = {
      {"steps.jsonl", observe::json_lines({{{"step", 0}}, {{"step", 1}}})},
      {"steps/image-8.jsonl", observe::json_lines({{{"step", 0}}})}};
  ASSERT_TRUE(observe::write_run_directory(dir / "run", run, files).is_ok());
  EXPECT_EQ(testing::read_file(dir / "run/steps.jsonl"), "{\"step\":0}\n{\"step\":1}\n");
  EXPECT_EQ(testing::read_file(dir / "run/steps/image-8.jsonl"), "{\"step\":0}\n");
  EXPECT_EQ(nlohmann::ordered_json::parse(testing::read_file(dir / "run/run.json")), run);
}

TEST(RunDirectory, RefusesAnotherSchemaKindOrCauseBeforeWriting) {
  testing::TempDir dir;
  const nlohmann::ordered_json good = {
      {"schema", "zerowait.run/1"}, {"kind", "profile"}, {"causes", observe::kCauses}};
  ASSERT_TRUE(observe::check_run(good).is_ok());
  struct Case {
    const char* field;
    nlohmann::ordered_json value;
    const char* named;
  };
  const std::vector<Case> cases = {
      {"schema", "zerowait.run/2", "schema"},
      {"kind", "train", "kind"},
      {"causes", {"input", "disk"}, "\"disk\""},
      {"causes", {"compute", "input"}, "order"},
      {"causes", {"input", "input"}, "order"},
  };
  for (const Case& c : cases) {
    nlohmann::ordered_json run = good;
    run[c.field] = c.value;
    const Status status = observe::write_run_directory(dir / "run", run, {{"steps.jsonl", ""}});
    EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument) << run.dump();
    EXPECT_TRUE(contains(status.message(), c.named)) << status.message();
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "run"));
  const Status climbing =
      observe::write_run_directory(dir / "run", good, {{"../steps.jsonl", ""}});
  EXPECT_EQ(climbing.code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(dir / "steps.jsonl"));
}

}  // namespace
}  // namespace zerowait
