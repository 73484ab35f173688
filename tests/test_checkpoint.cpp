// Checkpoints through the public C++ API, on real directories: round trips, the commit order,
// an injected error at every step of a save, incremental saves under retention, the mirror tier,
// ranks meeting through files, and kill -9 at random moments.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "testing/checkpoint_state.hpp"
#include "testing/testing.hpp"
#include "zerowait/checkpoint/checkpointer.hpp"

namespace zerowait {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

using State = testing::TrainingState;
using testing::open_or_die;
using testing::read_all;
using testing::save_and_wait;

TEST(Checkpoint, RoundTripsAcrossFilesBackendsAndCompression) {
  for (bool compressed : {false, true}) {
    for (bool direct : {false, true}) {
      TempDir dir;
      auto target = make_local_directory_target(dir.path());
      CheckpointOptions options;
      options.max_file_bytes = 1 << 20;  // several files
      options.compression = compressed ? Compression::kZstd : Compression::kNone;
      auto cp = open_or_die(target, options);
      // Empty, tiny, file-splitting and larger-than-one-read-piece (16 MiB) tensors.
      State state = State::make({0, 1, 3, 1000, 300000, 5 << 20});
      state.fill_all(7);
      SaveResult r = save_and_wait(*cp, state.request(3));
      EXPECT_TRUE(r.committed);
      EXPECT_EQ(r.bytes_total, (1 + 3 + 1000 + 300000 + (5 << 20)) * 4u);
      ASSERT_EQ(list_steps(*target).value(), std::vector<uint64_t>{3});
      EXPECT_EQ(read_all(*target, 3, 0, RestoreOptions{0, direct, true}), state.values)
          << "compressed=" << compressed << " direct=" << direct;
      auto report = verify_step(*target, 3);
      ASSERT_TRUE(report.is_ok());
      EXPECT_TRUE(report.value().problems.empty()) << report.value().problems[0];
      EXPECT_EQ(testing::read_file(dir / "latest"), "step-3\n");
    }
  }
}

TEST(Checkpoint, RefusesToOverwriteACommittedStep) {
  TempDir dir;
  auto target = make_local_directory_target(dir.path());
  auto cp = open_or_die(target);
  State state = State::make({10});
  save_and_wait(*cp, state.request(1));
  auto handle = cp->save(state.request(1));
  ASSERT_TRUE(handle.is_ok());
  auto result = handle.value()->wait();
  ASSERT_FALSE(result.is_ok());
  EXPECT_EQ(result.status().code(), ErrorCode::kAlreadyExists);
  EXPECT_NE(result.status().message().find("already committed"), std::string::npos);
}

TEST(Checkpoint, RejectsBadRequestsUpFront) {
  TempDir dir;
  auto cp = open_or_die(make_local_directory_target(dir.path()));
  State state = State::make({4, 4});
  SaveRequest dup = state.request(1);
  dup.tensors[1].name = dup.tensors[0].name;
  EXPECT_EQ(cp->save(dup).status().code(), ErrorCode::kInvalidArgument);
  SaveRequest bad_dtype = state.request(1);
  bad_dtype.tensors[0].dtype = "F33";
  auto r = cp->save(bad_dtype);
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("F33"), std::string::npos);
}

