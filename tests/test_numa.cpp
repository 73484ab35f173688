// NUMA placement of the loader: the choice of node from a fixture sysfs tree (two nodes, a GPU on
// node 1, a GPU without a node, a missing device, a malformed file, nodes that do not exist or
// have no CPUs), and the real placement: the loader's threads run on the node's CPUs and its
// arenas and block window are bound to the node's memory, seen through /proc as any tool sees it.
//
// On a one-node machine the real tests use a fixture sysfs whose node 0 lists one CPU only, so
// the threads' CPU set is visibly narrower than the process's while the memory binds to the real
// node 0.
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "host/aligned_buffer.hpp"
#include "host/numa.hpp"
#include "loader/block_window.hpp"
#include "testing/testing.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/loader/numa.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/writer.hpp"
#include "zerowait/storage/fault_store.hpp"

namespace zerowait {
namespace {

using testing::TempDir;

// ---------------------------------------------------------------------------------------------
// Fixtures

// A sysfs tree under `root`: node0 (CPUs 0-1), node1 (2-3), node2 (memory only); GPUs
// 0000:18:00.0 and 0000:af:00.0 on node 1, 0000:3b:00.0 with numa_node -1, 0000:5e:00.0 with a
// malformed file.
void write_two_node_sysfs(const TempDir& root) {
  testing::write_file(root / "sys/devices/system/node/node0/cpulist", "0-1\n");
  testing::write_file(root / "sys/devices/system/node/node1/cpulist", "2-3\n");
  testing::write_file(root / "sys/devices/system/node/node2/cpulist", "\n");
  testing::write_file(root / "sys/devices/system/node/online", "0-2\n");  // not a node
  testing::write_file(root / "sys/bus/pci/devices/0000:18:00.0/numa_node", "1\n");
  testing::write_file(root / "sys/bus/pci/devices/0000:af:00.0/numa_node", "1\n");
  testing::write_file(root / "sys/bus/pci/devices/0000:3b:00.0/numa_node", "-1\n");
  testing::write_file(root / "sys/bus/pci/devices/0000:5e:00.0/numa_node", "one\n");
}

NumaRequest auto_request(const TempDir& root, const std::string& bus_id) {
  return {.kind = NumaRequest::Kind::kAuto, .gpu_pci_bus_id = bus_id, .sysfs_root = root.path()};
}

NumaRequest node_request(const std::string& root, int node) {
  return {.kind = NumaRequest::Kind::kNode, .node = node, .sysfs_root = root};
}

const std::vector<unsigned> kFourCpus = {0, 1, 2, 3};

// /proc/self/task/<tid>/<file>, or "" when the thread has ended.
std::string task_file(const std::string& tid, const std::string& file) {
  std::ifstream in("/proc/self/task/" + tid + "/" + file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value of "<key>:" in a /proc status file.
std::string status_value(const std::string& status, const std::string& key) {
  std::istringstream lines(status);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(key + ":")) {
      const size_t value = line.find_first_not_of(" \t", key.size() + 1);
      return value == std::string::npos ? "" : line.substr(value);
    }
  }
  return "";
}

// Cpus_allowed_list of every thread of this process whose name starts with `prefix`, by
// "name (tid)". Threads that end while they are looked at are left out.
std::map<std::string, std::string> cpus_of_threads(const std::string& prefix) {
  std::map<std::string, std::string> cpus;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    const std::string tid = entry.path().filename().string();
    std::string name = task_file(tid, "comm");
    if (!name.empty() && name.back() == '\n') name.pop_back();
    if (!name.starts_with(prefix)) continue;
    const std::string list = status_value(task_file(tid, "status"), "Cpus_allowed_list");
    if (!list.empty()) cpus[name + " (" + tid + ")"] = list;
  }
  return cpus;
}

// How many of `threads` are the loader's workers: their names, each once. A thread a worker has
// just started (a block reader) bears that worker's name until it names itself.
size_t workers_among(const std::map<std::string, std::string>& threads) {
  std::set<std::string> workers;
  for (const auto& [thread, cpus] : threads) {
    if (thread.starts_with("zw-loader-")) workers.insert(thread.substr(0, thread.find(' ')));
  }
  return workers.size();
}

std::string own_cpus() {
  return status_value(testing::read_file("/proc/thread-self/status"), "Cpus_allowed_list");
}

// The memory policy /proc/self/numa_maps shows for the mapping holding `address` ("default",
// "bind:0", ...); "" when numa_maps does not exist (a kernel without NUMA).
std::string policy_at(const void* address) {
  std::ifstream maps("/proc/self/numa_maps");
  const auto wanted = reinterpret_cast<uintptr_t>(address);
  uintptr_t best = 0;
  std::string policy;
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string start, line_policy;
    fields >> start >> line_policy;
    const uintptr_t begin = std::strtoull(start.c_str(), nullptr, 16);
    // Mappings are listed in address order: the last that starts at or below holds it.
    if (begin <= wanted && begin >= best) {
      best = begin;
      policy = line_policy;
    }
  }
  return policy;
}

