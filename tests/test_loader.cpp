// The Loader through its public API, on real shard files: determinism, rank coverage, exact
// resume (also with another world size, augmentations included), corrupt samples, the memory
// budget, decoding, reads that stall (deadline and watchdog), autotune, and shutdown with batches
// still held.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "testing/testing.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/writer.hpp"
#include "zerowait/storage/fault_store.hpp"

namespace zerowait {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

// Sample g of the test data set: "bin" starts with g as 8 bytes and has a size that varies with
// g; "cls" is g % 10 as text; "jpg" (when asked) is a small real JPEG.
std::string bin_field(uint64_t g) {
  std::string bytes(8 + (g * 7919) % 3000, '\0');
  std::memcpy(bytes.data(), &g, 8);
  for (size_t i = 8; i < bytes.size(); ++i) bytes[i] = static_cast<char>((g + i) * 31);
  return bytes;
}

// Writes shards of the given sizes into `dir`; global index g = position across shards.
void write_dataset(const std::string& dir, const std::vector<uint64_t>& shard_sizes,
                   bool with_jpeg = false) {
  uint64_t g = 0;
  for (size_t s = 0; s < shard_sizes.size(); ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "/shard-%03zu.zws", s);
    auto writer = ShardWriter::create(dir + name, {.sync = false});
    ASSERT_TRUE(writer.is_ok()) << writer.status().to_string();
    for (uint64_t i = 0; i < shard_sizes[s]; ++i, ++g) {
      const std::string bin = bin_field(g);
      const std::string cls = std::to_string(g % 10);
      const std::string jpg = with_jpeg ? testing::make_jpeg(40 + int(g % 30), 30, g) : "";
      std::vector<FieldData> fields = {{"bin", std::as_bytes(std::span(bin))},
                                       {"cls", std::as_bytes(std::span(cls))}};
      if (with_jpeg) fields.push_back({"jpg", std::as_bytes(std::span(jpg))});
      char key[32];
      std::snprintf(key, sizeof key, "sample-%06lu", static_cast<unsigned long>(g));
      ASSERT_TRUE(writer.value().add_sample(key, fields).is_ok());
    }
    ASSERT_TRUE(writer.value().finish().is_ok());
  }
}

struct ReadFaults;
// A FaultStore over the local folder holding `dir`, applying `faults` to every read.
std::shared_ptr<FaultStore> through(std::shared_ptr<ReadFaults> faults, const fs::path& dir);

// A loader over the dataset at `dir`, read through `faults` when given.
std::unique_ptr<Loader> make_loader(const std::string& dir, LoaderOptions options,
                                    std::shared_ptr<ReadFaults> faults = nullptr) {
  auto dataset = faults ? Dataset::open(fs::path(dir).filename(),
                                        {.backend = options.io, .store = through(faults, dir)})
                        : Dataset::open(dir, {.backend = options.io});
  EXPECT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  auto loader = Loader::create(dataset.value(), std::move(options));
  EXPECT_TRUE(loader.is_ok()) << loader.status().to_string();
  return std::move(loader).value();
}

std::vector<int64_t> int_column(const Batch& batch, const std::string& name) {
  const BatchColumn* c = batch.column(name);
  EXPECT_NE(c, nullptr) << name;
  std::vector<int64_t> values(c->shape[0]);
  std::memcpy(values.data(), c->data, c->bytes);
  return values;
}

// Takes every batch of one epoch; checks each sample's bytes against its index on the way.
std::vector<std::vector<int64_t>> epoch_indices(Loader& loader) {
  std::vector<std::vector<int64_t>> batches;
  for (;;) {
    auto next = loader.next();
    EXPECT_TRUE(next.is_ok()) << next.status().to_string();
    if (!next.is_ok() || next.value() == nullptr) break;
    const Batch& batch = *next.value();
    std::vector<int64_t> indices = int_column(batch, "__index__");
    const std::vector<int64_t> offsets = int_column(batch, "bin.offsets");
    const BatchColumn* bin = batch.column("bin");
    EXPECT_EQ(offsets.size(), indices.size() + 1);
    for (size_t i = 0; i < indices.size(); ++i) {
      const std::string expected = bin_field(indices[i]);
      const std::string got(reinterpret_cast<const char*>(bin->data) + offsets[i],
                            offsets[i + 1] - offsets[i]);
      EXPECT_EQ(got, expected) << "sample " << indices[i];
    }
    const std::vector<int64_t> cls = int_column(batch, "cls");
    for (size_t i = 0; i < indices.size(); ++i) EXPECT_EQ(cls[i], indices[i] % 10);
    batches.push_back(std::move(indices));
  }
  return batches;
}

LoaderOptions base_options() {
  LoaderOptions o;
  o.batch_size = 16;
  o.shuffle = {ShuffleMode::kQuasiRandom, 7, 50, 2};
  o.threads = 2;
  o.prefetch = 3;
  o.memory_budget = 64 << 20;
  o.decode["cls"] = {"int", {}};
  o.fields = {"bin", "cls"};
  return o;
}

