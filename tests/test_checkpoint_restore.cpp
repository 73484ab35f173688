// The read side of checkpoints through the storage-target seam: a checkpoint written to a local
// directory is restored, verified and mirrored through a target with no local path; every kind
// of failing read (EIO, a short read, a stall, a flipped byte) is reported naming the file and
// offset, within its deadline; and restore_newest() falls back from a damaged, missing or
// stalled copy to the mirror's copy, then to older steps.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include "checkpoint/checkpoint_io.hpp"
#include "host/cuda_runtime.hpp"
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

using testing::read_all;
using testing::save_and_wait;
using testing::TempDir;
using testing::TrainingState;

bool mentions(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Saves `state` as steps 1 and 2 (several files, one tensor larger than a read piece) into
// `dir`, with or without compression; the state holds step 2's values afterwards.
void save_two_steps(const std::string& dir, TrainingState& state, bool compressed) {
  CheckpointOptions options;
  options.max_file_bytes = 1 << 20;
  options.compression = compressed ? Compression::kZstd : Compression::kNone;
  auto cp = testing::open_or_die(make_local_store(dir), options);
  state.fill_all(1);
  save_and_wait(*cp, state.request(1));
  state.fill_all(2);
  save_and_wait(*cp, state.request(2));
  ASSERT_TRUE(cp->wait_all().is_ok());
}

TEST(CheckpointRestore, RestoresVerifiesAndMirrorsThroughATargetWithNoLocalPath) {
  for (bool compressed : {false, true}) {
    SCOPED_TRACE(compressed ? "zstd" : "uncompressed");
    TempDir dir;
    TrainingState state = TrainingState::make({0, 3, 1000, 300000, 5 << 20});
    save_two_steps(dir.path(), state, compressed);

    // The directory's bytes, on a target that has nothing but the Store interface.
    auto memory = testing::fresh_memory_store("primary");
    testing::copy_directory_into(dir.path(), *memory);
    ASSERT_EQ(list_steps(*memory).value(), (std::vector<uint64_t>{1, 2}));
    for (bool direct : {true, false}) {
      EXPECT_EQ(read_all(*memory, 2, 0, RestoreOptions{0, direct, true}), state.values);
    }
    auto report = verify_step(*memory, 2);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    EXPECT_TRUE(report.value().problems.empty()) << report.value().problems[0];
    EXPECT_EQ(report.value().tensors, state.values.size());
    EXPECT_GT(report.value().files, 1u);

    // Mirrored from memory into another memory target and into a local directory: both read
    // back tensor for tensor and verify.
    auto memory_mirror = testing::fresh_memory_store("mirror");
    TempDir mirror_dir;
    auto local_mirror = make_local_store(mirror_dir.path());
    for (Store* mirror : {memory_mirror.get(), local_mirror.get()}) {
      SCOPED_TRACE(mirror->describe());
      ASSERT_TRUE(internal::mirror_step(*memory, *mirror, 2, kDefaultWriteTimeout).is_ok());
      EXPECT_EQ(list_steps(*mirror).value(), std::vector<uint64_t>{2});
      EXPECT_EQ(read_all(*mirror, 2), state.values);
      EXPECT_TRUE(verify_step(*mirror, 2).value().problems.empty());
    }
  }
}

TEST(CheckpointRestore, ACheckpointerMirrorsIntoATargetWithNoLocalPath) {
  TempDir dir;
  auto mirror = testing::fresh_memory_store("mirror");
  CheckpointOptions options;
  options.mirror = mirror;
  options.incremental = true;
  auto cp = testing::open_or_die(make_local_store(dir.path()), options);
  TrainingState state = TrainingState::make({1000, 2000, 3000});
  for (uint64_t step = 1; step <= 3; ++step) {
    state.fill(step % 3, step);
    save_and_wait(*cp, state.request(step));
  }
  ASSERT_TRUE(cp->wait_all().is_ok());
  EXPECT_EQ(list_steps(*mirror).value(), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(read_all(*mirror, 3), state.values);
  EXPECT_TRUE(verify_step(*mirror, 3).value().problems.empty());
}

// The path of restores to the GPU with memcpy as its last step (kHostThroughStaging): batches of
// tensors read into the staging pool and copied out, the two halves of the pool alternating, a
// tensor larger than a batch in a batch of its own; checksums checked in staging, so a damaged
// tensor is named; host and staged reads mixed in one call.
TEST(CheckpointRestore, ReadsThroughStagingInBatchesAndVerifiesThere) {
  TempDir dir;
  TrainingState state = TrainingState::make({0, 3, 1000, 300000, 5 << 20, 7, 20000, 1});
  save_two_steps(dir.path(), state, /*compressed=*/false);
  auto target = make_local_store(dir.path());
  const RankManifest manifest = read_rank_manifest(*target, 2, 0).value();
  for (uint64_t batch_bytes : {uint64_t{64} << 10, uint64_t{1} << 20, uint64_t{512} << 20}) {
    for (bool direct : {true, false}) {
      SCOPED_TRACE("batch " + std::to_string(batch_bytes) + (direct ? " O_DIRECT" : ""));
      std::vector<std::vector<float>> out;
      std::vector<TensorRead> reads;
      for (const StoredTensor& t : manifest.tensors) out.emplace_back(t.nbytes / sizeof(float));
      for (size_t i = 0; i < out.size(); ++i) {
        // Every other tensor straight into host memory, the rest through staging.
        const int device = i % 2 == 0 ? kHostThroughStaging : kHostMemory;
        reads.push_back({i, reinterpret_cast<std::byte*>(out[i].data()), false, device});
      }
      RestoreOptions options{0, direct, true};
      options.staging_batch_bytes = batch_bytes;
      Status s = read_tensors(*target, manifest, reads, options);
      ASSERT_TRUE(s.is_ok()) << s.to_string();
      for (size_t i = 0; i < out.size(); ++i) {
        // TrainingState's names follow the tensor order, and so does the manifest.
        EXPECT_EQ(out[i], state.values[i]) << manifest.tensors[i].name;
      }
    }
  }
  // One flipped byte in the largest tensor: named, with its file, when read through staging.
  const StoredTensor& largest = manifest.tensors[4];
  const std::string file = dir.path() + "/" + largest.file;
  std::string bytes = testing::read_file(file);
  bytes[largest.offset + largest.nbytes / 3] ^= 0x10;
  testing::write_file(file, bytes);
  std::vector<float> out(largest.nbytes / sizeof(float));
  TensorRead read{4, reinterpret_cast<std::byte*>(out.data()), false, kHostThroughStaging};
  RestoreOptions options;
  options.staging_batch_bytes = 1 << 20;
  Status s = read_tensors(*target, manifest, std::span(&read, 1), options);
  ASSERT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  EXPECT_TRUE(mentions(s.message(), largest.name)) << s.message();
  EXPECT_TRUE(mentions(s.message(), largest.file)) << s.message();
}

// Reads marked `mapped` point into private mappings of the files themselves (what
// load(mmap=True) makes): nothing is read, each tensor is verified where it is, a changed byte
// there is named, and a compressed tensor cannot be read so. Only the local store offers its
// files for mapping; a fault-injecting store in front of it does not.
TEST(CheckpointRestore, MappedTensorsAreVerifiedInPlace) {
  TempDir dir;
  TrainingState state = TrainingState::make({3, 1000, 300000, 5 << 20});
  save_two_steps(dir.path(), state, /*compressed=*/false);
  auto target = make_local_store(dir.path());
  EXPECT_FALSE(target->local_file("../step-2").has_value());  // inside the root only
  FaultStore faulty(target);
  EXPECT_FALSE(faulty.local_file("step-2").has_value());
  EXPECT_FALSE(testing::fresh_memory_store("m")->local_file("step-2").has_value());
  const RankManifest manifest = read_rank_manifest(*target, 2, 0).value();

  std::vector<std::pair<std::byte*, size_t>> mappings;
  std::vector<TensorRead> reads;
  for (size_t i = 0; i < manifest.tensors.size(); ++i) {
    const StoredTensor& t = manifest.tensors[i];
    const std::optional<std::string> path = target->local_file(t.file);
    ASSERT_TRUE(path.has_value());
    EXPECT_EQ(*path, dir / t.file);
    const int fd = ::open(path->c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << *path;
    const size_t size = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
    void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    ::close(fd);
    ASSERT_NE(map, MAP_FAILED);
    mappings.emplace_back(static_cast<std::byte*>(map), size);
    TensorRead read{i, static_cast<std::byte*>(map) + t.offset};
    read.mapped = true;
    reads.push_back(read);
  }
  Status s = read_tensors(*target, manifest, reads);
  EXPECT_TRUE(s.is_ok()) << s.to_string();

  // One byte of the largest tensor changed in its (private) mapping: named, file and tensor.
  const size_t largest = 3;
  ASSERT_EQ(manifest.tensors[largest].nbytes, (5u << 20) * sizeof(float));
  reads[largest].dst[12345] ^= std::byte{0x40};
  s = read_tensors(*target, manifest, reads);
  EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  EXPECT_TRUE(mentions(s.message(), "tensor '" + manifest.tensors[largest].name + "'"));
  EXPECT_TRUE(mentions(s.message(), dir / manifest.tensors[largest].file)) << s.message();
  for (auto [map, size] : mappings) ::munmap(map, size);

  // A compressed tensor has no bytes in its file to verify in place.
  TempDir zdir;
  save_two_steps(zdir.path(), state, /*compressed=*/true);
  auto ztarget = make_local_store(zdir.path());
  const RankManifest zmanifest = read_rank_manifest(*ztarget, 2, 0).value();
  ASSERT_EQ(zmanifest.tensors[largest].codec, "zstd");
  std::vector<float> out(zmanifest.tensors[largest].nbytes / sizeof(float));
  TensorRead read{largest, reinterpret_cast<std::byte*>(out.data())};
  read.mapped = true;
  s = read_tensors(*ztarget, zmanifest, std::span(&read, 1));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.to_string();
}

// Without CUDA, a read into device memory is refused by name before anything is copied.
TEST(CheckpointRestore, AReadIntoDeviceMemoryWithoutCudaNamesTheTensor) {
  if (internal::cuda_runtime().ok) GTEST_SKIP() << "CUDA is present: the GPU tests cover this";
  TempDir dir;
  TrainingState state = TrainingState::make({1000});
  save_two_steps(dir.path(), state, /*compressed=*/false);
  auto target = make_local_store(dir.path());
  const RankManifest manifest = read_rank_manifest(*target, 2, 0).value();
  std::vector<float> out(1000);
  TensorRead read{0, reinterpret_cast<std::byte*>(out.data()), false, /*device=*/0};
  Status s = read_tensors(*target, manifest, std::span(&read, 1));
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  EXPECT_TRUE(mentions(s.message(), manifest.tensors[0].name)) << s.message();
  EXPECT_TRUE(mentions(s.message(), "CUDA device 0")) << s.message();
}

// A save whose staging the caller fills on a CUDA stream: without CUDA that is refused, and the
// save, dropped unstarted, gives its staging pool to the next save.
TEST(CheckpointRestore, WaitingForADeviceStreamWithoutCudaIsRefused) {
  if (internal::cuda_runtime().ok) GTEST_SKIP() << "CUDA is present: the GPU tests cover this";
  TempDir dir;
  auto cp = testing::open_or_die(make_local_store(dir.path()));
  TrainingState state = TrainingState::make({1000});
  state.fill_all(4);
  {
    auto pending = cp->begin_save(state.request(1));
    ASSERT_TRUE(pending.is_ok() && pending.value().has_value());
    Status s = pending.value()->wait_for_stream(nullptr, 0);
    EXPECT_EQ(s.code(), ErrorCode::kUnsupported) << s.to_string();
  }
  save_and_wait(*cp, state.request(2));
  EXPECT_EQ(read_all(*make_local_store(dir.path()), 2), state.values);
}

// A step saved in a local directory, read through a FaultStore whose rule faults the
// read that covers one byte of the largest tensor.
class ReadFaultTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    state_.fill_all(1);
    auto cp = testing::open_or_die(make_local_store(dir_.path()));
    save_and_wait(*cp, state_.request(1));
    faulty_ = std::make_shared<FaultStore>(make_local_store(dir_.path()));
    manifest_ = read_rank_manifest(*faulty_, 1, 0).value();
    tensor_ = manifest_.tensors[1];
    target_byte_ = tensor_.offset + tensor_.nbytes / 2;
  }

  // Faults the read of the tensor's file that covers its middle byte with `kind`; remembers the
  // offset of the faulted request.
  void inject(Fault::Kind kind) {
    faulty_->set_read_fault_rule(
        [this, kind](const std::string& path, uint64_t offset, uint64_t length) {
          if (path != tensor_.file || target_byte_ < offset || target_byte_ >= offset + length) {
            return Fault{};
          }
          faulted_offset_ = offset;
          faulted_length_ = length;
          return Fault{kind, EIO, target_byte_};
        });
  }

  // Restores every tensor with a short deadline, returning the status.
  Status restore() {
    std::vector<std::vector<float>> out;
    std::vector<TensorRead> reads;
    for (size_t i = 0; i < manifest_.tensors.size(); ++i) {
      out.emplace_back(manifest_.tensors[i].nbytes / sizeof(float));
    }
    for (size_t i = 0; i < out.size(); ++i) {
      reads.push_back({i, reinterpret_cast<std::byte*>(out[i].data())});
    }
    RestoreOptions options{0, GetParam(), true, kDeadline};
    return read_tensors(*faulty_, manifest_, reads, options);
  }

  static constexpr std::chrono::milliseconds kDeadline{300};
  TempDir dir_;
  TrainingState state_ = TrainingState::make({1000, 3 << 20, 5000});
  std::shared_ptr<FaultStore> faulty_;
  RankManifest manifest_;
  StoredTensor tensor_;
  uint64_t target_byte_ = 0;
  std::atomic<uint64_t> faulted_offset_{~0ull};
  std::atomic<uint64_t> faulted_length_{0};
};

INSTANTIATE_TEST_SUITE_P(Reads, ReadFaultTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "direct" : "page_cache"; });