// What a freshly allocated buffer of this process gets: the policy an unbound loader keeps.
std::string unbound_policy() {
  internal::AlignedBuffer buffer;
  EXPECT_TRUE(buffer.reserve(4 << 20, 4 << 20, false).is_ok());
  return policy_at(buffer.data());
}

// A sysfs fixture whose node 0 lists only the last CPU this process may use, or "" (with the
// reason in *why) when that would not be narrower than the process's CPUs.
std::string one_cpu_node0(const TempDir& root, std::string* why) {
  const std::vector<unsigned> allowed = internal::allowed_cpus();
  if (allowed.size() < 2) {
    *why = "needs a process allowed on at least 2 CPUs (has " +
           internal::format_cpu_list(allowed) + ")";
    return "";
  }
  const std::string cpu = std::to_string(allowed.back());
  testing::write_file(root / "sys/devices/system/node/node0/cpulist", cpu + "\n");
  return cpu;
}

// Records the name and CPUs of every thread that reads the dataset.
struct ReadThreads {
  std::mutex mutex;
  std::set<std::string> seen;  // "name: CPU list"
};

// Shards of samples with an 8 KiB "bin" field: a batch of 32 has a 256 KiB raw column, which
// stays a view of the batch arena (kOwnedColumnMaxBytes). With `threads`, the dataset is read
// through a FaultStore that injects nothing: its rule, run on each reading thread, only notes the
// thread's name and CPUs.
std::shared_ptr<Dataset> write_dataset(const TempDir& dir,
                                       std::shared_ptr<ReadThreads> threads = nullptr) {
  uint64_t g = 0;
  for (int s = 0; s < 4; ++s) {
    auto writer = ShardWriter::create(dir / ("shard-" + std::to_string(s) + ".zws"),
                                      {.sync = false});
    EXPECT_TRUE(writer.is_ok()) << writer.status().to_string();
    for (int i = 0; i < 64; ++i, ++g) {
      const std::string bin = testing::random_bytes(8192, g);
      const std::vector<FieldData> fields = {{"bin", std::as_bytes(std::span(bin))}};
      EXPECT_TRUE(writer.value().add_sample("s" + std::to_string(g), fields).is_ok());
    }
    EXPECT_TRUE(writer.value().finish().is_ok());
  }
  DatasetOptions options;
  if (threads) {
    auto store = std::make_shared<FaultStore>(make_local_store(dir.path()));
    store->set_rule([threads](const StoreOperation& operation) {
      if (operation.kind != "read") return Fault{};
      char thread_name[16] = {};
      pthread_getname_np(pthread_self(), thread_name, sizeof thread_name);
      const std::string cpus = internal::format_cpu_list(internal::allowed_cpus());
      std::lock_guard<std::mutex> lock(threads->mutex);
      threads->seen.insert(std::string(thread_name) + ": " + cpus);
      return Fault{};
    });
    options.store = std::move(store);
  }
  // With a store, "" is its root: the folder of shards.
  auto dataset = Dataset::open(threads ? "" : dir.path(), options);
  EXPECT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  return dataset.value();
}

// ---------------------------------------------------------------------------------------------
// CPU lists

