// Checkpoints in an S3 bucket of the real server ctest starts (Ceph RGW, tests/s3/rgw.sh),
// through the same public API as on disk: a local primary mirrored to s3://, restored from the
// bucket once the local copy is gone; a primary on s3:// itself with incremental saves,
// retention and verification; and a step the bucket holds only in part never counting.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>

#include "storage/s3/s3_client.hpp"
#include "storage/s3/s3_upload.hpp"
#include "testing/checkpoint_state.hpp"
#include "testing/fault_proxy.hpp"
#include "testing/s3_server.hpp"
#include "testing/testing.hpp"
#include "zerowait/checkpoint/checkpointer.hpp"
#include "zerowait/checkpoint/maintenance.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/checkpoint/restore.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

using namespace std::chrono_literals;
using testing::read_all;
using testing::save_and_wait;
using testing::TempDir;
using testing::TrainingState;

class S3CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto bucket = testing::make_test_bucket();
    if (!bucket) GTEST_SKIP() << testing::kNoS3Server;
    client_ = std::move(bucket->client);
    bucket_ = bucket->name;
  }

  std::shared_ptr<Store> bucket_target(const std::string& prefix) {
    auto target = open_store("s3://" + bucket_ + "/" + prefix);
    EXPECT_TRUE(target.is_ok()) << target.status().to_string();
    return target.is_ok() ? *target : nullptr;
  }

  // A fault proxy in front of the server, which s3:// URLs opened from now on reach (the
  // process's S3 client is made at its first use: each test runs in a process of its own).
  std::unique_ptr<testing::FaultProxy> through_fault_proxy() {
    const auto server = testing::test_s3_server_env();
    if (!server) return nullptr;
    auto proxy = std::make_unique<testing::FaultProxy>(server->at("AWS_ENDPOINT_URL"));
    std::map<std::string, std::string> through_proxy = *server;
    through_proxy["AWS_ENDPOINT_URL"] = proxy->url();
    testing::export_test_s3_env(through_proxy);
    return proxy;
  }

  std::unique_ptr<internal::S3Client> client_;
  std::string bucket_;
};

TEST_F(S3CheckpointTest, AStepMirroredToTheBucketRestoresExactlyOnceTheLocalCopyIsGone) {
  TempDir local_dir;
  auto mirror = bucket_target("runs/a");
  ASSERT_TRUE(mirror);
  // 40 MiB in the large tensor: its file goes up as a multipart upload with parts in parallel.
  TrainingState state = TrainingState::make({1000, 10 << 20});
  CheckpointOptions options;
  options.mirror = mirror;
  {
    auto cp = testing::open_or_die(make_local_store(local_dir.path()), options);
    for (uint64_t step = 1; step <= 2; ++step) {
      state.fill_all(step);
      save_and_wait(*cp, state.request(step));
    }
    ASSERT_TRUE(cp->wait_all().is_ok());
  }
  EXPECT_EQ(list_steps(*mirror).value(), (std::vector<uint64_t>{1, 2}));
  auto verified = verify_step(*mirror, 2);
  ASSERT_TRUE(verified.is_ok()) << verified.status().to_string();
  EXPECT_TRUE(verified->problems.empty());
  EXPECT_GT(verified->bytes, 40u << 20);

  // The CLI reads the bucket as it reads a directory.
  std::vector<std::string> env;
  const auto server = testing::test_s3_server_env();
  for (const auto& [name, value] : *server) env.push_back(name + "=" + value);
  const std::string url = "s3://" + bucket_ + "/runs/a";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"ckpt", "ls", url}, {"ckpt", "verify", url, "2"}}) {
    const testing::CommandResult cli = testing::run_cli(args, env);
    EXPECT_EQ(cli.exit_code, 0) << args[1] << ": " << cli.err;
    EXPECT_NE(cli.out.find("2"), std::string::npos) << cli.out;
  }

  std::filesystem::remove_all(local_dir.path());
  auto empty_local = make_local_store(local_dir.path());
  ASSERT_TRUE(empty_local->make_directory("", metadata_deadline()).is_ok());
  std::vector<std::vector<float>> restored;
  auto r = testing::restore_newest_into(*empty_local, mirror.get(), {}, &restored);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 2u);
  EXPECT_EQ(r->tier, Tier::kMirror);
  EXPECT_EQ(restored, state.values);
}