TEST_P(ReadFaultTest, EveryFaultNamesTheFileAndOffsetWithinItsDeadline) {
  const std::string file = dir_ / tensor_.file;
  struct Case {
    Fault::Kind kind;
    const char* name;
    ErrorCode code;
  };
  for (const Case& c : {Case{Fault::Kind::kError, "EIO", ErrorCode::kIo},
                        Case{Fault::Kind::kShortRead, "short read", ErrorCode::kCorrupt},
                        Case{Fault::Kind::kStall, "stall", ErrorCode::kDeadlineExceeded},
                        Case{Fault::Kind::kFlipByte, "flipped byte", ErrorCode::kCorrupt}}) {
    SCOPED_TRACE(c.name);
    inject(c.kind);
    const auto start = std::chrono::steady_clock::now();
    Status s = restore();
    const auto took = std::chrono::steady_clock::now() - start;
    std::cout << "  " << c.name << " (" << (GetParam() ? "direct" : "page cache")
              << "): " << s.to_string() << "\n";
    ASSERT_EQ(s.code(), c.code) << s.to_string();
    EXPECT_TRUE(mentions(s.message(), file)) << s.message();
    ASSERT_NE(faulted_offset_.load(), ~0ull) << "the rule never matched a read";
    // A corrupt tensor is named with its own offset, a failed read with the read's, a short
    // read with where the bytes ran out (half-way through the read).
    uint64_t offset = faulted_offset_.load();
    if (c.kind == Fault::Kind::kFlipByte) offset = tensor_.offset;
    if (c.kind == Fault::Kind::kShortRead) offset += faulted_length_.load() / 2;
    EXPECT_TRUE(mentions(s.message(), "offset " + std::to_string(offset))) << s.message();
    if (c.kind == Fault::Kind::kFlipByte) {
      EXPECT_TRUE(mentions(s.message(), tensor_.name)) << s.message();
    }
    // Bounded by the restore's own deadline, not the 60 s default nor forever.
    EXPECT_LT(took, kDefaultReadTimeout / 2);
    faulted_offset_ = ~0ull;
  }
  faulty_->set_read_fault_rule(nullptr);
  EXPECT_TRUE(restore().is_ok());
}