TEST(Checkpoint, APreparedSaveThatIsNeverStartedHoldsNothingUp) {
  TempDir dir;
  auto target = make_local_directory_target(dir.path());
  auto cp = open_or_die(target);
  State state = State::make({100, 200});
  {
    auto pending = cp->begin_save(state.request(1));
    ASSERT_TRUE(pending.is_ok());
    ASSERT_TRUE(pending.value().has_value());
    EXPECT_EQ(pending.value()->staging(2), nullptr);  // out of range
    EXPECT_TRUE(cp->wait_all().is_ok());              // does not wait for an unstarted save
    auto started = pending.value()->start();
    ASSERT_TRUE(started.is_ok());
    EXPECT_EQ(pending.value()->copy_host_tensors().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(pending.value()->staging(0), nullptr);
    EXPECT_EQ(pending.value()->start().status().code(), ErrorCode::kInvalidArgument);
    ASSERT_TRUE(started.value().wait().is_ok());
  }
  {
    auto dropped = cp->begin_save(state.request(2));  // dropped unstarted: releases the pool
    ASSERT_TRUE(dropped.is_ok());
  }
  save_and_wait(*cp, state.request(3));
  EXPECT_EQ(list_steps(*target).value(), (std::vector<uint64_t>{1, 3}));
}

// The position of the first operation equal to `op` (kind + " " + path) after `after`, or -1.
long position(const std::vector<StorageOperation>& ops, const std::string& op, long after = -1) {
  for (size_t i = static_cast<size_t>(after + 1); i < ops.size(); ++i) {
    if (ops[i].to_string() == op) return static_cast<long>(i);
  }
  return -1;
}

TEST(Checkpoint, CommitsInTheDurableOrder) {
  TempDir dir;
  auto faults = std::make_shared<FaultInjectingTarget>(make_local_directory_target(dir.path()));
  CheckpointOptions options;
  options.max_file_bytes = 4096;
  auto cp = open_or_die(faults, options);
  State state = State::make({2000, 2000});
  faults->clear_operations();
  save_and_wait(*cp, state.request(5));
  const auto ops = faults->operations();
  std::string trace;
  for (const auto& op : ops) trace += op.to_string() + "\n";

  const long file0 = position(ops, "fsync step-5.tmp/rank-00000-00000.safetensors");
  const long file1 = position(ops, "fsync step-5.tmp/rank-00000-00001.safetensors");
  const long rank_manifest = position(ops, "fsync step-5.tmp/rank-00000.json.tmp");
  const long manifest = position(ops, "fsync step-5.tmp/manifest.json");
  const long manifest_dir = position(ops, "fsync-dir step-5.tmp", manifest);
  const long rename = position(ops, "rename step-5.tmp -> step-5");
  const long root = position(ops, "fsync-dir ");
  const long latest = position(ops, "rename latest.tmp -> latest");
  for (long p : {file0, file1, rank_manifest, manifest, manifest_dir, rename, root, latest}) {
    ASSERT_GE(p, 0) << trace;
  }
  EXPECT_LT(std::max(file0, file1), rank_manifest) << trace;
  EXPECT_LT(rank_manifest, manifest) << trace;
  EXPECT_LT(manifest, manifest_dir) << trace;
  EXPECT_LT(manifest_dir, rename) << trace;
  EXPECT_LT(rename, root) << trace;
  EXPECT_LT(root, latest) << trace;
  EXPECT_EQ(ops.back().to_string(), "fsync-dir ") << trace;  // after the latest pointer's rename
}

// Fails one mutating operation of a save of step 2 (after step 1 committed), for every operation
// the save performs, with EIO and with ENOSPC: the save reports the error, step 1 stays the
// newest committed step and reads back intact, and a later save succeeds.
TEST(Checkpoint, AnInjectedErrorAtAnyStepLeavesThePreviousStepIntact) {
  State state = State::make({3000, 100, 2000});
  std::vector<StorageOperation> clean_ops;
  {
    TempDir dir;
    auto faults = std::make_shared<FaultInjectingTarget>(make_local_directory_target(dir.path()));
    CheckpointOptions options;
    options.max_file_bytes = 8192;
    auto cp = open_or_die(faults, options);
    save_and_wait(*cp, state.request(1));
    faults->clear_operations();
    save_and_wait(*cp, state.request(2));
    clean_ops = faults->operations();
  }
  std::vector<StorageOperation> faultable;
  for (const auto& op : clean_ops) {
    if (op.kind != "writeback") faultable.push_back(op);  // a hint: it has no error to report
  }
  ASSERT_GT(faultable.size(), 15u);
  size_t injected = 0;
  for (int err : {EIO, ENOSPC}) {
    for (size_t k = 0; k < faultable.size(); ++k) {
      TempDir dir;
      auto faults = std::make_shared<FaultInjectingTarget>(make_local_directory_target(dir.path()));
      CheckpointOptions options;
      options.max_file_bytes = 8192;
      auto cp = open_or_die(faults, options);
      State saved = state;
      saved.fill_all(1);
      save_and_wait(*cp, saved.request(1));
      size_t seen = 0;
      std::string failed_op;
      faults->set_fault_rule([&](const StorageOperation& op) {
        if (!failed_op.empty() || op.kind == "writeback" || seen++ != k) return 0;
        failed_op = op.to_string();
        return err;
      });
      SCOPED_TRACE("operation " + std::to_string(k) + " failing with " + std::strerror(err));
      State next = state;
      next.fill_all(2);
      auto handle = cp->save(next.request(2));
      ASSERT_TRUE(handle.is_ok());
      auto result = handle.value()->wait();
      ASSERT_FALSE(failed_op.empty());
      SCOPED_TRACE("failed: " + failed_op);
      ASSERT_FALSE(result.is_ok());
      EXPECT_EQ(result.status().code(), ErrorCode::kIo);
      EXPECT_NE(result.status().message().find(std::strerror(err)), std::string::npos)
          << result.status().message();
      faults->set_fault_rule(nullptr);
      EXPECT_EQ(list_steps(*faults).value(), std::vector<uint64_t>{1});
      EXPECT_EQ(read_all(*faults, 1), saved.values);
      EXPECT_TRUE(verify_step(*faults, 1).value().problems.empty());
      // The failed step's leftovers go at the next start, and step 2 can then be saved.
      cp.reset();
      cp = open_or_die(faults, options);
      EXPECT_FALSE(fs::exists(dir / "step-2.tmp"));
      save_and_wait(*cp, next.request(2));
      EXPECT_EQ(read_all(*faults, 2), next.values);
      ++injected;
    }
  }
  EXPECT_GT(injected, 30u);
}

TEST(Checkpoint, IncrementalSavesWriteOnlyChangesAndRetentionKeepsWhatIsReferenced) {
  TempDir dir;
  auto target = make_local_directory_target(dir.path());
  CheckpointOptions options;
  options.incremental = true;
  options.keep_last = 2;
  options.max_file_bytes = 64 << 10;
  auto cp = open_or_die(target, options);
  State state = State::make(std::vector<size_t>(10, 5000));
  state.fill_all(0);
  std::map<uint64_t, std::vector<std::vector<float>>> expected;
  SaveResult first = save_and_wait(*cp, state.request(1));
  EXPECT_EQ(first.tensors_written, 10u);
  expected[1] = state.values;
  for (uint64_t step = 2; step <= 8; ++step) {
    state.fill(step % 3, step);  // one tensor in ten changes: 0, 1 or 2
    SaveResult r = save_and_wait(*cp, state.request(step));
    expected[step] = state.values;
    EXPECT_EQ(r.tensors_written, 1u);
    EXPECT_EQ(r.tensors_referenced, 9u);
    EXPECT_LE(r.bytes_written, first.bytes_written * 15 / 100);
    auto steps = list_steps(*target).value();
    EXPECT_EQ(steps, (std::vector<uint64_t>{step - 1, step}));
    for (uint64_t kept : steps) {
      EXPECT_EQ(read_all(*target, kept), expected[kept]) << "step " << kept << " after " << step;
      EXPECT_TRUE(verify_step(*target, kept).value().problems.empty());
    }
  }
  // A retired step keeps only the files a committed step still references: step 1's (tensors 3
  // to 9 never changed) and step 5's (tensor 2, which step 7 uses) stay without their commit
  // record; steps 2 to 4 wrote tensors that changed again since, so nothing of them is left.
  for (const char* retired : {"step-1", "step-5", "step-6"}) {
    EXPECT_TRUE(fs::exists(dir / retired)) << retired;
    EXPECT_FALSE(fs::exists(dir / (std::string(retired) + "/manifest.json"))) << retired;
    EXPECT_FALSE(fs::exists(dir / (std::string(retired) + "/rank-00000.json"))) << retired;
  }
  EXPECT_FALSE(fs::exists(dir / "step-1/rank-00000-00000.safetensors"));  // tensors 0-2 only
  for (int gone = 2; gone <= 4; ++gone)
    EXPECT_FALSE(fs::exists(dir / ("step-" + std::to_string(gone))));
  auto info = read_step_info(*target, 8).value();
  EXPECT_EQ(info.references, (std::vector<uint64_t>{1, 6, 7}));
}

TEST(Checkpoint, MirrorGetsEveryCommittedStepVerified) {
  TempDir local_dir;
  TempDir mirror_dir;
  auto local = make_local_directory_target(local_dir.path());
  auto mirror = make_local_directory_target(mirror_dir.path());
  CheckpointOptions options;
  options.mirror = mirror;
  options.incremental = true;
  options.keep_last = 2;
  auto cp = open_or_die(local, options);
  State state = State::make({1000, 2000, 3000});
  for (uint64_t step = 1; step <= 4; ++step) {
    state.fill(step % 3, step);
    save_and_wait(*cp, state.request(step));
  }
  ASSERT_TRUE(cp->wait_all().is_ok());
  EXPECT_EQ(list_steps(*mirror).value(), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(read_all(*mirror, 4), state.values);
  EXPECT_TRUE(verify_step(*mirror, 3).value().problems.empty());
  EXPECT_TRUE(verify_step(*mirror, 4).value().problems.empty());
  EXPECT_EQ(testing::read_file(mirror_dir / "latest"), "step-4\n");
}

TEST(Checkpoint, AFailingMirrorIsReportedAndLeavesLocalStepsAlone) {
  TempDir local_dir;
  TempDir mirror_dir;
  auto local = make_local_directory_target(local_dir.path());
  auto mirror =
      std::make_shared<FaultInjectingTarget>(make_local_directory_target(mirror_dir.path()));
  CheckpointOptions options;
  options.mirror = mirror;
  auto cp = open_or_die(local, options);
  mirror->set_fault_rule(
      [](const StorageOperation& op) { return op.kind == "write" ? ENOSPC : 0; });
  State state = State::make({1000, 2000});
  save_and_wait(*cp, state.request(1));
  Status mirrored = cp->wait_all();
  EXPECT_EQ(mirrored.code(), ErrorCode::kIo);
  EXPECT_NE(mirrored.message().find("mirror"), std::string::npos) << mirrored.message();
  EXPECT_NE(mirrored.message().find(std::strerror(ENOSPC)), std::string::npos)
      << mirrored.message();
  EXPECT_TRUE(list_steps(*mirror).value().empty());
  // The local tier is untouched, and once the mirror has room again the next step reaches it.
  EXPECT_EQ(read_all(*local, 1), state.values);
  mirror->set_fault_rule(nullptr);
  save_and_wait(*cp, state.request(2));
  ASSERT_TRUE(cp->wait_all().is_ok());
  EXPECT_EQ(list_steps(*local).value(), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(list_steps(*mirror).value(), std::vector<uint64_t>{2});
  EXPECT_EQ(read_all(*mirror, 2), state.values);
}

TEST(Checkpoint, MirrorRefusesACorruptLocalCopy) {
  TempDir local_dir;
  TempDir mirror_dir;
  auto local = make_local_directory_target(local_dir.path());
  auto mirror = make_local_directory_target(mirror_dir.path());
  State state = State::make({1000});
  {
    auto cp = open_or_die(local);
    save_and_wait(*cp, state.request(1));
  }
  // Damage a tensor byte after the commit: a later mirror copy must not spread it.
  const std::string file = local_dir / "step-1/rank-00000-00000.safetensors";
  std::string bytes = testing::read_file(file);
  bytes[bytes.size() - 5] ^= 0x40;
  testing::write_file(file, bytes);
  auto verify = verify_step(*local, 1).value();
  ASSERT_EQ(verify.problems.size(), 1u);
  EXPECT_NE(verify.problems[0].find("/model/layer.0.weight"), std::string::npos)
      << verify.problems[0];
  EXPECT_NE(verify.problems[0].find("rank-00000-00000.safetensors"), std::string::npos);

  CheckpointOptions options;
  options.mirror = mirror;
  auto cp = open_or_die(local, options);
  save_and_wait(*cp, state.request(2));
  ASSERT_TRUE(cp->wait_all().is_ok());
  EXPECT_EQ(list_steps(*mirror).value(), std::vector<uint64_t>{2});
}

TEST(Checkpoint, ReadNamesTheDamagedTensorAndFile) {
  TempDir dir;
  auto target = make_local_directory_target(dir.path());
  State state = State::make({100, 5000});
  state.fill_all(3);
  auto cp = open_or_die(target);
  save_and_wait(*cp, state.request(1));
  const std::string file = dir / "step-1/rank-00000-00000.safetensors";
  std::string bytes = testing::read_file(file);
  bytes[bytes.size() - 100] ^= 0x01;
  testing::write_file(file, bytes);
  auto manifest = read_rank_manifest(*target, 1, 0).value();
  std::vector<float> out(5000);
  TensorRead read{1, reinterpret_cast<std::byte*>(out.data())};
  Status s = read_tensors(*target, manifest, std::span(&read, 1));
  ASSERT_EQ(s.code(), ErrorCode::kCorrupt);
  EXPECT_NE(s.message().find("/model/layer.1.weight"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(file), std::string::npos) << s.message();
  // Truncation is named as such.
  testing::write_file(file, bytes.substr(0, bytes.size() - 10));
  s = read_tensors(*target, manifest, std::span(&read, 1));
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
}

TEST(Checkpoint, RanksMeetThroughFilesAndEachReadsItsOwnPart) {
  TempDir dir;
  constexpr uint32_t kRanks = 3;
  std::vector<State> states;
  for (uint32_t r = 0; r < kRanks; ++r) {
    states.push_back(State::make({1000 + r, 50}));
    states.back().fill_all(r + 10);
  }
  std::vector<std::thread> ranks;
  std::vector<Status> statuses(kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      CheckpointOptions options;
      options.rank = r;
      options.world_size = kRanks;
      auto cp = Checkpointer::open(make_local_directory_target(dir.path()), options);
      if (!cp.is_ok()) {
        statuses[r] = cp.status();
        return;
      }
      for (uint64_t step = 1; step <= 2; ++step) {
        auto handle = cp.value()->save(states[r].request(step));
        statuses[r] = handle.is_ok() ? handle.value()->wait().status() : handle.status();
        if (!statuses[r].is_ok()) return;
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const Status& s : statuses) ASSERT_TRUE(s.is_ok()) << s.to_string();
  auto target = make_local_directory_target(dir.path());
  EXPECT_EQ(list_steps(*target).value(), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(read_step_info(*target, 2).value().world_size, kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) EXPECT_EQ(read_all(*target, 2, r), states[r].values);
}

TEST(Checkpoint, AStepIsNotCommittedWhenARankNeverFinishes) {
  TempDir dir;
  CheckpointOptions options;
  options.world_size = 2;
  options.commit_timeout_s = 0.3;
  auto target = make_local_directory_target(dir.path());
  auto cp = open_or_die(target, options);
  State state = State::make({100});
  auto handle = cp->save(state.request(1));
  ASSERT_TRUE(handle.is_ok());
  auto result = handle.value()->wait();  // rank 1 never saves
  ASSERT_FALSE(result.is_ok());
  EXPECT_EQ(result.status().code(), ErrorCode::kDeadlineExceeded);
  EXPECT_NE(result.status().message().find("1 of 2 ranks"), std::string::npos)
      << result.status().message();
  EXPECT_TRUE(list_steps(*target).value().empty());
  EXPECT_FALSE(fs::exists(dir / "step-1"));
}

// A child process saves step after step until it is killed with SIGKILL at a random moment; after
// each kill every committed step verifies and holds exactly what that step saved, and the newest
// one is at least as new as before. Alternates plain, incremental + retention, and compressed.
TEST(Checkpoint, KillNineAtRandomMomentsNeverLeavesATornStep) {
  TempDir dir;
  std::mt19937_64 rng(20261129);
  const std::vector<size_t> sizes = {50000, 20000, 120000, 7, 65536, 30000};
  const int kKills = 120;
  uint64_t newest = 0;
  int kills_with_progress = 0;
  for (int kill_index = 0; kill_index < kKills; ++kill_index) {
    const int mode = kill_index % 3;
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      CheckpointOptions options;
      options.max_file_bytes = 256 << 10;
      options.incremental = mode == 1;
      options.keep_last = 3;
      options.compression = mode == 2 ? Compression::kZstd : Compression::kNone;
      auto cp = Checkpointer::open(make_local_directory_target(dir.path()), options);
      if (!cp.is_ok()) _exit(3);
      auto steps = list_steps(cp.value()->target());
      uint64_t step = steps.is_ok() && !steps.value().empty() ? steps.value().back() + 1 : 1;
      State state = State::make(sizes);
      for (;; ++step) {
        for (size_t i = 0; i < sizes.size(); ++i) state.fill(i, i % 2 == 0 ? step : step / 4);
        auto handle = cp.value()->save(state.request(step));
        if (!handle.is_ok() || !handle.value()->wait().is_ok()) _exit(4);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 60000));
    ::kill(pid, SIGKILL);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus))
        << "the saving child exited by itself with status " << WEXITSTATUS(wstatus);

    auto target = make_local_directory_target(dir.path());
    auto steps = list_steps(*target);
    ASSERT_TRUE(steps.is_ok()) << steps.status().to_string();
    if (steps.value().empty()) continue;
    ASSERT_GE(steps.value().back(), newest);
    if (steps.value().back() > newest) ++kills_with_progress;
    newest = steps.value().back();
    for (uint64_t step : steps.value()) {
      auto report = verify_step(*target, step);
      ASSERT_TRUE(report.is_ok()) << report.status().to_string();
      ASSERT_TRUE(report.value().problems.empty())
          << "kill " << kill_index << ": step " << step << ": " << report.value().problems[0];
    }
    State expected = State::make(sizes);
    for (size_t i = 0; i < sizes.size(); ++i) expected.fill(i, i % 2 == 0 ? newest : newest / 4);
    ASSERT_EQ(read_all(*target, newest), expected.values) << "kill " << kill_index;
  }
  EXPECT_GT(kills_with_progress, kKills / 4);
}

}  // namespace
}  // namespace zerowait