// A file over the multipart threshold goes up in parts through the fault proxy, which fails one
// part with 503 and resets the connection of another: those parts are sent again, the step
// commits, and every file in the bucket is byte for byte the local one.
TEST_F(S3CheckpointTest, AFileOverTheMultipartThresholdIsSentInPartsAndAFailedPartAgain) {
  auto started = through_fault_proxy();
  ASSERT_TRUE(started);
  testing::FaultProxy& proxy = *started;
  proxy.fail_next({.method = "PUT", .path_contains = "partNumber=2&", .status = 503});
  proxy.fail_next({.method = "PUT", .path_contains = "partNumber=4&", .reset = true});

  TempDir local_dir;
  auto mirror = bucket_target("runs/m");
  ASSERT_TRUE(mirror);
  // 17 Mi floats, 68 MiB: the large tensor's file is over the threshold.
  const size_t large = (internal::kS3MultipartFromBytes + (4 << 20)) / sizeof(float);
  TrainingState state = TrainingState::make({1000, large});
  state.fill_all(1);
  CheckpointOptions options;
  options.mirror = mirror;
  {
    auto cp = testing::open_or_die(make_local_store(local_dir.path()), options);
    save_and_wait(*cp, state.request(1));
    ASSERT_TRUE(cp->wait_all().is_ok());
  }
  EXPECT_EQ(list_steps(*mirror).value(), std::vector<uint64_t>{1});

  // Multipart was used, and the two failed parts went again in the same upload.
  EXPECT_EQ(proxy.faults_applied(), 2u);
  std::map<std::string, int> parts_sent, parts_failed;
  for (const testing::FaultProxy::Exchange& e : proxy.log()) {
    if (e.method != "PUT" || e.path.find("uploadId=") == std::string::npos) continue;
    const size_t at = e.path.find("partNumber=");
    ASSERT_NE(at, std::string::npos) << e.path;
    const std::string part = e.path.substr(at, e.path.find('&', at) - at);
    ++(e.faulted ? parts_failed : parts_sent)[part];
  }
  EXPECT_EQ(parts_failed, (std::map<std::string, int>{{"partNumber=2", 1}, {"partNumber=4", 1}}));
  EXPECT_GE(parts_sent.size(), 5u);  // 68 MiB in 16 MiB parts
  for (const auto& [part, times] : parts_sent) EXPECT_EQ(times, 1) << part;

  // What the bucket holds is what was written locally, byte for byte.
  const std::string step_dir = local_dir / "step-1";
  uint64_t compared = 0, largest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(step_dir)) {
    const std::string name = entry.path().filename().string();
    auto in_bucket = client_->get(bucket_, "runs/m/step-1/" + name, Deadline::after(120s));
    ASSERT_TRUE(in_bucket.is_ok()) << name << ": " << in_bucket.status().to_string();
    EXPECT_TRUE(*in_bucket == testing::read_file(entry.path().string())) << name;
    compared += 1;
    largest = std::max<uint64_t>(largest, in_bucket->size());
  }
  EXPECT_GT(compared, 1u);
  EXPECT_GE(largest, internal::kS3MultipartFromBytes);
  EXPECT_EQ(read_all(*mirror, 1), state.values);
}

// The other path: a part the server refuses on every try. The save fails naming the object and
// the part, the multipart upload is aborted (the bucket keeps no parts of it), and no step is
// committed: step 1 is still what a restore loads.
TEST_F(S3CheckpointTest, APartThatFailsOnEveryTryFailsTheSaveAndLeavesNoPartsBehind) {
  auto started = through_fault_proxy();
  ASSERT_TRUE(started);
  testing::FaultProxy& proxy = *started;
  auto target = bucket_target("runs/f");
  ASSERT_TRUE(target);
  const size_t large = (internal::kS3MultipartFromBytes + (4 << 20)) / sizeof(float);
  TrainingState state = TrainingState::make({1000, large});
  TrainingState first = state;
  first.fill_all(1);
  auto cp = testing::open_or_die(target, {});
  save_and_wait(*cp, first.request(1));

  proxy.fail_always({.method = "PUT", .path_contains = "partNumber=3&", .status = 503});
  state.fill_all(2);
  auto handle = cp->save(state.request(2));
  ASSERT_TRUE(handle.is_ok()) << handle.status().to_string();
  const auto result = handle.value()->wait();
  proxy.clear_faults();
  ASSERT_FALSE(result.is_ok());
  const std::string message = result.status().message();
  EXPECT_NE(message.find("UploadPart 3 s3://" + bucket_ + "/runs/f/step-2"), std::string::npos)
      << message;
  EXPECT_GE(proxy.faults_applied(), 2u) << "the part was tried again before the save gave up";

  auto uploads = client_->list_multipart_uploads(bucket_, "runs/f/", Deadline::after(60s));
  ASSERT_TRUE(uploads.is_ok()) << uploads.status().to_string();
  EXPECT_TRUE(uploads->empty()) << uploads->front();
  EXPECT_EQ(list_steps(*target).value(), std::vector<uint64_t>{1});
  std::vector<std::vector<float>> restored;
  auto r = testing::restore_newest_into(*target, nullptr, {}, &restored);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 1u);
  EXPECT_EQ(restored, first.values);
}

