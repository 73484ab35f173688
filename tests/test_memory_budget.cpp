// The loader's automatic memory budget: the sizing rule by hand-computed cases, the headroom read
// from fixture /proc and cgroup trees, and a loader over large samples that gets its threads and
// prefetch by default where a fixed 512 MiB budget would have cut them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "host/memory_headroom.hpp"
#include "loader/memory_budget.hpp"
#include "testing/doctor_fixture.hpp"
#include "testing/testing.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/writer.hpp"

namespace zerowait {
namespace {

using internal::automatic_memory_budget;
using internal::kMinAutomaticMemoryBudget;
using testing::DoctorFixture;

using testing::kGiB;
using testing::kMiB;

TEST(AutomaticMemoryBudget, WhatTheArenasNeedBetweenTheFloorAndAQuarterOfTheHeadroom) {
  // Small batches: the floor.
  EXPECT_EQ(automatic_memory_budget(10 * kMiB, 8, 64 * kGiB, 1), kMinAutomaticMemoryBudget);
  // Large batches: what they need, 10 x 200 MiB.
  EXPECT_EQ(automatic_memory_budget(200 * kMiB, 10, 64 * kGiB, 1), 2000 * kMiB);
  // More than a quarter of the headroom: the quarter.
  EXPECT_EQ(automatic_memory_budget(200 * kMiB, 10, 4 * kGiB, 1), 1 * kGiB);
  // Eight ranks on the machine share it.
  EXPECT_EQ(automatic_memory_budget(200 * kMiB, 10, 32 * kGiB, 8), 1 * kGiB);
  // Never below the floor, not even with nothing to spare or nothing known.
  EXPECT_EQ(automatic_memory_budget(200 * kMiB, 10, 1 * kGiB, 8), kMinAutomaticMemoryBudget);
  EXPECT_EQ(automatic_memory_budget(200 * kMiB, 10, 0, 1), kMinAutomaticMemoryBudget);
}

void meminfo(DoctorFixture& fx, uint64_t available_kib) {
  fx.file("/proc/meminfo", "MemTotal: 99999999 kB\nMemAvailable: " +
                               std::to_string(available_kib) + " kB\n");
}

TEST(MemoryHeadroom, AvailableMemoryIsReadFromMeminfo) {
  testing::TempDir dir;
  std::ofstream(dir.path() + "/meminfo") << "MemTotal:       1000 kB\nMemAvailable:    512 kB\n";
  EXPECT_EQ(available_memory_bytes(dir.path()), 512u * 1024);
  EXPECT_EQ(available_memory_bytes(dir.path() + "/missing"), 0u);
  EXPECT_GT(available_memory_bytes(), 0u);
}

TEST(MemoryHeadroom, MemAvailableWithoutACgroupLimit) {
  DoctorFixture fx;
  meminfo(fx, 8 << 20);  // 8 GiB
  fx.file("/proc/self/cgroup", "0::/job\n");
  fx.file("/cg/job/memory.max", "max\n");
  fx.file("/cg/memory.max", "max\n");
  EXPECT_EQ(memory_headroom_bytes(fx.root() + "/proc", fx.root() + "/cg"), 8 * kGiB);
  // cgroup v1 only: no "0::" line.
  fx.file("/proc/self/cgroup", "4:memory:/job\n");
  EXPECT_EQ(memory_headroom_bytes(fx.root() + "/proc", fx.root() + "/cg"), 8 * kGiB);
}

TEST(MemoryHeadroom, TheTightestRoomUnderAnyEnclosingMemoryMax) {
  DoctorFixture fx;
  meminfo(fx, 64 << 20);  // 64 GiB on the host
  fx.file("/proc/self/cgroup", "0::/pod/job\n");
  // The job's own limit: 6 GiB, 3 GiB in use of which 1 GiB is inactive page cache: 4 GiB room.
  fx.file("/cg/pod/job/memory.max", std::to_string(6 * kGiB) + "\n");
  fx.file("/cg/pod/job/memory.current", std::to_string(3 * kGiB) + "\n");
  fx.file("/cg/pod/job/memory.stat", "anon 2147483648\ninactive_file " +
                                         std::to_string(1 * kGiB) + "\nactive_file 0\n");
  EXPECT_EQ(memory_headroom_bytes(fx.root() + "/proc", fx.root() + "/cg"), 4 * kGiB);
  // The pod's limit above it is tighter: 2 GiB left there.
  fx.file("/cg/pod/memory.max", std::to_string(10 * kGiB) + "\n");
  fx.file("/cg/pod/memory.current", std::to_string(8 * kGiB) + "\n");
  EXPECT_EQ(memory_headroom_bytes(fx.root() + "/proc", fx.root() + "/cg"), 2 * kGiB);
  // Over its limit: no room at all, and that is not "unknown".
  fx.file("/cg/pod/memory.current", std::to_string(11 * kGiB) + "\n");
  EXPECT_EQ(memory_headroom_bytes(fx.root() + "/proc", fx.root() + "/cg"), 0u);
}

TEST(MemoryHeadroom, NothingReadableIsZero) {
  DoctorFixture fx;
  fx.dir("/proc");
  EXPECT_EQ(memory_headroom_bytes(fx.root() + "/proc", fx.root() + "/cg"), 0u);
}

// 24 samples of 4 MiB: a batch of 8 is 32 MiB raw, about 80 MiB per arena with its slack and
// output; 4 threads and prefetch 4 want 10 arenas, and twice that room to grow: 1.6 GB.
std::shared_ptr<Dataset> large_sample_dataset(const std::string& dir) {
  auto writer = ShardWriter::create(dir + "/shard-000.zws", {.sync = false});
  EXPECT_TRUE(writer.is_ok()) << writer.status().to_string();
  std::string bytes(4 * kMiB, '\0');
  for (uint64_t g = 0; g < 24; ++g) {
    std::memcpy(bytes.data(), &g, sizeof g);
    const std::vector<FieldData> fields = {{"bin", std::as_bytes(std::span(bytes))}};
    EXPECT_TRUE(writer.value().add_sample("sample-" + std::to_string(g), fields).is_ok());
  }
  EXPECT_TRUE(writer.value().finish().is_ok());
  auto dataset = Dataset::open(dir);
  EXPECT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  return dataset.value();
}

LoaderOptions large_batch_options() {
  LoaderOptions o;
  o.batch_size = 8;
  o.threads = 4;
  o.prefetch = 4;
  return o;
}

TEST(LoaderMemoryBudget, ByDefaultLargeBatchesGetEveryThreadAndTheirPrefetch) {
  if (memory_headroom_bytes() / 4 < 2 * kGiB) {
    GTEST_SKIP() << "this test wants 8 GiB of available memory, MemAvailable has "
                 << (memory_headroom_bytes() >> 20) << " MiB";
  }
  testing::TempDir dir;
  const std::shared_ptr<Dataset> dataset = large_sample_dataset(dir.path());
  auto loader = Loader::create(dataset, large_batch_options());
  ASSERT_TRUE(loader.is_ok()) << loader.status().to_string();
  const LoaderStats automatic = loader.value()->stats();
  EXPECT_GT(automatic.memory_budget, kMinAutomaticMemoryBudget);
  EXPECT_EQ(automatic.threads, 4u);
  EXPECT_EQ(automatic.arenas, 10u) << "threads + prefetch + 2";
  for (int k = 0; k < 3; ++k) {
    auto batch = loader.value()->next();
    ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
    ASSERT_NE(batch.value(), nullptr);
  }

  loader.value().reset();
  // Autotune may raise prefetch up to the arenas there are; they are still 10, each with room
  // to grow, not 20 at their estimate.
  LoaderOptions tuned = large_batch_options();
  tuned.autotune = true;
  auto autotuned = Loader::create(dataset, tuned);
  ASSERT_TRUE(autotuned.is_ok()) << autotuned.status().to_string();
  EXPECT_EQ(autotuned.value()->stats().arenas, 10u);
  EXPECT_EQ(autotuned.value()->stats().memory_budget, automatic.memory_budget);
  autotuned.value().reset();

  // A budget set is kept. 512 MiB, the default before the budget was sized, holds 6 arenas:
  // prefetch is cut to what the 4 threads build. 256 MiB holds 3: one thread.
  LoaderOptions fixed = large_batch_options();
  fixed.memory_budget = 512 * kMiB;
  auto old_default = Loader::create(dataset, fixed);
  ASSERT_TRUE(old_default.is_ok()) << old_default.status().to_string();
  EXPECT_EQ(old_default.value()->stats().arenas, 6u);
  old_default.value().reset();
  fixed.memory_budget = 256 * kMiB;
  auto small = Loader::create(dataset, fixed);
  ASSERT_TRUE(small.is_ok()) << small.status().to_string();
  EXPECT_EQ(small.value()->stats().memory_budget, 256 * kMiB);
  EXPECT_EQ(small.value()->stats().threads, 1u);
}

}  // namespace
}  // namespace zerowait