// Far more shards than the index budget holds: the dataset keeps the indexes it holds within the
// budget (plus the one shard just opened) throughout a shuffled epoch, closing and reopening
// shards as the order needs them, and every sample still arrives once with its bytes.
TEST(Loader, AnEpochOverMoreShardsThanTheIndexBudgetHoldsStaysWithinIt) {
  TempDir dir;
  write_dataset(dir.path(), std::vector<uint64_t>(60, 50));
  auto probe = Dataset::open(dir.path());
  ASSERT_TRUE(probe.is_ok());
  const uint64_t one_index = (*probe)->shard(0).value()->index().memory_bytes();
  DatasetOptions dataset_options;
  dataset_options.index_budget_bytes = 3 * one_index;
  auto dataset = Dataset::open(dir.path(), dataset_options);
  ASSERT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  EXPECT_LE((*dataset)->index_use().bytes, 3 * one_index + one_index);
  LoaderOptions options = base_options();
  options.shuffle = {ShuffleMode::kRandom, 3, 64, 256};
  auto loader = Loader::create(*dataset, options);
  ASSERT_TRUE(loader.is_ok()) << loader.status().to_string();
  std::set<int64_t> seen;
  uint64_t most = 0;
  for (;;) {
    auto next = (*loader)->next();
    ASSERT_TRUE(next.is_ok()) << next.status().to_string();
    if (*next == nullptr) break;
    for (int64_t index : int_column(**next, "__index__")) EXPECT_TRUE(seen.insert(index).second);
    most = std::max(most, (*dataset)->index_use().bytes);
  }
  EXPECT_EQ(seen.size(), 3000u);
  // Each shard's index is about the same size; at most the budget plus the one just opened.
  EXPECT_LE(most, 4 * one_index + one_index / 4) << "one index: " << one_index;
  EXPECT_LE((*dataset)->index_use().shards_open, 4u);
  EXPECT_GT((*dataset)->index_use().opens, 60u + 60u) << "shards are reopened as needed";
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { write_dataset(dir_.path(), {120, 75, 200, 1}); }  // 396 samples
  TempDir dir_;
};

TEST_F(LoaderTest, SameSeedSameBatchesWhateverTheThreads) {
  LoaderOptions one = base_options();
  one.threads = 1;
  one.prefetch = 1;
  LoaderOptions many = base_options();
  many.threads = 4;
  many.prefetch = 8;
  auto a = make_loader(dir_.path(), one);
  auto b = make_loader(dir_.path(), many);
  const auto first = epoch_indices(*a);
  EXPECT_EQ(first, epoch_indices(*b));
  EXPECT_EQ(first.size(), 25u);  // 396 / 16, rounded up
  // The next epoch is another order.
  EXPECT_EQ(a->epoch(), 1u);
  EXPECT_NE(epoch_indices(*a), first);
}

TEST_F(LoaderTest, RanksTogetherSeeEverySampleOnceWithEqualBatchCounts) {
  for (uint32_t world : {1u, 2u, 3u, 8u}) {
    std::map<int64_t, int> seen;
    std::set<size_t> counts;
    for (uint32_t rank = 0; rank < world; ++rank) {
      LoaderOptions o = base_options();
      o.rank = rank;
      o.world_size = world;
      auto loader = make_loader(dir_.path(), o);
      const auto batches = epoch_indices(*loader);
      counts.insert(batches.size());
      EXPECT_EQ(batches.size(), loader->batches_per_epoch());
      for (const auto& batch : batches) {
        for (int64_t i : batch) ++seen[i];
      }
    }
    EXPECT_EQ(counts.size(), 1u) << "world " << world;
    EXPECT_EQ(seen.size(), 396u) << "world " << world;
    for (const auto& [index, times] : seen) ASSERT_EQ(times, 1) << "world " << world;
  }
}

TEST_F(LoaderTest, ResumeAfterKBatchesYieldsExactlyTheRest) {
  auto uninterrupted = make_loader(dir_.path(), base_options());
  uninterrupted->set_epoch(3);
  const auto all = epoch_indices(*uninterrupted);

  auto first = make_loader(dir_.path(), base_options());
  first->set_epoch(3);
  for (int k = 0; k < 9; ++k) ASSERT_TRUE(first->next().is_ok());
  const LoaderState state = first->state();
  first.reset();  // mid-epoch, with batches prefetched: must stop cleanly

  auto resumed = make_loader(dir_.path(), base_options());
  ASSERT_TRUE(resumed->load_state(state).is_ok());
  const auto rest = epoch_indices(*resumed);
  EXPECT_EQ(rest, std::vector<std::vector<int64_t>>(all.begin() + 9, all.end()));
}

TEST_F(LoaderTest, ResumeWithAnotherWorldSizeSkipsAndRepeatsNothing) {
  std::map<int64_t, int> seen;
  LoaderState state;
  for (uint32_t rank = 0; rank < 2; ++rank) {  // 2 ranks take 4 batches each
    LoaderOptions o = base_options();
    o.rank = rank;
    o.world_size = 2;
    auto loader = make_loader(dir_.path(), o);
    for (int k = 0; k < 4; ++k) {
      auto batch = loader->next();
      ASSERT_TRUE(batch.is_ok());
      for (int64_t i : int_column(*batch.value(), "__index__")) ++seen[i];
    }
    state = loader->state();
  }
  EXPECT_EQ(state.position, 4u * 16 * 2);
  for (uint32_t rank = 0; rank < 3; ++rank) {  // 3 ranks with batches of 10 finish the epoch
    LoaderOptions o = base_options();
    o.rank = rank;
    o.world_size = 3;
    o.batch_size = 10;
    auto loader = make_loader(dir_.path(), o);
    ASSERT_TRUE(loader->load_state(state).is_ok());
    for (const auto& batch : epoch_indices(*loader)) {
      for (int64_t i : batch) ++seen[i];
    }
  }
  EXPECT_EQ(seen.size(), 396u);
  for (const auto& [index, times] : seen) ASSERT_EQ(times, 1) << "sample " << index;
}