TEST_P(ReadFaultTest, VerifyAndTheMirrorCopyReportAFailingRead) {
  inject(Fault::Kind::kError);
  auto report = verify_step(*faulty_, 1);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  ASSERT_EQ(report.value().problems.size(), 1u);
  EXPECT_TRUE(mentions(report.value().problems[0], dir_ / tensor_.file))
      << report.value().problems[0];

  inject(Fault::Kind::kFlipByte);
  auto mirror = testing::fresh_memory_store("mirror");
  Status mirrored = internal::mirror_step(*faulty_, *mirror, 1, kDefaultWriteTimeout);
  EXPECT_EQ(mirrored.code(), ErrorCode::kCorrupt) << mirrored.to_string();
  EXPECT_TRUE(mentions(mirrored.message(), dir_ / tensor_.file)) << mirrored.message();
  EXPECT_TRUE(list_steps(*mirror).value().empty()) << "a damaged copy is not mirrored";
}

TEST(CheckpointRestore, AStalledReadWithoutADeadlineEndsWhenReleased) {
  TempDir dir;
  testing::write_file(dir / "f", std::string(100, 'x'));
  FaultStore faulty(make_local_store(dir.path()));
  faulty.set_read_fault_rule(
      [](const std::string&, uint64_t, uint64_t) { return Fault{Fault::Kind::kStall}; });
  auto source = faulty.open("f", IoBackend::kPread, metadata_deadline());
  ASSERT_TRUE(source.is_ok());
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    faulty.release_stalls();
  });
  std::vector<std::byte> buffer(10);
  Status s = (*source)->read_at(20, buffer);
  release.join();
  EXPECT_EQ(s.code(), ErrorCode::kDeadlineExceeded) << s.to_string();
  EXPECT_TRUE(mentions(s.message(), dir / "f")) << s.message();
}

