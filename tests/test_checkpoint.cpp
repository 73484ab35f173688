// Checkpoints through the public C++ API, on real directories: round trips, the commit order,
// an injected error at every step of a save, incremental saves under retention, the mirror tier,
// ranks meeting through files, and kill -9 at random moments.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "checkpoint/checkpoint_io.hpp"
#include "testing/checkpoint_state.hpp"
#include "testing/testing.hpp"
#include "zerowait/checkpoint/checkpointer.hpp"
#include "zerowait/checkpoint/maintenance.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/checkpoint/restore.hpp"
#include "zerowait/storage/fault_store.hpp"
#include "zerowait/storage/open.hpp"

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
      auto target = make_local_store(dir.path());
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
  auto target = make_local_store(dir.path());
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
  auto cp = open_or_die(make_local_store(dir.path()));
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
  auto target = make_local_store(dir.path());
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
long position(const std::vector<StoreOperation>& ops, const std::string& op, long after = -1) {
  for (size_t i = static_cast<size_t>(after + 1); i < ops.size(); ++i) {
    if (ops[i].to_string() == op) return static_cast<long>(i);
  }
  return -1;
}

TEST(Checkpoint, CommitsInTheDurableOrder) {
  TempDir dir;
  auto faults = std::make_shared<FaultStore>(make_local_store(dir.path()));
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
  const long rename = position(ops, "publish step-5.tmp -> step-5");
  const long root = position(ops, "fsync-dir ");
  const long latest = position(ops, "publish latest.tmp -> latest");
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
  std::vector<StoreOperation> clean_ops;
  {
    TempDir dir;
    auto faults = std::make_shared<FaultStore>(make_local_store(dir.path()));
    CheckpointOptions options;
    options.max_file_bytes = 8192;
    auto cp = open_or_die(faults, options);
    save_and_wait(*cp, state.request(1));
    faults->clear_operations();
    save_and_wait(*cp, state.request(2));
    clean_ops = faults->operations();
  }
  std::vector<StoreOperation> faultable;
  for (const auto& op : clean_ops) {
    if (op.kind != "writeback") faultable.push_back(op);  // a hint: it has no error to report
  }
  ASSERT_GT(faultable.size(), 15u);
  size_t injected = 0;
  for (int err : {EIO, ENOSPC}) {
    for (size_t k = 0; k < faultable.size(); ++k) {
      TempDir dir;
      auto faults = std::make_shared<FaultStore>(make_local_store(dir.path()));
      CheckpointOptions options;
      options.max_file_bytes = 8192;
      auto cp = open_or_die(faults, options);
      State saved = state;
      saved.fill_all(1);
      save_and_wait(*cp, saved.request(1));
      size_t seen = 0;
      std::string failed_op;
      faults->set_fault_rule([&](const StoreOperation& op) {
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
  auto target = make_local_store(dir.path());
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

// A URL is not a local folder: "s3://bucket/ck" once became a folder "s3:" under the working
// directory. Refused by a local directory target before anything is created, for the directory
// and for the mirror (open_store gives s3:// URLs a target of their own).
TEST(Checkpoint, RefusesAUrlAsDirectoryOrMirror) {
  TempDir cwd;
  const fs::path previous = fs::current_path();
  fs::current_path(cwd.path());
  for (const std::string url : {"s3://bucket/ck", "https://host/ck", "file:///tmp/ck"}) {
    auto opened = Checkpointer::open(make_local_store(url), {});
    ASSERT_FALSE(opened.is_ok()) << url;
    EXPECT_EQ(opened.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(opened.status().message().find(url), std::string::npos) << opened.status().message();
    EXPECT_NE(opened.status().message().find("remote storage is not supported yet"),
              std::string::npos)
        << opened.status().message();

    CheckpointOptions options;
    options.mirror = make_local_store(url);
    opened = Checkpointer::open(make_local_store(cwd / "ck"), options);
    ASSERT_FALSE(opened.is_ok()) << url;
    EXPECT_EQ(opened.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(opened.status().message().find("mirror"), std::string::npos)
        << opened.status().message();
  }
  std::vector<std::string> created;
  for (const auto& entry : fs::directory_iterator(cwd.path())) {
    created.push_back(entry.path().filename().string());
  }
  fs::current_path(previous);
  EXPECT_TRUE(created.empty()) << created[0];
}

TEST(Checkpoint, MirrorGetsEveryCommittedStepVerified) {
  TempDir local_dir;
  TempDir mirror_dir;
  auto local = make_local_store(local_dir.path());
  auto mirror = make_local_store(mirror_dir.path());
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
  const Status mirrored = cp->wait_all();
  ASSERT_TRUE(mirrored.is_ok()) << mirrored.to_string();
  EXPECT_EQ(list_steps(*mirror).value(), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(read_all(*mirror, 4), state.values);
  EXPECT_TRUE(verify_step(*mirror, 3).value().problems.empty());
  EXPECT_TRUE(verify_step(*mirror, 4).value().problems.empty());
  EXPECT_EQ(testing::read_file(mirror_dir / "latest"), "step-4\n");
}

TEST(Checkpoint, ALaggingMirrorGetsEveryStepBeforeRetentionRetiresItLocally) {
  TempDir local_dir;
  TempDir mirror_dir;
  auto local = make_local_store(local_dir.path());
  auto mirror = std::make_shared<FaultStore>(make_local_store(mirror_dir.path()));
  std::atomic<bool> mirror_may_go{false};
  // The mirror's copy of a step waits until four steps are committed locally.
  mirror->set_fault_rule([&](const StoreOperation& op) {
    while (op.path.starts_with("step-") && !mirror_may_go) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return 0;
  });
  CheckpointOptions options;
  options.mirror = mirror;
  options.keep_last = 1;
  auto cp = open_or_die(local, options);
  struct Release {  // lets the mirror go on every way out, before the Checkpointer joins it
    std::atomic<bool>& gate;
    ~Release() { gate = true; }
  } release{mirror_may_go};
  State state = State::make({1000, 2000});
  for (uint64_t step = 1; step <= 4; ++step) {
    state.fill(step % 2, step);
    save_and_wait(*cp, state.request(step));
  }
  // keep_last=1, yet every step is still here: none is copied yet.
  EXPECT_EQ(list_steps(*local).value(), (std::vector<uint64_t>{1, 2, 3, 4}));
  mirror_may_go = true;
  const Status mirrored = cp->wait_all();
  ASSERT_TRUE(mirrored.is_ok()) << mirrored.to_string();
  EXPECT_EQ(list_steps(*local).value(), (std::vector<uint64_t>{4}));
  EXPECT_EQ(list_steps(*mirror).value(), (std::vector<uint64_t>{4}));
  EXPECT_EQ(read_all(*mirror, 4), state.values);
  std::vector<std::string> commits_copied;
  for (const StoreOperation& op : mirror->operations()) {
    if (op.kind == "publish" && op.path.starts_with("step-")) {
      commits_copied.push_back(op.path);
    }
  }
  // Each step reached the mirror before it was retired.
  EXPECT_EQ(commits_copied,
            (std::vector<std::string>{"step-1.tmp -> step-1", "step-2.tmp -> step-2",
                                      "step-3.tmp -> step-3", "step-4.tmp -> step-4"}));
}

TEST(Checkpoint, AFailingMirrorIsReportedAndLeavesLocalStepsAlone) {
  TempDir local_dir;
  TempDir mirror_dir;
  auto local = make_local_store(local_dir.path());
  auto mirror = std::make_shared<FaultStore>(make_local_store(mirror_dir.path()));
  CheckpointOptions options;
  options.mirror = mirror;
  auto cp = open_or_die(local, options);
  mirror->set_fault_rule([](const StoreOperation& op) { return op.kind == "write" ? ENOSPC : 0; });
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

// A save whose tensor file stops being written, synced or closed (a hung mount, in the primary
// store or the mirror) fails at its write deadline with an error naming the file and commits
// nothing: step 1 is still the newest, and what a restore loads.
TEST(Checkpoint, ASaveWhoseWriteStallsFailsNamingTheFileAndCommitsNothing) {
  using namespace std::chrono_literals;
  TempDir dir;
  TempDir mirror_dir;
  auto faults = std::make_shared<FaultStore>(make_local_store(dir.path()));
  auto mirror = std::make_shared<FaultStore>(make_local_store(mirror_dir.path()));
  CheckpointOptions options;
  options.write_timeout = 300ms;
  options.mirror = mirror;
  State first = State::make({1000, 2000});
  first.fill_all(1);
  {
    auto cp = open_or_die(faults, options);
    save_and_wait(*cp, first.request(1));
    ASSERT_TRUE(cp->wait_all().is_ok());
  }
  // The tensor files only: manifests and commit records are small files with the metadata
  // deadline.
  const auto stall_tensor_files = [](FaultStore& store, const std::string& kind) {
    store.set_rule([kind](const StoreOperation& op) {
      const bool tensor_file = op.path.find("step-2") != std::string::npos &&
                               op.path.find(".json") == std::string::npos;
      return Fault{op.kind == kind && tensor_file ? Fault::Kind::kStall : Fault::Kind::kNone};
    });
  };
  for (const char* kind : {"write", "fsync", "close"}) {
    SCOPED_TRACE(kind);
    State next = first;
    next.fill_all(2);
    auto cp = open_or_die(faults, options);
    stall_tensor_files(*faults, kind);
    auto handle = cp->save(next.request(2));
    ASSERT_TRUE(handle.is_ok()) << handle.status().to_string();
    const auto result = handle.value()->wait();
    ASSERT_FALSE(result.is_ok());
    EXPECT_EQ(result.status().code(), ErrorCode::kDeadlineExceeded) << result.status().to_string();
    EXPECT_NE(result.status().message().find(dir.path() + "/step-2.tmp/"), std::string::npos)
        << result.status().message();
    faults->set_rule(nullptr);
    EXPECT_EQ(list_steps(*faults).value(), std::vector<uint64_t>{1});
    std::vector<std::vector<float>> restored;
    auto r = testing::restore_newest_into(*faults, nullptr, {}, &restored);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    EXPECT_EQ(r->step, 1u);
    EXPECT_EQ(restored, first.values);
  }
  // The mirror's copy of step 2 stalls: the save commits locally, the mirror reports the file
  // and keeps only step 1.
  {
    auto cp = open_or_die(faults, options);
    stall_tensor_files(*mirror, "write");
    State next = first;
    next.fill_all(2);
    save_and_wait(*cp, next.request(2));
    const Status mirrored = cp->wait_all();
    EXPECT_EQ(mirrored.code(), ErrorCode::kDeadlineExceeded) << mirrored.to_string();
    EXPECT_NE(mirrored.message().find(mirror_dir.path() + "/step-2.tmp/"), std::string::npos)
        << mirrored.message();
    mirror->set_rule(nullptr);
    EXPECT_EQ(list_steps(*mirror).value(), std::vector<uint64_t>{1});
    EXPECT_EQ(read_all(*mirror, 1), first.values);
  }
}

// A record whose integer fields hold numbers of another kind (a float, a negative, one past
// 2^64) is a corrupt record naming the file, never a value converted with undefined behaviour.
TEST(Checkpoint, RecordIntegersThatDoNotFitAreCorrupt) {
  TempDir dir;
  auto target = make_local_store(dir.path());
  State state = State::make({100});
  state.fill_all(1);
  {
    auto cp = open_or_die(target, CheckpointOptions{});
    save_and_wait(*cp, state.request(3));
  }
  const std::string step_record = testing::read_file(dir / "step-3/manifest.json");
  const std::string rank_record = testing::read_file(dir / "step-3/rank-00000.json");
  const auto replace_field = [](std::string text, const std::string& field,
                                const std::string& value) {
    const size_t key = text.find("\"" + field + "\"");
    EXPECT_NE(key, std::string::npos) << field;
    const size_t begin = text.find(':', key) + 1;
    const size_t end = text.find_first_of(",}", begin);
    return text.replace(begin, end - begin, value);
  };
  for (const char* value : {"5.55556e+22", "-1", "2.5", "18446744073709551616"}) {
    testing::write_file(dir / "step-3/manifest.json",
                        replace_field(step_record, "bytes_total", value));
    auto info = read_step_info(*target, 3);
    EXPECT_EQ(info.status().code(), ErrorCode::kCorrupt) << value;
    EXPECT_NE(info.status().message().find("manifest.json"), std::string::npos)
        << info.status().message();
    testing::write_file(dir / "step-3/manifest.json", step_record);

    testing::write_file(dir / "step-3/rank-00000.json",
                        replace_field(rank_record, "nbytes", value));
    auto rank = read_rank_manifest(*target, 3, 0);
    EXPECT_EQ(rank.status().code(), ErrorCode::kCorrupt) << value;
    EXPECT_NE(rank.status().message().find("rank-00000.json"), std::string::npos)
        << rank.status().message();
  }
  testing::write_file(dir / "step-3/rank-00000.json", rank_record);
  EXPECT_TRUE(read_rank_manifest(*target, 3, 0).is_ok());
}

// A damaged local file must not reach the mirror: step 2 is incremental and keeps tensor 0 in
// step 1's file, so copying step 2 reads that damaged file.
TEST(Checkpoint, MirrorRefusesACorruptLocalCopy) {
  TempDir local_dir;
  TempDir mirror_dir;
  auto local = make_local_store(local_dir.path());
  auto mirror = make_local_store(mirror_dir.path());
  State state = State::make({1000, 2000});
  state.fill_all(1);
  CheckpointOptions options;
  options.incremental = true;
  {
    auto cp = open_or_die(local, options);
    save_and_wait(*cp, state.request(1));
  }
  // Damage a byte of tensor 0 after the commit.
  const std::string file = local_dir / "step-1/rank-00000-00000.safetensors";
  std::string bytes = testing::read_file(file);
  const auto manifest = read_rank_manifest(*local, 1, 0).value();
  bytes[manifest.tensors[0].offset + 7] ^= 0x40;
  testing::write_file(file, bytes);
  auto verify = verify_step(*local, 1).value();
  ASSERT_EQ(verify.problems.size(), 1u);
  EXPECT_NE(verify.problems[0].find("/model/layer.0.weight"), std::string::npos)
      << verify.problems[0];

  options.mirror = mirror;
  auto cp = open_or_die(local, options);
  state.fill(1, 2);
  const SaveResult saved = save_and_wait(*cp, state.request(2));
  ASSERT_EQ(saved.tensors_referenced, 1u);  // tensor 0 lives in the damaged step-1 file
  Status mirrored = cp->wait_all();
  EXPECT_EQ(mirrored.code(), ErrorCode::kCorrupt) << mirrored.to_string();
  EXPECT_NE(mirrored.message().find("step-1/rank-00000-00000.safetensors"), std::string::npos)
      << mirrored.message();
  EXPECT_NE(mirrored.message().find("checksum"), std::string::npos) << mirrored.message();
  EXPECT_TRUE(list_steps(*mirror).value().empty());
  EXPECT_FALSE(fs::exists(mirror_dir / "step-1/rank-00000-00000.safetensors"));
}

// Two runs share a mirror and both save step 5: the second run's step 5 must neither be skipped
// silently (its wait() reporting success) nor be taken for the first run's.
TEST(Checkpoint, TwoRunsSharingAMirrorNeverPassOffOneRunsStepAsTheOthers) {
  TempDir first_dir;
  TempDir second_dir;
  TempDir mirror_dir;
  auto mirror = make_local_store(mirror_dir.path());
  State first = State::make({1000, 300});
  first.fill_all(1);
  CheckpointOptions options;
  options.mirror = mirror;
  options.run_id = "first-run";
  {
    auto cp = open_or_die(make_local_store(first_dir.path()), options);
    save_and_wait(*cp, first.request(5));
    ASSERT_TRUE(cp->wait_all().is_ok());
  }
  const std::string mirrored = testing::read_file(mirror_dir / "step-5/manifest.json");

  State second = State::make({1000, 300});
  second.fill_all(2);
  options.run_id = "second-run";
  auto second_local = make_local_store(second_dir.path());
  auto cp = open_or_die(second_local, options);
  auto handle = cp->save(second.request(5));
  ASSERT_TRUE(handle.is_ok()) << handle.status().to_string();
  auto result = handle.value()->wait();
  ASSERT_FALSE(result.is_ok()) << "the second run's step 5 was reported saved";
  EXPECT_EQ(result.status().code(), ErrorCode::kAlreadyExists);
  for (const char* word : {"step 5", "mirror", "first-run", "second-run"}) {
    EXPECT_NE(result.status().message().find(word), std::string::npos)
        << word << " not in: " << result.status().message();
  }
  EXPECT_TRUE(cp->wait_all().is_ok());  // reported by the handle already
  EXPECT_TRUE(list_steps(*second_local).value().empty());

  // The mirror still holds the first run's step 5, and says whose it is.
  EXPECT_EQ(testing::read_file(mirror_dir / "step-5/manifest.json"), mirrored);
  EXPECT_EQ(read_step_info(*mirror, 5).value().run_id, "first-run");
  EXPECT_EQ(read_rank_manifest(*mirror, 5, 0).value().run_id, "first-run");
  EXPECT_EQ(read_all(*mirror, 5), first.values);
  // The second run goes on under a new step number, mirrored as its own.
  save_and_wait(*cp, second.request(6));
  ASSERT_TRUE(cp->wait_all().is_ok());
  EXPECT_EQ(read_step_info(*mirror, 6).value().run_id, "second-run");
  EXPECT_EQ(read_all(*mirror, 6), second.values);
}

// The step appears in the mirror after the save checked it (the other run was faster): the mirror
// copy reports the conflict, and copying an identical step again is a no-op.
TEST(Checkpoint, AMirrorStepThatAppearsMeanwhileIsAConflictNotAnOverwrite) {
  TempDir first_dir;
  TempDir second_dir;
  TempDir mirror_dir;
  auto mirror = make_local_store(mirror_dir.path());
  auto first_local = make_local_store(first_dir.path());
  State first = State::make({500});
  first.fill_all(1);
  {
    CheckpointOptions options;
    options.run_id = "first-run";
    auto cp = open_or_die(first_local, options);
    save_and_wait(*cp, first.request(5));
  }
  // The second run's mirror: once its step 5 is committed locally, the first run's step 5
  // reaches the mirror just before the second run's copy starts.
  auto racing = std::make_shared<FaultStore>(mirror);
  bool raced = false;
  racing->set_fault_rule([&](const StoreOperation& op) {
    if (!raced && op.path.starts_with("step-5")) {
      raced = true;
      EXPECT_TRUE(internal::mirror_step(*first_local, *mirror, 5, kDefaultWriteTimeout).is_ok());
    }
    return 0;
  });
  CheckpointOptions options;
  options.run_id = "second-run";
  options.mirror = racing;
  State second = State::make({500});
  second.fill_all(2);
  auto cp = open_or_die(make_local_store(second_dir.path()), options);
  save_and_wait(*cp, second.request(5));  // committed locally: the mirror was free then
  Status mirrored = cp->wait_all();
  ASSERT_TRUE(raced);
  EXPECT_EQ(mirrored.code(), ErrorCode::kAlreadyExists) << mirrored.to_string();
  EXPECT_NE(mirrored.message().find("first-run"), std::string::npos) << mirrored.message();
  EXPECT_EQ(read_all(*mirror, 5), first.values);
  // The same step copied again from where it came from: nothing to do, nothing reported.
  const std::string record = testing::read_file(mirror_dir / "step-5/manifest.json");
  EXPECT_TRUE(internal::mirror_step(*first_local, *mirror, 5, kDefaultWriteTimeout).is_ok());
  EXPECT_EQ(testing::read_file(mirror_dir / "step-5/manifest.json"), record);
}

TEST(Checkpoint, ReadNamesTheDamagedTensorAndFile) {
  TempDir dir;
  auto target = make_local_store(dir.path());
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
      auto cp = Checkpointer::open(make_local_store(dir.path()), options);
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
  auto target = make_local_store(dir.path());
  EXPECT_EQ(list_steps(*target).value(), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(read_step_info(*target, 2).value().world_size, kRanks);
  for (uint32_t r = 0; r < kRanks; ++r) EXPECT_EQ(read_all(*target, 2, r), states[r].values);
}

TEST(Checkpoint, AStepIsNotCommittedWhenARankNeverFinishes) {
  TempDir dir;
  CheckpointOptions options;
  options.world_size = 2;
  options.commit_timeout_s = 0.3;
  auto target = make_local_store(dir.path());
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

// --- dying mid-save ---------------------------------------------------------------------------

// The saves of the kill tests: small tensors cut into several files, alternating plain,
// incremental with retention, and compressed. Step s's tensors are a function of s.
const std::vector<size_t> kKillSizes = {5000, 2000, 12000, 7, 6553, 3000};

CheckpointOptions kill_test_options(int mode) {
  CheckpointOptions options;
  options.max_file_bytes = 48 << 10;
  options.incremental = mode == 1;
  options.keep_last = 1;
  options.compression = mode == 2 ? Compression::kZstd : Compression::kNone;
  return options;
}

State kill_test_state(uint64_t step) {
  State state = State::make(kKillSizes);
  for (size_t i = 0; i < kKillSizes.size(); ++i) state.fill(i, i % 2 == 0 ? step : step / 4);
  return state;
}

// Saves steps first.. until `last` (or forever when 0); exits the process with 4 on an error.
void save_steps(Checkpointer& cp, uint64_t first, uint64_t last) {
  for (uint64_t step = first; last == 0 || step <= last; ++step) {
    auto handle = cp.save(kill_test_state(step).request(step));
    if (!handle.is_ok() || !handle.value()->wait().is_ok()) _exit(4);
  }
}

// After a death: every committed step verifies and holds exactly what it saved, and a new
// Checkpointer removes the debris and saves the next step.
void expect_intact_and_resumable(const std::string& dir, int mode, const std::string& when) {
  auto target = make_local_store(dir);
  auto steps = list_steps(*target);
  ASSERT_TRUE(steps.is_ok()) << when << ": " << steps.status().to_string();
  for (uint64_t step : steps.value()) {
    auto report = verify_step(*target, step);
    ASSERT_TRUE(report.is_ok()) << when << ": " << report.status().to_string();
    ASSERT_TRUE(report.value().problems.empty())
        << when << ", step " << step << ": " << report.value().problems[0];
    ASSERT_EQ(read_all(*target, step), kill_test_state(step).values) << when << ", step " << step;
  }
  const uint64_t next = steps.value().empty() ? 1 : steps.value().back() + 1;
  auto cp = open_or_die(target, kill_test_options(mode));
  save_and_wait(*cp, kill_test_state(next).request(next));
  ASSERT_EQ(read_all(*target, next), kill_test_state(next).values) << when << ", resumed";
}

// The process dies at each mutating storage operation of two saves in turn — every step of
// writing, fsync, rank manifest, commit record, rename, directory fsync, `latest` and retention
// — through the target's fault hook, as kill -9 would stop it there (nothing flushed, nothing
// cleaned up). A step is committed exactly when its directory's rename happened before the death.
// One test per kind of save (kill_test_options' modes), which ctest runs side by side.
class DyingAtEachStep : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(Checkpoint, DyingAtEachStep, ::testing::Values(0, 1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == 0   ? "plain"
                                              : info.param == 1 ? "incremental"
                                                                : "compressed");
                         });

TEST_P(DyingAtEachStep, OfTheCommitNeverLeavesATornStep) {
  constexpr uint64_t kSteps = 2;
  constexpr int kDiedAtTheFault = 86;
  const int mode = GetParam();
  // A run that does not die: its operations, and the one that publishes each step.
  std::vector<StoreOperation> operations;
  {
    TempDir dir;
    auto faults = std::make_shared<FaultStore>(make_local_store(dir.path()));
    auto cp = open_or_die(faults, kill_test_options(mode));
    save_steps(*cp, 1, kSteps);
    operations = faults->operations();
  }
  std::vector<size_t> published;  // 1-based position of "publish step-s.tmp -> step-s"
  for (uint64_t step = 1; step <= kSteps; ++step) {
    const std::string rename = step_directory(step) + ".tmp -> " + step_directory(step);
    auto it = std::find_if(operations.begin(), operations.end(), [&](const StoreOperation& op) {
      return op.kind == "publish" && op.path == rename;
    });
    ASSERT_NE(it, operations.end()) << rename;
    published.push_back(static_cast<size_t>(it - operations.begin()) + 1);
  }
  for (size_t fatal = 1; fatal <= operations.size(); ++fatal) {
    TempDir dir;
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto faults = std::make_shared<FaultStore>(make_local_store(dir.path()));
      size_t count = 0;
      faults->set_fault_rule([&](const StoreOperation&) {
        if (++count == fatal) _exit(kDiedAtTheFault);
        return 0;
      });
      auto cp = Checkpointer::open(faults, kill_test_options(mode));
      if (!cp.is_ok()) _exit(3);
      save_steps(*cp.value(), 1, kSteps);
      _exit(0);
    }
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    const std::string when = "mode " + std::to_string(mode) + ", death at operation " +
                             std::to_string(fatal) + " (" + operations[fatal - 1].to_string() +
                             ")";
    ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == kDiedAtTheFault)
        << when << ": the child did not die there (status " << wstatus << ")";
    const uint64_t committed = static_cast<uint64_t>(
        std::count_if(published.begin(), published.end(), [&](size_t p) { return p < fatal; }));
    auto steps = list_steps(*make_local_store(dir.path()));
    ASSERT_TRUE(steps.is_ok()) << when;
    ASSERT_EQ(steps.value().empty() ? 0 : steps.value().back(), committed) << when;
    expect_intact_and_resumable(dir.path(), mode, when);
  }
}

// An extra: SIGKILL at random moments of an endless run of saves, no count of kills that must
// land anywhere in particular. After each, every committed step holds what it saved, the newest
// never goes back, and the next Checkpointer saves on.
TEST(Checkpoint, KillNineAtRandomMomentsNeverLeavesATornStep) {
  TempDir dir;
  std::mt19937_64 rng(20261129);
  uint64_t newest = 0;
  for (int kill_index = 0; kill_index < 20; ++kill_index) {
    const int mode = kill_index % 3;
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto cp = Checkpointer::open(make_local_store(dir.path()), kill_test_options(mode));
      if (!cp.is_ok()) _exit(3);
      auto steps = list_steps(cp.value()->target());
      save_steps(*cp.value(),
                 steps.is_ok() && !steps.value().empty() ? steps.value().back() + 1 : 1, 0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 60000));
    ::kill(pid, SIGKILL);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus))
        << "the saving child exited by itself with status " << WEXITSTATUS(wstatus);
    const std::string when = "kill " + std::to_string(kill_index);
    auto steps = list_steps(*make_local_store(dir.path()));
    ASSERT_TRUE(steps.is_ok()) << when;
    const uint64_t now = steps.value().empty() ? 0 : steps.value().back();
    ASSERT_GE(now, newest) << when << ": the newest step went back";
    expect_intact_and_resumable(dir.path(), mode, when);
    newest = now + 1;  // the resumed save committed one more
  }
}

}  // namespace
}  // namespace zerowait