TEST_F(LoaderTest, ResumeRefusesAnotherSeedOrDataset) {
  auto loader = make_loader(dir_.path(), base_options());
  LoaderState state = loader->state();
  state.seed = 8;
  const Status status = loader->load_state(state);
  EXPECT_EQ(status.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(status.message().find("seed"), std::string::npos) << status.message();
  state = loader->state();
  state.dataset_fingerprint ^= 1;
  EXPECT_EQ(loader->load_state(state).code(), ErrorCode::kInvalidArgument);
}

// Flips one byte inside sample `local` of shard-000.
void corrupt_sample(const std::string& dir, uint64_t local) {
  auto dataset = Dataset::open(dir);
  ASSERT_TRUE(dataset.is_ok());
  auto shard = dataset.value()->shard(0);
  ASSERT_TRUE(shard.is_ok());
  const uint64_t offset = shard.value()->index().samples[local].offset + 3;
  const std::string path = shard.value()->name();
  std::string bytes = testing::read_file(path);
  bytes[offset] = static_cast<char>(bytes[offset] ^ 0x5a);
  testing::write_file(path, bytes);
}

TEST_F(LoaderTest, CorruptSampleRaisesOrIsSkipped) {
  corrupt_sample(dir_.path(), 17);  // global index 17
  LoaderOptions o = base_options();
  o.shuffle.mode = ShuffleMode::kNone;  // sample 17 is in batch 1
  auto raising = make_loader(dir_.path(), o);
  ASSERT_TRUE(raising->next().is_ok());
  auto failed = raising->next();
  ASSERT_FALSE(failed.is_ok());
  EXPECT_EQ(failed.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(failed.status().message().find("sample-000017"), std::string::npos)
      << failed.status().message();
  EXPECT_NE(failed.status().message().find("shard-000.zws"), std::string::npos);
  // The loader goes on where it stopped: batch 1 comes next, without sample 17 only.
  auto rest = raising->next();
  ASSERT_TRUE(rest.is_ok()) << rest.status().to_string();
  EXPECT_EQ(rest.value()->number(), 1u);
  std::vector<int64_t> expected;
  for (int64_t i = 16; i < 32; ++i) {
    if (i != 17) expected.push_back(i);
  }
  EXPECT_EQ(int_column(*rest.value(), "__index__"), expected);
  EXPECT_EQ(epoch_indices(*raising).size(), 23u);  // batches 2..24: nothing else was lost
  EXPECT_EQ(raising->stats().skipped, 1u);

  o.on_corrupt = CorruptPolicy::kSkip;
  auto skipping = make_loader(dir_.path(), o);
  std::set<int64_t> seen;
  for (const auto& batch : epoch_indices(*skipping)) seen.insert(batch.begin(), batch.end());
  EXPECT_EQ(seen.size(), 395u);
  EXPECT_EQ(seen.count(17), 0u);
  EXPECT_EQ(skipping->stats().skipped, 1u);
}

TEST_F(LoaderTest, HoldingEveryArenaIsAnErrorNotAHang) {
  LoaderOptions o = base_options();
  auto loader = make_loader(dir_.path(), o);
  std::vector<std::shared_ptr<Batch>> held;
  Status error;
  for (int i = 0; i < 100 && error.is_ok(); ++i) {
    auto batch = loader->next();
    if (batch.is_ok()) {
      held.push_back(batch.value());
    } else {
      error = batch.status();
    }
  }
  EXPECT_EQ(error.code(), ErrorCode::kResourceExhausted) << error.to_string();
  EXPECT_NE(error.message().find("batch 0 of epoch 0 (the Batch itself)"), std::string::npos)
      << error.message();
  EXPECT_EQ(held.size(), loader->stats().arenas);
  held.clear();  // arenas return: the loader goes on
  EXPECT_TRUE(loader->next().is_ok());
  EXPECT_LE(loader->stats().arena_bytes, o.memory_budget);
}

// The arenas' first-touch faults are left to a thread of the pool's own, started with the
// workers, beside the first claims: loaders destroyed while it runs stop it (under ASan, a thread
// outliving its pool is a use after free), and a loader read at once gives the batches of one
// whose arenas were all touched first, within its memory budget.
TEST_F(LoaderTest, ArenasAreTouchedBesideTheFirstClaimsAndALoaderDestroyedMeanwhileStopsThat) {
  LoaderOptions o = base_options();
  for (int i = 0; i < 20; ++i) {
    auto loader = make_loader(dir_.path(), o);
    ASSERT_TRUE(loader->next().is_ok());
  }
  auto touched_first = make_loader(dir_.path(), o);
  auto first = touched_first->next();
  ASSERT_TRUE(first.is_ok());
  std::vector<std::vector<int64_t>> expected{int_column(*first.value(), "__index__")};
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (std::vector<int64_t>& batch : epoch_indices(*touched_first)) expected.push_back(batch);
  auto at_once = make_loader(dir_.path(), o);
  EXPECT_EQ(epoch_indices(*at_once), expected);  // each sample's bytes checked on the way
  EXPECT_LE(at_once->stats().arena_bytes, o.memory_budget);
}

// The columns a training loop keeps (labels, indices, offsets) and every column under
// kOwnedColumnMaxBytes are copies: they outlive their batch without holding its arena. Larger
// columns point into the arena, and views of them are named when every arena is held.
TEST_F(LoaderTest, SmallColumnsOutliveTheirArenaAndHeldViewsAreNamed) {
  LoaderOptions o = base_options();
  o.batch_size = 64;  // "bin" is ~1.5 KB a sample: ~96 KB a batch, over the threshold
  auto loader = make_loader(dir_.path(), o);
  const unsigned arenas = loader->stats().arenas;
  std::vector<std::shared_ptr<std::byte[]>> kept;
  std::vector<std::vector<int64_t>> seen;
  for (int k = 0; k < 3 * 7; ++k) {  // 3 epochs of 7 batches: far more than the arenas
    auto next = loader->next();
    ASSERT_TRUE(next.is_ok()) << next.status().to_string();
    if (next.value() == nullptr) continue;  // the end of an epoch
    const Batch& batch = *next.value();
    for (const char* name : {"__index__", "cls", "bin.offsets"}) {
      ASSERT_NE(batch.column(name)->copy, nullptr) << name;
      kept.push_back(batch.column(name)->copy);
    }
    const BatchColumn* bin = batch.column("bin");
    EXPECT_EQ(bin->copy == nullptr, bin->bytes >= kOwnedColumnMaxBytes) << bin->bytes;
    seen.push_back(int_column(batch, "__index__"));
  }
  ASSERT_GT(seen.size(), arenas);
  for (size_t b = 0; b < seen.size(); ++b) {  // every kept copy still reads right
    const auto* index = reinterpret_cast<const int64_t*>(kept[3 * b].get());
    const auto* cls = reinterpret_cast<const int64_t*>(kept[3 * b + 1].get());
    for (size_t i = 0; i < seen[b].size(); ++i) {
      ASSERT_EQ(index[i], seen[b][i]);
      ASSERT_EQ(cls[i], seen[b][i] % 10);
    }
  }

  std::vector<std::shared_ptr<const BatchColumn>> views;
  Status error;
  while (error.is_ok()) {
    auto next = loader->next();
    if (!next.is_ok()) {
      error = next.status();
    } else if (next.value() != nullptr && next.value()->column("bin")->copy == nullptr) {
      views.push_back(Batch::view(next.value(), 1));  // column 1 is "bin"
    }
  }
  EXPECT_EQ(error.code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(views.size(), arenas);
  EXPECT_NE(error.message().find("(columns 'bin')"), std::string::npos) << error.message();
  views.clear();
  EXPECT_TRUE(loader->next().is_ok());
}

TEST_F(LoaderTest, SetEpochKeepsAResumedPositionAndEpochsFollowEachOther) {
  auto reference = make_loader(dir_.path(), base_options());
  const auto epoch0 = epoch_indices(*reference);
  const auto epoch1 = epoch_indices(*reference);  // prepared while epoch 0 ended

  auto loader = make_loader(dir_.path(), base_options());
  for (int k = 0; k < 5; ++k) ASSERT_TRUE(loader->next().is_ok());
  const LoaderState state = loader->state();
  auto resumed = make_loader(dir_.path(), base_options());
  ASSERT_TRUE(resumed->load_state(state).is_ok());
  resumed->set_epoch(0);  // the DataLoader habit: must not rewind a resumed loader
  EXPECT_EQ(epoch_indices(*resumed),
            std::vector<std::vector<int64_t>>(epoch0.begin() + 5, epoch0.end()));
  EXPECT_EQ(resumed->epoch(), 1u);
  resumed->set_epoch(1);
  EXPECT_EQ(epoch_indices(*resumed), epoch1);
  resumed->set_epoch(0);  // another epoch: back to its start
  EXPECT_EQ(epoch_indices(*resumed), epoch0);
}

TEST_F(LoaderTest, EpochAndStateAgreeOnceTheLastBatchIsTaken) {
  auto loader = make_loader(dir_.path(), base_options());
  const uint64_t batches = loader->batches_per_epoch();
  for (uint64_t k = 0; k < batches; ++k) ASSERT_TRUE(loader->next().is_ok());
  EXPECT_EQ(loader->epoch(), 1u);
  EXPECT_EQ(loader->state().epoch, 1u);
  EXPECT_EQ(loader->state().position, 0u);
  loader->set_epoch(1);  // drops the pending end of epoch 0
  auto batch = loader->next();
  ASSERT_TRUE(batch.is_ok());
  ASSERT_NE(batch.value(), nullptr);
  EXPECT_EQ(batch.value()->epoch(), 1u);
  EXPECT_EQ(batch.value()->number(), 0u);
}

TEST_F(LoaderTest, BudgetTooSmallForTwoBatchesIsRefused) {
  LoaderOptions o = base_options();
  o.batch_size = 128;
  o.memory_budget = 64 << 10;
  auto dataset = Dataset::open(dir_.path());
  ASSERT_TRUE(dataset.is_ok());
  auto loader = Loader::create(dataset.value(), o);
  ASSERT_FALSE(loader.is_ok());
  EXPECT_EQ(loader.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(loader.status().message().find("memory_budget"), std::string::npos);
}

TEST_F(LoaderTest, BatchesOutliveTheLoader) {
  auto loader = make_loader(dir_.path(), base_options());
  auto batch = loader->next();
  ASSERT_TRUE(batch.is_ok());
  loader.reset();  // workers stop mid-epoch; the held batch's arena stays valid
  const std::vector<int64_t> indices = int_column(*batch.value(), "__index__");
  EXPECT_EQ(indices.size(), 16u);
  const std::vector<int64_t> offsets = int_column(*batch.value(), "bin.offsets");
  EXPECT_EQ(
      std::string(reinterpret_cast<const char*>(batch.value()->column("bin")->data) + offsets[0],
                  offsets[1] - offsets[0]),
      bin_field(indices[0]));
}

// poison_released_arenas: the bytes a batch delivered read as the poison pattern once the batch
// is gone (its arena back in the pool, which the loader still owns), and as the data before.
TEST_F(LoaderTest, APoisonedArenaShowsAReadAfterItsBatchWasReleased) {
  LoaderOptions o = base_options();
  o.poison_released_arenas = true;
  o.batch_size = 96;  // ~150 KB of "bin": above kOwnedColumnMaxBytes, so it stays in the arena
  auto loader = make_loader(dir_.path(), o);
  auto batch = loader->next();
  ASSERT_TRUE(batch.is_ok());
  const BatchColumn* bin = batch.value()->column("bin");
  ASSERT_EQ(bin->copy, nullptr) << "the raw column must be a view of the arena";
  const auto* data = reinterpret_cast<const unsigned char*>(bin->data);
  const uint64_t bytes = bin->bytes;
  const std::vector<int64_t> indices = int_column(*batch.value(), "__index__");
  const std::string first = bin_field(indices[0]);
  ASSERT_EQ(std::string(reinterpret_cast<const char*>(data), first.size()), first);
  // Workers stopped first: none may take the arena back and fill it with the next batch. The
  // pool (and so the arena's memory) lives on with the loader.
  loader->close();
  batch = Result<std::shared_ptr<Batch>>(std::shared_ptr<Batch>());  // releases the arena
  for (uint64_t i = 0; i < bytes; ++i) {
    ASSERT_EQ(data[i], 0xA5) << "byte " << i << " of the released arena";
  }
}

TEST_F(LoaderTest, EveryIoBackendDeliversTheSameBatches) {
  auto reference = make_loader(dir_.path(), base_options());
  const auto expected = epoch_indices(*reference);
  for (IoBackend io : {IoBackend::kMmap, IoBackend::kIoUring, IoBackend::kDirect}) {
    LoaderOptions o = base_options();
    o.io = io;
    auto loader = make_loader(dir_.path(), o);
    EXPECT_EQ(epoch_indices(*loader), expected) << io_backend_name(io);
  }
}

// shuffle "block": every sample once, the same batches whatever the threads or the I/O backend,
// exact resume, and each block read whole, once (the stats count exactly the blocks' bytes).
TEST_F(LoaderTest, BlockShuffleReadsEachBlockWholeOnceAndResumesExactly) {
  LoaderOptions o = base_options();
  o.shuffle.mode = ShuffleMode::kBlock;
  o.shuffle.block_bytes = 8 << 10;   // about 5 samples
  o.shuffle.window_bytes = 32 << 10;  // 4 blocks
  auto loader = make_loader(dir_.path(), o);
  const auto batches = epoch_indices(*loader);
  std::set<int64_t> seen;
  for (const auto& batch : batches) seen.insert(batch.begin(), batch.end());
  EXPECT_EQ(seen.size(), 396u);
  EXPECT_EQ(batches.size(), 25u);

  // The bytes of every block, as the loader cuts them.
  auto dataset = Dataset::open(dir_.path());
  ASSERT_TRUE(dataset.is_ok());
  uint64_t block_bytes = 0;
  for (size_t s = 0; s < (*dataset)->shard_count(); ++s) {
    auto shard = (*dataset)->shard(s);
    ASSERT_TRUE(shard.is_ok());
    const auto& samples = (*shard)->index().samples;
    const uint64_t per =
        samples_per_block(samples.size(), (*shard)->source().size(), o.shuffle);
    for (uint64_t first = 0; first < samples.size(); first += per) {
      const uint64_t last = std::min<uint64_t>(first + per, samples.size()) - 1;
      block_bytes += samples[last].offset + samples[last].size - samples[first].offset;
    }
  }
  EXPECT_EQ(loader->stats().bytes_read, block_bytes);

  LoaderOptions more_threads = o;
  more_threads.threads = 4;
  more_threads.prefetch = 8;
  EXPECT_EQ(epoch_indices(*make_loader(dir_.path(), more_threads)), batches);
  for (IoBackend io : {IoBackend::kMmap, IoBackend::kIoUring, IoBackend::kDirect}) {
    LoaderOptions backend = o;
    backend.io = io;
    EXPECT_EQ(epoch_indices(*make_loader(dir_.path(), backend)), batches) << io_backend_name(io);
  }

  auto first = make_loader(dir_.path(), o);
  for (int k = 0; k < 7; ++k) ASSERT_TRUE(first->next().is_ok());
  const LoaderState state = first->state();
  first.reset();
  auto resumed = make_loader(dir_.path(), o);
  ASSERT_TRUE(resumed->load_state(state).is_ok());
  EXPECT_EQ(epoch_indices(*resumed), std::vector<std::vector<int64_t>>(batches.begin() + 7,
                                                                       batches.end()));
  // Other block sizes are another order: refused, naming both.
  LoaderOptions other = o;
  other.shuffle.block_bytes = 16 << 10;
  const Status refused = make_loader(dir_.path(), other)->load_state(state);
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("block 8192 bytes"), std::string::npos) << refused.message();
}

// Blocks dealt to 2 nodes of 2 ranks each: every rank of every node gets the same number of
// batches, no sample reaches two ranks, and only the few samples the cut leaves out are missing.
TEST_F(LoaderTest, BlocksDealtToNodesGiveEveryRankEqualBatchesAndNoSampleTwice) {
  std::map<int64_t, int> seen;
  std::set<size_t> counts;
  for (uint32_t node = 0; node < 2; ++node) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      LoaderOptions o = base_options();
      o.shuffle.mode = ShuffleMode::kBlock;
      o.shuffle.block_bytes = 8 << 10;
      o.shuffle.window_bytes = 32 << 10;
      o.shuffle.nodes = 2;
      o.shuffle.node = node;
      o.rank = rank;
      o.world_size = 2;
      auto loader = make_loader(dir_.path(), o);
      const uint64_t expected = loader->batches_per_epoch();
      const auto batches = epoch_indices(*loader);
      EXPECT_EQ(batches.size(), expected);
      counts.insert(batches.size());
      for (const auto& batch : batches) {
        for (int64_t i : batch) ++seen[i];
      }
    }
  }
  EXPECT_EQ(counts.size(), 1u);
  for (const auto& [index, times] : seen) ASSERT_EQ(times, 1) << "sample " << index;
  EXPECT_GE(seen.size(), 396u - 2 * 10);  // a share is cut by at most about one block
}

TEST_F(LoaderTest, StatsCountWhatHappened) {
  auto loader = make_loader(dir_.path(), base_options());
  const auto batches = epoch_indices(*loader);
  const LoaderStats stats = loader->stats();
  EXPECT_EQ(stats.batches, batches.size());
  EXPECT_EQ(stats.samples, 396u);
  EXPECT_GT(stats.bytes_read, 396u * 8);
  EXPECT_EQ(stats.recent.size(), batches.size());
  // The totals are the sums of the steps (all of them are in `recent` here).
  double wait_s = 0, read_s = 0;
  uint64_t samples = 0;
  for (const StepStats& step : stats.recent) {
    wait_s += step.wait_s;
    read_s += step.read_s;
    samples += step.samples;
  }
  EXPECT_DOUBLE_EQ(stats.wait_s, wait_s);
  EXPECT_DOUBLE_EQ(stats.read_s, read_s);
  EXPECT_GT(stats.read_s, 0.0);
  EXPECT_EQ(samples, 396u);
  // The next epoch's first batches are prepared already; closing returns every arena.
  loader->close();
  EXPECT_EQ(loader->stats().arenas_free, stats.arenas);
}

// ---- Reads that stall ------------------------------------------------------------------------

// What a test's FaultStore does to the dataset's reads once armed: sleep before every read (a
// slow disk), or stop the next read — until its deadline passes (what the io_uring backend does:
// cancel at the deadline) or, ignoring the deadline, until released (a pread on a hung file
// system). It also notes the longest deadline any read was given.
struct ReadFaults {
  enum class Stall { kNone, kUntilDeadline, kUntilReleased };
  std::mutex mutex;
  std::condition_variable changed;
  std::chrono::milliseconds delay{0};
  Stall stall = Stall::kNone;  // applies to one read, then resets to kNone
  bool released = false;
  int stalled = 0;                               // reads stopped so far
  std::chrono::nanoseconds longest_deadline{0};  // the most time any read was given

  // The FaultStore's rule: called on the reading thread before each read of a shard.
  Fault on(const StoreOperation& operation) {
    if (operation.kind != "read") return {};
    std::unique_lock<std::mutex> lock(mutex);
    const Deadline deadline = operation.deadline;
    if (deadline.at != Clock::time_point::max()) {
      longest_deadline =
          std::max<std::chrono::nanoseconds>(longest_deadline, deadline.at - Clock::now());
    } else {
      longest_deadline = std::chrono::nanoseconds::max();
    }
    if (delay.count() > 0) {
      lock.unlock();
      std::this_thread::sleep_for(delay);
      return {};
    }
    const Stall mode = std::exchange(stall, Stall::kNone);
    if (mode == Stall::kNone) return {};
    ++stalled;
    if (mode == Stall::kUntilDeadline) return {Fault::Kind::kStall};  // the store holds it
    changed.wait(lock, [&] { return released; });
    return {};
  }
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
    changed.notify_all();
  }
};