// Steps 1..3 of a state saved to a local directory with a mirror; step N's tensors hold version
// N. restore() runs restore_newest and reads every tensor of the copy it settles on.
class RestoreNewestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    local_ = make_local_store(local_dir_.path());
    mirror_ = make_local_store(mirror_dir_.path());
    CheckpointOptions options;
    options.mirror = mirror_;
    auto cp = testing::open_or_die(local_, options);
    for (uint64_t step = 1; step <= 3; ++step) {
      state_.fill_all(step);
      save_and_wait(*cp, state_.request(step));
    }
    ASSERT_TRUE(cp->wait_all().is_ok());
  }

  // The values step `step` was saved with.
  std::vector<std::vector<float>> saved(uint64_t step) {
    TrainingState expected = TrainingState::make({1000, 3 << 20});
    expected.fill_all(step);
    return expected.values;
  }

  // Inverts one byte of the second tensor of `step` in the tier at `dir`.
  void damage(const TempDir& dir, uint64_t step) {
    const std::string file = dir / (step_directory(step) + "/rank-00000-00000.safetensors");
    std::string bytes = testing::read_file(file);
    bytes[bytes.size() - 1000] ^= 0x20;
    testing::write_file(file, bytes);
  }

  Result<RestoredStep> restore(Store& primary, Store* mirror, RestoreNewestOptions options,
                               RestoreOptions read = {}) {
    return testing::restore_newest_into(primary, mirror, options, &restored_, read);
  }

  TempDir local_dir_;
  TempDir mirror_dir_;
  std::shared_ptr<Store> local_;
  std::shared_ptr<Store> mirror_;
  TrainingState state_ = TrainingState::make({1000, 3 << 20});
  std::vector<std::vector<float>> restored_;
};