// An upload the server stops answering (a stalled S3 endpoint) ends at the deadline of the sync()
// or close() that makes it, naming the object; a write (into the local spool) refuses a deadline
// already passed the same way.
TEST_F(S3CheckpointTest, AStalledUploadEndsAtTheDeadlineOfItsSyncOrCloseNamingTheObject) {
  auto started = through_fault_proxy();
  ASSERT_TRUE(started);
  testing::FaultProxy& proxy = *started;
  auto store = bucket_target("stalled");
  ASSERT_TRUE(store);
  proxy.fail_always({.method = "PUT", .stall = 60s});
  const std::string url = "s3://" + bucket_ + "/stalled/obj";
  const std::string bytes(4096, 'x');
  const std::span<const std::byte> data(reinterpret_cast<const std::byte*>(bytes.data()),
                                        bytes.size());
  using FileCall = std::function<Status(WritableFile&, Deadline)>;
  const std::vector<std::pair<const char*, FileCall>> calls = {
      {"sync", [](WritableFile& f, Deadline d) { return f.sync(d); }},
      {"close", [](WritableFile& f, Deadline d) { return f.close(d); }},
  };
  for (const auto& [kind, run] : calls) {
    SCOPED_TRACE(kind);
    auto file = store->create("obj", metadata_deadline());
    ASSERT_TRUE(file.is_ok()) << file.status().to_string();
    ASSERT_TRUE((*file)->write_at(0, data, write_deadline()).is_ok());
    const auto deadline = 1s;
    const auto start = std::chrono::steady_clock::now();
    const Status status = run(**file, Deadline::after(deadline));
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(status.code(), ErrorCode::kDeadlineExceeded) << status.to_string();
    EXPECT_NE(status.message().find(url), std::string::npos) << status.message();
    EXPECT_LT(took, deadline + 1s);
  }
  EXPECT_GE(proxy.faults_applied(), 2u);
  auto file = store->create("obj", metadata_deadline());
  ASSERT_TRUE(file.is_ok());
  const Status late = (*file)->write_at(0, data, Deadline{Clock::now() - 1s});
  EXPECT_EQ(late.code(), ErrorCode::kDeadlineExceeded) << late.to_string();
  EXPECT_NE(late.message().find(url), std::string::npos) << late.message();
  proxy.clear_faults();
}

TEST_F(S3CheckpointTest, APrimaryInTheBucketSavesIncrementallyKeepsTheNewestAndVerifies) {
  auto target = bucket_target("runs/b");
  ASSERT_TRUE(target);
  TrainingState state = TrainingState::make({1000, 2000, 3000});
  CheckpointOptions options;
  options.incremental = true;
  options.keep_last = 2;
  auto cp = testing::open_or_die(target, options);
  state.fill_all(1);
  save_and_wait(*cp, state.request(1));
  for (uint64_t step = 2; step <= 4; ++step) {
    state.fill(0, step);  // only the first tensor changes: the others are referenced
    const SaveResult saved = save_and_wait(*cp, state.request(step));
    EXPECT_EQ(saved.tensors_referenced, 2u) << step;
  }
  ASSERT_TRUE(cp->wait_all().is_ok());
  EXPECT_EQ(list_steps(*target).value(), (std::vector<uint64_t>{3, 4}));
  EXPECT_EQ(read_all(*target, 4), state.values);
  for (uint64_t step : {3u, 4u}) {
    auto verified = verify_step(*target, step);
    ASSERT_TRUE(verified.is_ok()) << verified.status().to_string();
    EXPECT_TRUE(verified->problems.empty()) << verified->problems[0];
  }
  // Nothing left under a temporary name.
  const std::vector<std::string> names = target->list("", metadata_deadline()).value();
  for (const std::string& name : names) EXPECT_FALSE(name.ends_with(".tmp")) << name;
}

TEST_F(S3CheckpointTest, AStepWhoseCommitRecordNeverArrivedDoesNotCount) {
  auto target = bucket_target("runs/c");
  ASSERT_TRUE(target);
  TrainingState state = TrainingState::make({1000});
  state.fill_all(1);
  {
    auto cp = testing::open_or_die(target, {});
    save_and_wait(*cp, state.request(1));
  }
  // Step 2 copied to the bucket without its commit record, as an interrupted publish leaves it.
  const std::vector<std::string> names = target->list("step-1", metadata_deadline()).value();
  for (const std::string& name : names) {
    if (name == "manifest.json") continue;
    ASSERT_TRUE(
        client_
            ->copy(bucket_, "runs/c/step-1/" + name, "runs/c/step-2/" + name, Deadline::after(60s))
            .is_ok());
  }
  EXPECT_EQ(list_steps(*target).value(), std::vector<uint64_t>{1});
  std::vector<std::vector<float>> restored;
  auto r = testing::restore_newest_into(*target, nullptr, {}, &restored);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->step, 1u);
  EXPECT_EQ(restored, state.values);
}

}  // namespace
}  // namespace zerowait