std::shared_ptr<FaultStore> through(std::shared_ptr<ReadFaults> faults, const fs::path& dir) {
  auto store = std::make_shared<FaultStore>(make_local_store(dir.parent_path()));
  store->set_rule([faults](const StoreOperation& operation) { return faults->on(operation); });
  return store;
}

// Every batch of the epoch that comes back; errors are collected, not fatal.
struct EpochOutcome {
  std::map<int64_t, int> seen;  // sample -> times delivered
  std::vector<Status> errors;
};

EpochOutcome drain_epoch(Loader& loader) {
  EpochOutcome out;
  const uint64_t batches = loader.remaining_batches();
  for (uint64_t calls = 0; calls < batches + 10; ++calls) {
    auto next = loader.next();
    if (!next.is_ok()) {
      out.errors.push_back(next.status());
      continue;
    }
    if (next.value() == nullptr) break;
    for (int64_t i : int_column(*next.value(), "__index__")) ++out.seen[i];
  }
  return out;
}

// Each batch's reads run under a deadline of read_timeout: a read that passes it fails that
// batch with kDeadlineExceeded naming the file and offset, and the next call returns the
// following batch. Only the failed batch's samples are missing from the epoch.
TEST_F(LoaderTest, AReadPastItsDeadlineFailsOneBatchAndTheNextGoesOn) {
  auto faults = std::make_shared<ReadFaults>();
  LoaderOptions o = base_options();
  o.shuffle.mode = ShuffleMode::kNone;
  o.read_timeout = std::chrono::milliseconds(300);
  auto loader = make_loader(dir_.path(), o, faults);
  {
    std::lock_guard<std::mutex> lock(faults->mutex);
    faults->stall = ReadFaults::Stall::kUntilDeadline;
    faults->longest_deadline = {};
  }
  const EpochOutcome epoch = drain_epoch(*loader);
  ASSERT_EQ(epoch.errors.size(), 1u);
  const Status& error = epoch.errors[0];
  EXPECT_EQ(error.code(), ErrorCode::kDeadlineExceeded) << error.to_string();
  EXPECT_NE(error.message().find("shard-00"), std::string::npos) << error.to_string();
  EXPECT_NE(error.message().find("offset"), std::string::npos) << error.to_string();
  // One batch of 16 lost, every other sample delivered once.
  EXPECT_EQ(epoch.seen.size(), 396u - 16u);
  for (const auto& [index, times] : epoch.seen) ASSERT_EQ(times, 1) << "sample " << index;
  std::lock_guard<std::mutex> lock(faults->mutex);
  EXPECT_EQ(faults->stalled, 1);
  EXPECT_GT(faults->longest_deadline.count(), 0);
  EXPECT_LE(faults->longest_deadline, o.read_timeout);  // never an unbounded read
}