TEST(CpuList, ParsesAndFormatsSysfsLists) {
  auto cpus = internal::parse_cpu_list("0-3,8,10-11\n");
  ASSERT_TRUE(cpus.is_ok()) << cpus.status().to_string();
  EXPECT_EQ(*cpus, (std::vector<unsigned>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(internal::format_cpu_list(*cpus), "0-3,8,10-11");
  EXPECT_TRUE(internal::parse_cpu_list("\n")->empty());  // a node without CPUs
  for (const char* bad : {"3-1", "a", "1,", "1-", "-1", "0-3:2"}) {
    EXPECT_EQ(internal::parse_cpu_list(bad).status().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

// ---------------------------------------------------------------------------------------------
// Choosing the node

TEST(ChooseNuma, NoneChangesNothing) {
  auto placement = choose_numa_placement({}, kFourCpus);
  ASSERT_TRUE(placement.is_ok());
  EXPECT_FALSE(placement->node);
  EXPECT_TRUE(placement->cpus.empty());
  EXPECT_EQ(placement->reason, "not requested");
}

TEST(ChooseNuma, AutoTakesTheNodeTheGpuIsAttachedTo) {
  TempDir root;
  write_two_node_sysfs(root);
  auto placement = choose_numa_placement(auto_request(root, "0000:18:00.0"), kFourCpus);
  ASSERT_TRUE(placement.is_ok()) << placement.status().to_string();
  EXPECT_EQ(placement->node, 1);
  EXPECT_EQ(placement->cpus, (std::vector<unsigned>{2, 3}));
  EXPECT_EQ(placement->reason, "the GPU at 0000:18:00.0 is attached to node 1");
  // Any case (sysfs names are lower-case, CUDA's bus ids upper-case), the domain optional, the
  // allowed CPUs in any order.
  for (const char* bus_id : {"0000:AF:00.0", "af:00.0"}) {
    auto other = choose_numa_placement(auto_request(root, bus_id), {3, 2, 1, 0});
    ASSERT_TRUE(other.is_ok()) << bus_id << ": " << other.status().to_string();
    EXPECT_EQ(other->node, 1);
    EXPECT_EQ(other->cpus, (std::vector<unsigned>{2, 3}));
    EXPECT_NE(other->reason.find("0000:af:00.0"), std::string::npos) << other->reason;
  }
}

TEST(ChooseNuma, AutoNarrowsToTheCpusTheProcessMayUse) {
  TempDir root;
  write_two_node_sysfs(root);
  auto placement = choose_numa_placement(auto_request(root, "0000:18:00.0"), {0, 1, 3});
  ASSERT_TRUE(placement.is_ok());
  EXPECT_EQ(placement->cpus, (std::vector<unsigned>{3}));
  EXPECT_NE(placement->reason.find("CPUs 3 of its 2-3"), std::string::npos) << placement->reason;
}

TEST(ChooseNuma, AutoBindsNothingAndSaysWhyWhenItCannot) {
  TempDir root;
  write_two_node_sysfs(root);
  const struct {
    std::string bus_id;
    std::vector<unsigned> allowed;
    std::string reason;
  } cases[] = {
      {"", kFourCpus, "no CUDA device"},
      {"0000:3b:00.0", kFourCpus, "numa_node is -1"},
      {"0000:99:00.0", kFourCpus, "so its node is unknown"},
      {"0000:18:00.0", {0, 1}, "are all outside those this process may use (0-1)"},
  };
  for (const auto& c : cases) {
    auto placement = choose_numa_placement(auto_request(root, c.bus_id), c.allowed);
    ASSERT_TRUE(placement.is_ok()) << c.bus_id << ": " << placement.status().to_string();
    EXPECT_FALSE(placement->node) << c.bus_id;
    EXPECT_TRUE(placement->cpus.empty());
    EXPECT_NE(placement->reason.find(c.reason), std::string::npos) << placement->reason;
  }
}

TEST(ChooseNuma, AutoRefusesMalformedInput) {
  TempDir root;
  write_two_node_sysfs(root);
  auto malformed = choose_numa_placement(auto_request(root, "0000:5e:00.0"), kFourCpus);
  EXPECT_EQ(malformed.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(malformed.status().message().find("'one', not a NUMA node number"),
            std::string::npos)
      << malformed.status().to_string();
  // A bus id becomes part of a path: anything else is refused, not looked up.
  auto escape = choose_numa_placement(auto_request(root, "../../../etc/x"), kFourCpus);
  EXPECT_EQ(escape.status().code(), ErrorCode::kInvalidArgument);
}

TEST(ChooseNuma, ExplicitNodeGivesItsCpus) {
  TempDir root;
  write_two_node_sysfs(root);
  auto placement = choose_numa_placement(node_request(root.path(), 1), {1, 2});
  ASSERT_TRUE(placement.is_ok()) << placement.status().to_string();
  EXPECT_EQ(placement->node, 1);
  EXPECT_EQ(placement->cpus, (std::vector<unsigned>{2}));
  EXPECT_NE(placement->reason.find("node 1 as requested"), std::string::npos);
}

TEST(ChooseNuma, ExplicitNodeThatCannotBeHonouredIsAnErrorNamingTheNodesThatExist) {
  TempDir root;
  write_two_node_sysfs(root);
  const struct {
    int node;
    std::vector<unsigned> allowed;
    std::string message;
  } cases[] = {
      {7, kFourCpus, "NUMA node 7 does not exist; this machine has nodes 0, 1, 2"},
      {2, kFourCpus, "NUMA node 2 has no CPUs (a memory-only node); nodes with CPUs: 0, 1"},
      {1, {0, 1}, "none of NUMA node 1's CPUs (2-3) is one this process may run on (0-1)"},
      {-1, kFourCpus, "not a node number"},
  };
  for (const auto& c : cases) {
    auto placement = choose_numa_placement(node_request(root.path(), c.node), c.allowed);
    EXPECT_EQ(placement.status().code(), ErrorCode::kInvalidArgument) << c.node;
    EXPECT_NE(placement.status().message().find(c.message), std::string::npos)
        << placement.status().to_string();
  }
  TempDir bare;  // a kernel without NUMA lists no nodes at all
  auto none = choose_numa_placement(node_request(bare.path(), 0), kFourCpus);
  EXPECT_EQ(none.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("lists no NUMA nodes"), std::string::npos)
      << none.status().to_string();
}

// ---------------------------------------------------------------------------------------------
// The placement, as /proc shows it

// Loader threads run on the node's CPUs only (one CPU here, while the test's own thread keeps all
// of its CPUs), every read happens on such a thread, and the arena memory behind a batch's large
// column is bound to node 0.
TEST(LoaderNuma, PinsEveryLoaderThreadAndBindsTheArenas) {
  TempDir root, data;
  std::string why;
  const std::string cpu = one_cpu_node0(root, &why);
  if (cpu.empty()) GTEST_SKIP() << why;
  const std::string before = own_cpus();
  auto reads = std::make_shared<ReadThreads>();
  for (ShuffleMode mode : {ShuffleMode::kRandom, ShuffleMode::kBlock}) {
    SCOPED_TRACE(shuffle_mode_name(mode));
    reads->seen.clear();
    TempDir dir;
    LoaderOptions options;
    options.batch_size = 32;
    options.threads = 2;
    options.shuffle.mode = mode;
    options.shuffle.block_bytes = 64 << 10;  // several blocks a batch, from several shards
    options.shuffle.window_bytes = 1 << 20;
    options.numa = node_request(root.path(), 0);
    auto loader = Loader::create(write_dataset(dir, reads), options);
    ASSERT_TRUE(loader.is_ok()) << loader.status().to_string();
    reads->seen.clear();  // opening the dataset read indexes on this thread

    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.is_ok() && *batch != nullptr) << batch.status().to_string();
    // The two workers, alive until the loader closes, and any block reader running now.
    const std::map<std::string, std::string> threads = cpus_of_threads("zw-");
    EXPECT_EQ(workers_among(threads), 2u) << ::testing::PrintToString(threads);
    for (const auto& [thread, cpus] : threads) EXPECT_EQ(cpus, cpu) << thread;
    EXPECT_EQ(own_cpus(), before);

    const LoaderStats stats = (*loader)->stats();
    EXPECT_EQ(stats.numa.requested, NumaRequest::Kind::kNode);
    EXPECT_EQ(stats.numa.node, 0);
    EXPECT_EQ(stats.numa.cpus, cpu);
    EXPECT_NE(stats.numa.reason.find("node 0 as requested"), std::string::npos);
    if (!stats.numa.memory_bound) {
      ADD_FAILURE() << "memory not bound on this kernel: " << stats.numa.reason;
    } else {
      const BatchColumn* bin = (*batch)->column("bin");
      ASSERT_NE(bin, nullptr);
      ASSERT_EQ(bin->copy, nullptr);  // a view of the arena
      EXPECT_EQ(policy_at(bin->data), "bind:0");
    }
    // Drain the epoch so block reads on reader threads happen too, then look at who read.
    while (true) {
      auto more = (*loader)->next();
      ASSERT_TRUE(more.is_ok()) << more.status().to_string();
      if (*more == nullptr) break;
    }
    ASSERT_FALSE(reads->seen.empty());
    for (const std::string& reader : reads->seen) {
      EXPECT_TRUE(reader.starts_with("zw-")) << reader;
      EXPECT_TRUE(reader.ends_with(": " + cpu)) << reader;
    }
    if (mode == ShuffleMode::kBlock) {
      EXPECT_TRUE(reads->seen.contains("zw-block-read: " + cpu))
          << "no read ran on a block reader thread";
    }
  }
}

TEST(LoaderNuma, NoneLeavesThreadsAndMemoryAsTheyWere) {
  TempDir dir;
  LoaderOptions options;
  options.batch_size = 32;
  options.threads = 2;
  auto loader = Loader::create(write_dataset(dir), options);
  ASSERT_TRUE(loader.is_ok()) << loader.status().to_string();
  auto batch = (*loader)->next();
  ASSERT_TRUE(batch.is_ok() && *batch != nullptr) << batch.status().to_string();
  const std::map<std::string, std::string> threads = cpus_of_threads("zw-");
  EXPECT_EQ(workers_among(threads), 2u) << ::testing::PrintToString(threads);
  for (const auto& [thread, cpus] : threads) EXPECT_EQ(cpus, own_cpus()) << thread;
  const BatchColumn* bin = (*batch)->column("bin");
  ASSERT_NE(bin, nullptr);
  ASSERT_EQ(bin->copy, nullptr);
  EXPECT_EQ(policy_at(bin->data), unbound_policy());
  EXPECT_NE(policy_at(bin->data), "bind:0");
  const LoaderStats stats = (*loader)->stats();
  EXPECT_FALSE(stats.numa.node);
  EXPECT_TRUE(stats.numa.cpus.empty());
  EXPECT_FALSE(stats.numa.memory_bound);
  EXPECT_EQ(stats.numa.reason, "not requested");
}

TEST(LoaderNuma, ANodeThatDoesNotExistFailsCreation) {
  TempDir root, dir;
  write_two_node_sysfs(root);
  LoaderOptions options;
  options.batch_size = 32;
  options.numa = node_request(root.path(), 5);
  auto loader = Loader::create(write_dataset(dir), options);
  EXPECT_EQ(loader.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(loader.status().message().find("NUMA node 5 does not exist; this machine has nodes "
                                           "0, 1, 2"),
            std::string::npos)
      << loader.status().to_string();
}

// The window's blocks are bound to the node before the read that fills them touches them.
TEST(BlockWindowNuma, BindsBlockMemoryToTheNode) {
  if (!internal::check_memory_binding(0).is_ok()) {
    GTEST_SKIP() << "this kernel refuses mbind: " << internal::check_memory_binding(0).message();
  }
  TempDir dir;
  const std::string bytes = testing::random_bytes(4 << 20, 3);
  testing::write_file(dir / "shard", bytes);
  auto source = open_file_source(dir / "shard", IoBackend::kPread);
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  BlockWindow window(8 << 20, /*memory_node=*/0);
  std::vector<BlockWindow::Want> wants;
  for (uint64_t b = 0; b < 4; ++b) wants.push_back({0, b, b << 20, 1 << 20, source->get()});
  std::vector<std::shared_ptr<const WindowBlock>> held;
  uint64_t bytes_read = 0;
  ASSERT_TRUE(window.acquire(wants, Deadline::none(), &held, &bytes_read).is_ok());
  for (const auto& block : held) {
    EXPECT_EQ(policy_at(block->memory.data()), "bind:0");
    EXPECT_EQ(std::memcmp(block->memory.data(), bytes.data() + block->offset, block->length), 0);
  }
}

// A buffer bound after it was touched has its pages moved (MPOL_MF_MOVE) and bound, its bytes
// kept; memory it allocates later is bound too; a node that does not exist is an error.
TEST(AlignedBufferNuma, BindingTouchedMemoryMovesAndBindsIt) {
  if (!internal::check_memory_binding(0).is_ok()) {
    GTEST_SKIP() << "this kernel refuses mbind: " << internal::check_memory_binding(0).message();
  }
  internal::AlignedBuffer buffer;
  ASSERT_TRUE(buffer.reserve(2 << 20, 2 << 20, false).is_ok());
  std::memset(buffer.data(), 7, buffer.capacity());
  ASSERT_TRUE(buffer.bind_to_node(0).is_ok());
  EXPECT_EQ(policy_at(buffer.data()), "bind:0");
  EXPECT_EQ(static_cast<int>(buffer.data()[buffer.capacity() - 1]), 7);
  // Bound at allocation when it grows.
  ASSERT_TRUE(buffer.reserve(8 << 20, 8 << 20, false).is_ok());
  EXPECT_EQ(policy_at(buffer.data()), "bind:0");
  EXPECT_FALSE(internal::bind_memory_to_node(buffer.data(), 4096, 4095).is_ok());
}

}  // namespace
}  // namespace zerowait
