// Ranks meeting through files across jobs, through the public C++ API on a real directory: a
// part a dead job left in step-N.tmp is never committed into a later job's step N, a rank that
// opens before its job's rank 0 is still counted, and a rank 0 or a committed rank whose job was
// replaced stops at once. Each Checkpointer stands for one process: it shares nothing with the
// others but the directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "testing/checkpoint_state.hpp"
#include "testing/testing.hpp"
#include "zerowait/checkpoint/checkpointer.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

using State = testing::TrainingState;
using testing::read_all;
using testing::TempDir;
namespace fs = std::filesystem;

// A rank of a two-rank job whose ranks meet through files.
std::unique_ptr<Checkpointer> open_rank(const TempDir& dir, uint32_t rank, double timeout_s) {
  CheckpointOptions options;
  options.rank = rank;
  options.world_size = 2;
  options.commit_timeout_s = timeout_s;
  return testing::open_or_die(make_local_store(dir.path()), options);
}

State state_of(uint32_t rank, uint64_t version) {
  State state = State::make({100 + rank, 30});
  state.fill_all(version);
  return state;
}

std::optional<SaveHandle> start_save(Checkpointer& cp, const State& state, uint64_t step) {
  auto handle = cp.save(state.request(step));
  EXPECT_TRUE(handle.is_ok()) << handle.status().to_string();
  if (!handle.is_ok()) return std::nullopt;
  return handle.value();
}

// Both ranks of a job save `step` at once; both must commit.
void save_together(Checkpointer& rank0, Checkpointer& rank1, const State& s0, const State& s1,
                   uint64_t step) {
  auto h1 = start_save(rank1, s1, step);
  auto h0 = start_save(rank0, s0, step);
  ASSERT_TRUE(h0.has_value() && h1.has_value());
  auto r0 = h0->wait();
  auto r1 = h1->wait();
  ASSERT_TRUE(r0.is_ok()) << r0.status().to_string();
  ASSERT_TRUE(r1.is_ok()) << r1.status().to_string();
  EXPECT_TRUE(r0.value().committed && r1.value().committed);
}

// Job A commits step 1, then its rank 1 makes its part of step 2 durable and the job dies
// before rank 0 saves step 2: step-2.tmp/rank-00001.json is the dead job's.
void leave_a_dead_jobs_part(const TempDir& dir) {
  auto rank0 = open_rank(dir, 0, 30);
  auto rank1 = open_rank(dir, 1, 30);
  save_together(*rank0, *rank1, state_of(0, 1), state_of(1, 1), 1);
  rank0.reset();
  auto alone = open_rank(dir, 1, 0.2);
  auto handle = start_save(*alone, state_of(1, 2), 2);
  ASSERT_TRUE(handle.has_value());
  EXPECT_EQ(handle->wait().status().code(), ErrorCode::kDeadlineExceeded);
  ASSERT_TRUE(fs::exists(dir / "step-2.tmp/rank-00001.json"));
}

std::string coordinator_of_part(const TempDir& dir, const std::string& part) {
  return nlohmann::json::parse(testing::read_file(dir / part)).value("coordinator", "");
}

std::string current_coordinator(const TempDir& dir) {
  std::string token = testing::read_file(dir / "coordinator");
  while (!token.empty() && token.back() == '\n') token.pop_back();
  return token;
}

TEST(CheckpointRanks, ADeadJobsPartIsNeverCommittedIntoANewJobsStep) {
  TempDir dir;
  leave_a_dead_jobs_part(dir);
  const std::string dead_part = testing::read_file(dir / "step-2.tmp/rank-00001.json");

  // Job B resumes after step 1; its rank 1 never saves step 2.
  auto rank0 = open_rank(dir, 0, 0.5);
  auto handle = start_save(*rank0, state_of(0, 99), 2);
  ASSERT_TRUE(handle.has_value());
  auto result = handle->wait();
  ASSERT_EQ(result.status().code(), ErrorCode::kDeadlineExceeded) << result.status().to_string();
  const std::string& message = result.status().message();
  EXPECT_NE(message.find("1 of 2 ranks"), std::string::npos) << message;
  EXPECT_NE(message.find(dir.path() + "/step-2.tmp/rank-00001.json"), std::string::npos) << message;
  EXPECT_NE(message.find("not counted"), std::string::npos) << message;
  auto target = make_local_store(dir.path());
  EXPECT_EQ(list_steps(*target).value(), std::vector<uint64_t>{1});
  EXPECT_EQ(testing::read_file(dir / "step-2.tmp/rank-00001.json"), dead_part);
  rank0.reset();

  // Job C saves step 2 with both ranks: its own parts replace the dead one (and job B's FAILED
  // note, carrying job B's token, does not fail job C's rank 1).
  EXPECT_TRUE(fs::exists(dir / "step-2.tmp/FAILED"));
  auto c0 = open_rank(dir, 0, 30);
  auto c1 = open_rank(dir, 1, 30);
  save_together(*c0, *c1, state_of(0, 5), state_of(1, 5), 2);
  EXPECT_EQ(read_all(*target, 2, 0), state_of(0, 5).values);
  EXPECT_EQ(read_all(*target, 2, 1), state_of(1, 5).values);
}