TEST_F(RestoreNewestTest, ReadsTheNewestPrimaryCopyWhenItIsIntact) {
  auto r = restore(*local_, mirror_.get(), {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().step, 3u);
  EXPECT_EQ(r.value().tier, Tier::kPrimary);
  EXPECT_TRUE(r.value().skipped.empty());
  EXPECT_EQ(restored_, saved(3));
}

TEST_F(RestoreNewestTest, ADamagedPrimaryCopyIsReadFromTheMirrorThenAnOlderStep) {
  damage(local_dir_, 3);
  std::vector<std::string> told;
  RestoreNewestOptions options;
  options.on_skip = [&](const SkippedCopy& s, uint64_t next_step, Tier next_tier) {
    told.push_back(std::to_string(s.step) + " " + tier_name(s.tier) + " -> " +
                   std::to_string(next_step) + " " + tier_name(next_tier));
  };
  auto r = restore(*local_, mirror_.get(), options);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().step, 3u);
  EXPECT_EQ(r.value().tier, Tier::kMirror);
  EXPECT_EQ(restored_, saved(3));
  ASSERT_EQ(r.value().skipped.size(), 1u);
  const SkippedCopy& skipped = r.value().skipped[0];
  EXPECT_EQ(skipped.why.code(), ErrorCode::kCorrupt);
  EXPECT_TRUE(mentions(skipped.why.message(), local_dir_ / "step-3/rank-00000-00000.safetensors"))
      << skipped.why.message();
  EXPECT_TRUE(mentions(skipped.why.message(), "/model/layer.1.weight")) << skipped.why.message();
  EXPECT_EQ(told, std::vector<std::string>{"3 primary -> 3 mirror"});

  // Both copies of step 3 damaged: step 2's primary copy, each skip said in order.
  damage(mirror_dir_, 3);
  told.clear();
  r = restore(*local_, mirror_.get(), options);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().step, 2u);
  EXPECT_EQ(r.value().tier, Tier::kPrimary);
  EXPECT_EQ(restored_, saved(2));
  EXPECT_EQ(told, (std::vector<std::string>{"3 primary -> 3 mirror", "3 mirror -> 2 primary"}));

  // Asked for by number, or without fallback: no older step, the last copy's error.
  RestoreNewestOptions exact;
  exact.step = 3;
  r = restore(*local_, mirror_.get(), exact);
  EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  EXPECT_TRUE(mentions(r.status().message(), mirror_dir_.path())) << r.status().to_string();
  RestoreNewestOptions newest_only;
  newest_only.fallback = false;
  EXPECT_EQ(restore(*local_, mirror_.get(), newest_only).status().code(), ErrorCode::kCorrupt);
}