// A read that ignores its deadline (a hung file system) cannot be interrupted; the watchdog
// reports it from next() after read_timeout + 5 s, naming the file and offset the worker is
// blocked on, and loses nothing by itself. When the read comes back, its deadline has long
// passed: that batch fails as any late read does, and every other batch of the epoch arrives.
TEST_F(LoaderTest, AHungReadIsNamedByTheWatchdogAndNothingIsLost) {
  auto faults = std::make_shared<ReadFaults>();
  LoaderOptions o = base_options();
  o.read_timeout = std::chrono::milliseconds(100);
  auto loader = make_loader(dir_.path(), o, faults);
  {
    std::lock_guard<std::mutex> lock(faults->mutex);
    faults->stall = ReadFaults::Stall::kUntilReleased;
  }
  Status error;
  std::map<int64_t, int> seen;
  while (error.is_ok()) {  // until the batch behind the hung read is the one asked for
    auto next = loader->next();
    if (!next.is_ok()) {
      error = next.status();
      break;
    }
    ASSERT_NE(next.value(), nullptr) << "the epoch ended without meeting the hung read";
    for (int64_t i : int_column(*next.value(), "__index__")) ++seen[i];
  }
  EXPECT_EQ(error.code(), ErrorCode::kDeadlineExceeded) << error.to_string();
  EXPECT_NE(error.message().find("is blocked reading '"), std::string::npos) << error.to_string();
  EXPECT_NE(error.message().find("shard-00"), std::string::npos) << error.to_string();
  EXPECT_NE(error.message().find("at offset"), std::string::npos) << error.to_string();
  faults->release();
  const EpochOutcome rest = drain_epoch(*loader);
  ASSERT_EQ(rest.errors.size(), 1u);
  EXPECT_EQ(rest.errors[0].code(), ErrorCode::kDeadlineExceeded) << rest.errors[0].to_string();
  EXPECT_NE(rest.errors[0].message().find("shard-00"), std::string::npos);
  for (const auto& [index, times] : rest.seen) seen[index] += times;
  EXPECT_EQ(seen.size(), 396u - 16u);  // the late batch, and only it
  for (const auto& [index, times] : seen) ASSERT_EQ(times, 1) << "sample " << index;
}