TEST(CheckpointRanks, ARankThatOpensBeforeItsRankZeroIsCountedOnceRankZeroOpens) {
  TempDir dir;
  leave_a_dead_jobs_part(dir);
  const std::string dead_token = current_coordinator(dir);

  // Job B's rank 1 opens and makes its part durable while `coordinator` still names job A's
  // rank 0: its part carries the dead job's token, like the dead part did.
  auto rank1 = open_rank(dir, 1, 60);
  auto h1 = start_save(*rank1, state_of(1, 99), 2);
  ASSERT_TRUE(h1.has_value());
  ASSERT_TRUE(h1->wait_part().is_ok());
  EXPECT_EQ(coordinator_of_part(dir, "step-2.tmp/rank-00001.json"), dead_token);

  auto rank0 = open_rank(dir, 0, 60);
  EXPECT_NE(current_coordinator(dir), dead_token);
  auto h0 = start_save(*rank0, state_of(0, 99), 2);
  ASSERT_TRUE(h0.has_value());
  auto r0 = h0->wait();
  auto r1 = h1->wait();
  ASSERT_TRUE(r0.is_ok()) << r0.status().to_string();
  ASSERT_TRUE(r1.is_ok()) << r1.status().to_string();
  auto target = make_local_store(dir.path());
  EXPECT_EQ(read_all(*target, 2, 0), state_of(0, 99).values);
  EXPECT_EQ(read_all(*target, 2, 1), state_of(1, 99).values);
  EXPECT_EQ(coordinator_of_part(dir, "step-2/rank-00001.json"), current_coordinator(dir));
}

TEST(CheckpointRanks, ARankStopsWhenTheRankZeroItCommittedWithIsReplaced) {
  TempDir dir;
  auto rank0 = open_rank(dir, 0, 60);
  auto rank1 = open_rank(dir, 1, 60);
  save_together(*rank0, *rank1, state_of(0, 1), state_of(1, 1), 1);

  // Rank 0 hangs (it never saves step 2) and a new job's rank 0 opens the directory while this
  // job's rank 1 still waits: rank 1 is bound to its own rank 0 and must not answer to the new
  // one, or the new job would commit its part.
  auto h1 = start_save(*rank1, state_of(1, 2), 2);
  ASSERT_TRUE(h1.has_value());
  ASSERT_TRUE(h1->wait_part().is_ok());
  auto next0 = open_rank(dir, 0, 0.5);
  auto r1 = h1->wait();
  ASSERT_EQ(r1.status().code(), ErrorCode::kCancelled) << r1.status().to_string();
  EXPECT_NE(r1.status().message().find("restart every rank"), std::string::npos)
      << r1.status().message();

  auto h0 = start_save(*next0, state_of(0, 7), 2);
  ASSERT_TRUE(h0.has_value());
  EXPECT_EQ(h0->wait().status().code(), ErrorCode::kDeadlineExceeded);
  EXPECT_EQ(list_steps(*make_local_store(dir.path())).value(), std::vector<uint64_t>{1});

  // The replaced rank 0 stops too, instead of committing with parts written for another.
  auto old0 = start_save(*rank0, state_of(0, 3), 3);
  ASSERT_TRUE(old0.has_value());
  auto r0 = old0->wait();
  ASSERT_EQ(r0.status().code(), ErrorCode::kCancelled) << r0.status().to_string();
  EXPECT_NE(r0.status().message().find("another process opened " + dir.path()),
            std::string::npos)
      << r0.status().message();
}

TEST(CheckpointRanks, ASingleProcessOpeningTheDirectoryLeavesTheJobsRankZeroInCharge) {
  TempDir dir;
  auto rank0 = open_rank(dir, 0, 30);
  auto rank1 = open_rank(dir, 1, 30);
  const std::string token = current_coordinator(dir);
  // One process of one rank (a reader, an evaluation) opens the same directory.
  auto reader = testing::open_or_die(make_local_store(dir.path()));
  EXPECT_EQ(current_coordinator(dir), token);
  save_together(*rank0, *rank1, state_of(0, 1), state_of(1, 1), 1);
  EXPECT_EQ(read_all(*make_local_store(dir.path()), 1, 1), state_of(1, 1).values);
}

}  // namespace
}  // namespace zerowait