TEST_F(RestoreNewestTest, AStepOnlyTheMirrorHoldsIsReadThere) {
  ASSERT_TRUE(local_->remove_all("step-3", metadata_deadline()).is_ok());
  auto r = restore(*local_, mirror_.get(), {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().step, 3u);
  EXPECT_EQ(r.value().tier, Tier::kMirror);
  ASSERT_EQ(r.value().skipped.size(), 1u);
  EXPECT_FALSE(r.value().skipped[0].listed);
  EXPECT_EQ(r.value().skipped[0].why.code(), ErrorCode::kNotFound);
  EXPECT_EQ(restored_, saved(3));
  // Without a mirror the newest local step is step 2.
  r = restore(*local_, nullptr, {});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().step, 2u);
  EXPECT_TRUE(r.value().skipped.empty());
}

TEST_F(RestoreNewestTest, AStalledPrimaryReadFallsBackToTheMirrorWithinItsDeadline) {
  FaultStore stalling(local_);
  stalling.set_read_fault_rule([](const std::string& path, uint64_t, uint64_t) {
    return Fault{path.starts_with("step-3/") ? Fault::Kind::kStall : Fault::Kind::kNone};
  });
  RestoreOptions read;
  read.read_timeout = std::chrono::milliseconds(200);
  auto r = restore(stalling, mirror_.get(), {}, read);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().tier, Tier::kMirror);
  EXPECT_EQ(restored_, saved(3));
  ASSERT_EQ(r.value().skipped.size(), 1u);
  EXPECT_EQ(r.value().skipped[0].why.code(), ErrorCode::kDeadlineExceeded);
  EXPECT_TRUE(mentions(r.value().skipped[0].why.message(), local_dir_ / "step-3/"))
      << r.value().skipped[0].why.message();
}

// A mirror on a hung mount: every call on it stalls, metadata included (listing it, reading a
// commit record). The restore gives the mirror up at its metadata timeout and reads the primary.
TEST_F(RestoreNewestTest, AStalledMirrorFallsBackToThePrimaryWithinItsDeadline) {
  FaultStore hung(mirror_);
  hung.set_rule([](const StoreOperation&) { return Fault{Fault::Kind::kStall}; });
  RestoreNewestOptions options;
  options.metadata_timeout = std::chrono::milliseconds(300);
  const auto start = std::chrono::steady_clock::now();
  auto r = restore(*local_, &hung, options);
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().step, 3u);
  EXPECT_EQ(r.value().tier, Tier::kPrimary);
  EXPECT_EQ(restored_, saved(3));
  // Bounded by the timeout, not by the hung mirror (which would never answer).
  EXPECT_LT(took, options.metadata_timeout + std::chrono::seconds(1));

  // With the primary's step 3 gone the mirror is still given up, and step 2 is read.
  ASSERT_TRUE(local_->remove_all("step-3", metadata_deadline()).is_ok());
  r = restore(*local_, &hung, options);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().step, 2u);
  EXPECT_EQ(r.value().tier, Tier::kPrimary);
}

TEST_F(RestoreNewestTest, ACallerErrorIsReturnedAtOnceAndNothingIsFoundInEmptyTiers) {
  int calls = 0;
  auto r = restore_newest(*local_, mirror_.get(), {}, [&](const StepCopy&) {
    ++calls;
    return invalid_argument("tensor shapes differ from the caller's state");
  });
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(calls, 1) << "not a damaged copy: no other copy is tried";

  TempDir empty;
  auto none = make_local_store(empty.path());
  auto missing = make_local_store(empty / "no-such-mirror");
  r = restore_newest(*none, missing.get(), {}, [](const StepCopy&) { return Status::ok(); });
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(mentions(r.status().message(), "no committed checkpoint in " + empty.path()))
      << r.status().message();
}

}  // namespace
}  // namespace zerowait