// next() with a timeout never blocks past it: with every read slowed, the first call gives up
// at its deadline naming what the workers are doing, and the batch is not lost — later calls
// deliver the whole epoch, each sample once.
TEST_F(LoaderTest, NextWithATimeoutReturnsByItAndLosesNothing) {
  auto faults = std::make_shared<ReadFaults>();
  auto loader = make_loader(dir_.path(), base_options(), faults);
  {
    std::lock_guard<std::mutex> lock(faults->mutex);
    faults->delay = std::chrono::milliseconds(400);
  }
  auto first = loader->next(Deadline::after(std::chrono::milliseconds(50)));
  ASSERT_FALSE(first.is_ok());
  EXPECT_EQ(first.status().code(), ErrorCode::kDeadlineExceeded) << first.status().to_string();
  EXPECT_NE(first.status().message().find("timeout given to next()"), std::string::npos)
      << first.status().to_string();
  // An error, not the batch: the call did not wait for the 400 ms read.
  {
    std::lock_guard<std::mutex> lock(faults->mutex);
    faults->delay = std::chrono::milliseconds(0);
  }
  const EpochOutcome rest = drain_epoch(*loader);
  EXPECT_TRUE(rest.errors.empty()) << rest.errors[0].to_string();
  EXPECT_EQ(rest.seen.size(), 396u);
  for (const auto& [index, times] : rest.seen) ASSERT_EQ(times, 1) << "sample " << index;
}

// ---- Autotune --------------------------------------------------------------------------------

// Reads that take 2 ms each keep a consumer that does nothing waiting on every batch: autotune
// must raise its prefetch from the small start (it starts at the thread count) — and the batches
// stay exactly those of a loader without autotune.
TEST_F(LoaderTest, AutotuneRaisesPrefetchWhileTheConsumerWaitsAndKeepsTheBatches) {
  LoaderOptions plain_options = base_options();
  plain_options.batch_size = 4;
  auto plain = make_loader(dir_.path(), plain_options);
  const auto expected = epoch_indices(*plain);

  auto faults = std::make_shared<ReadFaults>();
  LoaderOptions o = plain_options;
  o.autotune = true;
  o.prefetch = 8;
  auto tuned = make_loader(dir_.path(), o, faults);
  {
    std::lock_guard<std::mutex> lock(faults->mutex);
    faults->delay = std::chrono::milliseconds(2);
  }
  auto first = tuned->next();
  ASSERT_TRUE(first.is_ok());
  const unsigned start_prefetch = tuned->stats().prefetch;
  EXPECT_EQ(start_prefetch, 2u);  // min(prefetch, threads)
  std::vector<std::vector<int64_t>> got = {int_column(*first.value(), "__index__")};
  first.value().reset();
  for (auto& batch : epoch_indices(*tuned)) got.push_back(std::move(batch));
  EXPECT_EQ(got, expected);
  const LoaderStats stats = tuned->stats();
  EXPECT_GT(stats.wait_s, 0.0);
  EXPECT_GT(stats.prefetch, start_prefetch) << "99 batches, a look every 32, all of them waited";
  EXPECT_LE(stats.prefetch, stats.arenas - 2);
}

TEST(LoaderImages, DecodesJpegsToFixedSizeDeterministically) {
  TempDir dir;
  write_dataset(dir.path(), {40, 25}, /*with_jpeg=*/true);
  LoaderOptions o = base_options();
  o.fields = {"jpg", "cls"};
  ImageTransform transform;
  transform.size = 24;
  transform.random_flip = true;
  o.decode["jpg"] = {"image", transform};
  o.keys = true;
  auto run = [&] {
    auto loader = make_loader(dir.path(), o);
    std::vector<std::string> pixels;
    for (;;) {
      auto batch = loader->next();
      EXPECT_TRUE(batch.is_ok()) << batch.status().to_string();
      if (!batch.is_ok() || batch.value() == nullptr) break;
      const BatchColumn* jpg = batch.value()->column("jpg");
      EXPECT_EQ(jpg->shape, (std::vector<int64_t>{int64_t(batch.value()->samples()), 24, 24, 3}));
      EXPECT_EQ(batch.value()->keys().size(), batch.value()->samples());
      pixels.emplace_back(reinterpret_cast<const char*>(jpg->data), jpg->bytes);
    }
    return pixels;
  };
  const auto first = run();
  EXPECT_EQ(first.size(), 5u);  // 65 samples in batches of 16
  EXPECT_EQ(first, run());
}

// Augmentations are drawn from (seed, epoch, sample), not from the rank or the batch: a job
// resumed with another world size and batch size gets, sample for sample, the same crops and
// flips as one that never stopped.
TEST(LoaderImages, AugmentedPixelsSurviveAResumeWithAnotherWorldSize) {
  TempDir dir;
  write_dataset(dir.path(), {40, 25}, /*with_jpeg=*/true);
  LoaderOptions o = base_options();
  o.batch_size = 8;
  o.fields = {"jpg", "cls"};
  ImageTransform transform;
  transform.size = 24;
  transform.scale_min = 0.3;
  transform.random_flip = true;
  o.decode["jpg"] = {"image", transform};
  std::map<int64_t, std::string> pixels_of;  // sample -> its pixels
  auto take = [&](Loader& loader, uint64_t max_batches, std::map<int64_t, std::string>& into) {
    for (uint64_t b = 0; b < max_batches; ++b) {
      auto batch = loader.next();
      ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
      if (batch.value() == nullptr) return;
      const BatchColumn* jpg = batch.value()->column("jpg");
      const std::vector<int64_t> indices = int_column(*batch.value(), "__index__");
      const uint64_t per_image = jpg->bytes / indices.size();
      for (size_t i = 0; i < indices.size(); ++i) {
        into[indices[i]].assign(reinterpret_cast<const char*>(jpg->data) + i * per_image,
                                per_image);
      }
    }
  };
  take(*make_loader(dir.path(), o), UINT64_MAX, pixels_of);
  ASSERT_EQ(pixels_of.size(), 65u);

  std::map<int64_t, std::string> resumed;
  LoaderState state;
  for (uint32_t rank = 0; rank < 2; ++rank) {  // 2 ranks take 2 batches of 8 each
    LoaderOptions ranked = o;
    ranked.rank = rank;
    ranked.world_size = 2;
    auto loader = make_loader(dir.path(), ranked);
    take(*loader, 2, resumed);
    state = loader->state();
  }
  for (uint32_t rank = 0; rank < 3; ++rank) {  // 3 ranks with batches of 5 finish the epoch
    LoaderOptions ranked = o;
    ranked.rank = rank;
    ranked.world_size = 3;
    ranked.batch_size = 5;
    auto loader = make_loader(dir.path(), ranked);
    ASSERT_TRUE(loader->load_state(state).is_ok());
    take(*loader, UINT64_MAX, resumed);
  }
  ASSERT_EQ(resumed.size(), 65u);
  for (const auto& [index, pixels] : pixels_of) {
    ASSERT_EQ(resumed[index], pixels) << "sample " << index;
  }
  // And the augmentation is real: the next epoch crops the same samples differently.
  LoaderOptions next_epoch = o;
  next_epoch.epoch = 1;
  std::map<int64_t, std::string> epoch1;
  take(*make_loader(dir.path(), next_epoch), UINT64_MAX, epoch1);
  size_t changed = 0;
  for (const auto& [index, pixels] : pixels_of) changed += epoch1[index] != pixels;
  EXPECT_GT(changed, 50u);
}

TEST(LoaderImages, UndecodableJpegIsSkippedOrRaised) {
  TempDir dir;
  {
    auto writer = ShardWriter::create(dir / "s.zws", {.sync = false});
    ASSERT_TRUE(writer.is_ok());
    for (int i = 0; i < 10; ++i) {
      const std::string jpg =
          i == 4 ? std::string("\xff\xd8\xff garbage", 12) : testing::make_jpeg(32, 32, i);
      FieldData field{"jpg", std::as_bytes(std::span(jpg))};
      ASSERT_TRUE(writer.value().add_sample("k" + std::to_string(i), {&field, 1}).is_ok());
    }
    ASSERT_TRUE(writer.value().finish().is_ok());
  }
  LoaderOptions o;
  o.batch_size = 10;
  o.shuffle.mode = ShuffleMode::kNone;
  ImageTransform transform;
  transform.size = 16;
  o.decode["jpg"] = {"image", transform};
  auto raising = make_loader(dir.path(), o);
  auto batch = raising->next();
  ASSERT_FALSE(batch.is_ok());
  EXPECT_EQ(batch.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(batch.status().message().find("'k4'"), std::string::npos) << batch.status().message();
  const std::vector<int64_t> all_but_4 = {0, 1, 2, 3, 5, 6, 7, 8, 9};
  batch = raising->next();  // after the error: the same batch without the bad sample
  ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
  EXPECT_EQ(int_column(*batch.value(), "__index__"), all_but_4);

  o.on_corrupt = CorruptPolicy::kSkip;
  auto skipping = make_loader(dir.path(), o);
  batch = skipping->next();
  ASSERT_TRUE(batch.is_ok());
  EXPECT_EQ(batch.value()->samples(), 9u);
  EXPECT_EQ(int_column(*batch.value(), "__index__"), all_but_4);
}

}  // namespace
}  // namespace zerowait
