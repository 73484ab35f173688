// The device reader without a GPU: the POSIX path's planning of aligned reads and copies, its
// pipeline with destinations in host memory, the choice between cuFile and POSIX in every mode,
// and the cuFile path itself over a stand-in libcufile (tests/tools/fake_cufile.cpp). Reads into
// real GPU memory are tests/test_gpu_gds.cpp's.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/log.hpp"
#include "common/random.hpp"
#include "host/cuda_runtime.hpp"
#include "host/cufile.hpp"
#include "storage/local/device_posix_path.hpp"
#include "storage/local/device_read_plan.hpp"
#include "storage/local/file_sources.hpp"
#include "testing/testing.hpp"
#include "zerowait/storage/device_reader.hpp"

namespace zerowait {
namespace {

using testing::TempDir;

constexpr size_t kAlign = 4096;

using ::zerowait::testing::contains;

// ---- planning ----------------------------------------------------------------------------------

// Carries out `slots` over `file` the way the POSIX path does, checking the plan's promises on
// the way: aligned reads inside their slot, copies inside what their read must deliver.
void execute_plan(const std::vector<internal::BounceSlot>& slots, const std::string& file,
                  size_t slot_bytes) {
  std::vector<char> bounce(slot_bytes);
  for (const internal::BounceSlot& slot : slots) {
    ASSERT_LE(slot.bytes, slot_bytes);
    ASSERT_FALSE(slot.reads.empty());
    size_t previous_end = 0;
    for (const internal::BounceRead& read : slot.reads) {
      EXPECT_EQ(read.file_offset % kAlign, 0u);
      EXPECT_EQ(read.bounce_offset % kAlign, 0u);
      EXPECT_EQ(read.bytes % kAlign, 0u);
      EXPECT_LE(read.needed, read.bytes);
      EXPECT_LE(read.bounce_offset + read.bytes, slot.bytes);
      EXPECT_GE(read.bounce_offset, previous_end) << "reads of one slot share buffer bytes";
      previous_end = read.bounce_offset + read.bytes;
      ASSERT_LE(read.file_offset + read.needed, file.size()) << "a read needs bytes past the end";
      std::memcpy(bounce.data() + read.bounce_offset, file.data() + read.file_offset, read.needed);
    }
    for (const internal::BounceCopy& copy : slot.copies) {
      const bool inside_a_read =
          std::any_of(slot.reads.begin(), slot.reads.end(), [&](const internal::BounceRead& read) {
            return copy.bounce_offset >= read.bounce_offset &&
                   copy.bounce_offset + copy.bytes <= read.bounce_offset + read.needed;
          });
      EXPECT_TRUE(inside_a_read) << "copy at " << copy.bounce_offset << " is not read";
      std::memcpy(copy.device, bounce.data() + copy.bounce_offset, copy.bytes);
    }
  }
}

std::vector<internal::BounceSlot> plan(const std::vector<DeviceReadRequest>& requests,
                                       size_t slot_bytes) {
  return internal::plan_bounce_slots(requests, slot_bytes, kAlign);
}

TEST(BouncePlan, AnUnalignedRangeReadsTheBlocksAroundIt) {
  std::vector<char> out(5000);
  const auto slots = plan({{.offset = 4100, .size = 5000, .device = out.data()}}, 64 * kAlign);
  ASSERT_EQ(slots.size(), 1u);
  ASSERT_EQ(slots[0].reads.size(), 1u);
  EXPECT_EQ(slots[0].reads[0].file_offset, 4096u);
  EXPECT_EQ(slots[0].reads[0].bytes, 2 * kAlign);  // [4096, 12288) holds [4100, 9100)
  EXPECT_EQ(slots[0].reads[0].needed, 4u + 5000u);
  ASSERT_EQ(slots[0].copies.size(), 1u);
  EXPECT_EQ(slots[0].copies[0].bounce_offset, 4u);
  EXPECT_EQ(slots[0].copies[0].bytes, 5000u);
}

TEST(BouncePlan, ARangeLargerThanASlotContinuesInTheNext) {
  std::vector<char> out(10 * kAlign + 123);
  const auto slots = plan({{.offset = 100, .size = out.size(), .device = out.data()}}, 4 * kAlign);
  ASSERT_EQ(slots.size(), 3u);
  uint64_t copied = 0;
  for (const auto& slot : slots) {
    for (const auto& copy : slot.copies) {
      EXPECT_EQ(copy.device, reinterpret_cast<std::byte*>(out.data()) + copied);
      copied += copy.bytes;
    }
  }
  EXPECT_EQ(copied, out.size());
}

TEST(BouncePlan, NeighbouringRangesShareOneReadInFileOrder) {
  std::vector<char> a(100), b(3000), c(50);
  // Out of order in the batch; b's block follows a's, c sits inside b's.
  const auto slots = plan({{.offset = 5000, .size = 3000, .device = b.data()},
                           {.offset = 10, .size = 100, .device = a.data()},
                           {.offset = 6000, .size = 50, .device = c.data()}},
                          64 * kAlign);
  ASSERT_EQ(slots.size(), 1u);
  ASSERT_EQ(slots[0].reads.size(), 1u);
  EXPECT_EQ(slots[0].reads[0].file_offset, 0u);
  EXPECT_EQ(slots[0].reads[0].bytes, 2 * kAlign);
  ASSERT_EQ(slots[0].copies.size(), 3u);
  EXPECT_EQ(slots[0].copies[0].request, 1u);
  EXPECT_EQ(slots[0].copies[1].request, 0u);
  EXPECT_EQ(slots[0].copies[2].request, 2u);
}

TEST(BouncePlan, DistantRangesGetReadsOfTheirOwnAndEmptyOnesNone) {
  std::vector<char> a(10), b(10);
  const auto slots = plan({{.offset = 0, .size = 10, .device = a.data()},
                           {.offset = 1 << 20, .size = 0, .device = nullptr},
                           {.offset = 1 << 20, .size = 10, .device = b.data()}},
                          64 * kAlign);
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_EQ(slots[0].reads.size(), 2u);
  EXPECT_EQ(slots[0].copies.size(), 2u);
  EXPECT_TRUE(plan({}, 64 * kAlign).empty());
}

TEST(BouncePlan, RandomBatchesDeliverEveryByteOnce) {
  const std::string file = testing::random_bytes(3 << 20, 1);
  internal::Rng random(2);
  for (int round = 0; round < 200; ++round) {
    const size_t slot_bytes = kAlign * (2 + random.below(40));
    std::vector<DeviceReadRequest> requests(1 + random.below(30));
    std::vector<std::string> outputs(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const uint64_t size = random.below(4) == 0 ? random.below(200000) : random.below(9000);
      const uint64_t offset = random.below(file.size() - size + 1);
      outputs[i].assign(size, '\0');
      requests[i] = {offset, size, outputs[i].data()};
    }
    execute_plan(plan(requests, slot_bytes), file, slot_bytes);
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_EQ(outputs[i], file.substr(requests[i].offset, requests[i].size))
          << "round " << round << ", request " << i << " at " << requests[i].offset;
    }
  }
}

// ---- modes --------------------------------------------------------------------------------------

TEST(GdsMode, ParsesItsThreeNames) {
  for (const GdsMode mode : {GdsMode::kAuto, GdsMode::kOn, GdsMode::kOff}) {
    EXPECT_EQ(parse_gds_mode(gds_mode_name(mode)).value(), mode);
  }
  const Status bad = parse_gds_mode("yes").status();
  EXPECT_EQ(bad.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(bad.message(), "'yes'") && contains(bad.message(), "auto")) << bad.message();
}

// Every test below runs with destinations in host memory and a library of its choosing.
class DeviceReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    internal::use_host_destinations_for_testing(true);
    use_library("/nonexistent/libcufile.so.0");
    content_ = testing::random_bytes(1 << 20 | 777, 5);
    testing::write_file(dir_ / "data", content_);
  }
  void TearDown() override {
    internal::use_host_destinations_for_testing(false);
    for (const char* name :
         {"ZW_FAKE_CUFILE_DRIVER_ERROR", "ZW_FAKE_CUFILE_REGISTER_ERROR",
          "ZW_FAKE_CUFILE_READ_ERROR", "ZW_FAKE_CUFILE_MAX_READ", "ZW_FAKE_CUFILE_NVFS"}) {
      unsetenv(name);
    }
    internal::reset_cufile_for_testing("/nonexistent/libcufile.so.0");
  }

  static void use_library(const std::string& path) { internal::reset_cufile_for_testing(path); }
  static long fake_open_handles() {
    void* lib = dlopen(ZEROWAIT_FAKE_CUFILE, RTLD_NOW | RTLD_NOLOAD);
    auto count = reinterpret_cast<long (*)()>(dlsym(lib, "zw_fake_cufile_open_handles"));
    return count != nullptr ? count() : -1;
  }

  std::unique_ptr<DeviceReader> open(GdsMode mode, bool direct = true, size_t bounce = 64 << 10) {
    auto reader =
        DeviceReader::open(dir_ / "data", {.mode = mode, .direct = direct, .bounce_bytes = bounce});
    EXPECT_TRUE(reader.is_ok()) << reader.status().to_string();
    return reader.is_ok() ? std::move(reader).value() : nullptr;
  }

  // Reads a batch of unaligned ranges (some across bounce buffers) and compares every byte.
  void expect_exact_reads(DeviceReader& reader) {
    const std::vector<std::pair<uint64_t, uint64_t>> ranges = {{0, 1},
                                                               {1, 4095},
                                                               {4095, 2},
                                                               {12345, 200000},
                                                               {300001, 65536 * 3 + 5},
                                                               {content_.size() - 9, 9},
                                                               {700000, 0},
                                                               {5000, 10}};
    std::vector<std::string> out(ranges.size());
    std::vector<DeviceReadRequest> requests;
    for (size_t i = 0; i < ranges.size(); ++i) {
      out[i].assign(ranges[i].second, 'x');
      requests.push_back({ranges[i].first, ranges[i].second, out[i].data()});
    }
    const Status status = reader.read(requests);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    for (size_t i = 0; i < ranges.size(); ++i) {
      EXPECT_EQ(out[i], content_.substr(ranges[i].first, ranges[i].second)) << "range " << i;
    }
    std::string whole(content_.size(), '\0');
    ASSERT_TRUE(reader.read(whole.data(), whole.size(), 0).is_ok());
    EXPECT_EQ(whole, content_);
  }

  TempDir dir_;
  std::string content_;
};

TEST_F(DeviceReaderTest, OnWithoutLibcufileSaysWhy) {
  auto reader = DeviceReader::open(dir_ / "data", {.mode = GdsMode::kOn});
  ASSERT_FALSE(reader.is_ok());
  EXPECT_EQ(reader.status().code(), ErrorCode::kUnsupported);
  const std::string& message = reader.status().message();
  EXPECT_TRUE(contains(message, "gds=on") && contains(message, dir_ / "data") &&
              contains(message, "/nonexistent/libcufile.so.0"))
      << message;
}

TEST_F(DeviceReaderTest, OnWithoutACudaDeviceSaysSo) {
  if (internal::cuda_runtime().ok) GTEST_SKIP() << "this machine has a CUDA device";
  internal::use_host_destinations_for_testing(false);
  auto reader = DeviceReader::open(dir_ / "data", {.mode = GdsMode::kOn});
  EXPECT_EQ(reader.status().code(), ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(reader.status().message(), "no CUDA device")) << reader.status().message();
  // auto opens (the POSIX path, noted), but cannot read into memory that is not a GPU's.
  auto fallback = DeviceReader::open(dir_ / "data", {.mode = GdsMode::kAuto});
  ASSERT_TRUE(fallback.is_ok()) << fallback.status().to_string();
  std::string out(10, '\0');
  const Status read = fallback.value()->read(out.data(), out.size(), 0);
  EXPECT_EQ(read.code(), ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(read.message(), "no CUDA device")) << read.message();
}

TEST_F(DeviceReaderTest, AutoWithoutLibcufileFallsBackToPosixNotedAndCounted) {
  const uint64_t before = internal::fallback_count("gds");
  auto reader = open(GdsMode::kAuto);
  ASSERT_NE(reader, nullptr);
  const DeviceReaderStats stats = reader->stats();
  EXPECT_EQ(stats.path, "posix");
  EXPECT_TRUE(contains(stats.reason, "gds=auto") && contains(stats.reason, "libcufile"))
      << stats.reason;
  EXPECT_EQ(stats.gds_fallbacks, 1u);
  EXPECT_EQ(internal::fallback_count("gds"), before + 1);
  expect_exact_reads(*reader);
  EXPECT_EQ(reader->stats().posix_bytes,
            200000u + 65536 * 3 + 5 + 4095 + 1 + 2 + 9 + 10 + content_.size());
  EXPECT_EQ(reader->stats().cufile_bytes, 0u);
}

TEST_F(DeviceReaderTest, OffReadsThroughPosixWithoutAFallback) {
  const uint64_t before = internal::fallback_count("gds");
  for (const bool direct : {true, false}) {
    auto reader = open(GdsMode::kOff, direct);
    ASSERT_NE(reader, nullptr);
    EXPECT_EQ(reader->stats().path, "posix");
    EXPECT_EQ(reader->stats().reason, "gds=off");
    EXPECT_EQ(reader->stats().direct, direct);
    expect_exact_reads(*reader);
  }
  EXPECT_EQ(internal::fallback_count("gds"), before);
}

TEST_F(DeviceReaderTest, AFileSystemWithoutODirectIsReadBufferedAndCounted) {
  const uint64_t before = internal::fallback_count("direct");
  internal::fail_direct_open_for_testing(EINVAL);
  auto reader = open(GdsMode::kOff);
  internal::fail_direct_open_for_testing(0);
  ASSERT_NE(reader, nullptr);
  EXPECT_FALSE(reader->stats().direct);
  EXPECT_EQ(reader->stats().direct_fallbacks, 1u);
  EXPECT_EQ(internal::fallback_count("direct"), before + 1);
  expect_exact_reads(*reader);
}

TEST_F(DeviceReaderTest, RangesPastTheEndAndPassedDeadlinesAreErrorsNamingTheFile) {
  auto reader = open(GdsMode::kOff);
  ASSERT_NE(reader, nullptr);
  std::string out(100, '\0');
  const Status past = reader->read(out.data(), out.size(), content_.size() - 50);
  EXPECT_EQ(past.code(), ErrorCode::kCorrupt);
  EXPECT_TRUE(contains(past.message(), "short read") && contains(past.message(), dir_ / "data"))
      << past.message();
  const Status late =
      reader->read(out.data(), out.size(), 0, Deadline{Clock::now() - std::chrono::seconds(1)});
  EXPECT_EQ(late.code(), ErrorCode::kDeadlineExceeded);
  EXPECT_TRUE(contains(late.message(), dir_ / "data")) << late.message();
}

TEST_F(DeviceReaderTest, BounceBuffersMustBeWholeBlocks) {
  auto reader = DeviceReader::open(dir_ / "data", {.mode = GdsMode::kOff, .bounce_bytes = 70000});
  EXPECT_EQ(reader.status().code(), ErrorCode::kInvalidArgument);
}

// ---- the cuFile path, over the stand-in library -------------------------------------------------

TEST_F(DeviceReaderTest, OnReadsThroughCufileAndReportsItsCompatibilityMode) {
  use_library(ZEROWAIT_FAKE_CUFILE);
  {
    auto reader = open(GdsMode::kOn);
    ASSERT_NE(reader, nullptr);
    const DeviceReaderStats stats = reader->stats();
    EXPECT_EQ(stats.path, "cufile");
    EXPECT_EQ(fake_open_handles(), 1);
    // No nvidia-fs here, and the stand-in reports nvfs 0.0: cuFile's own compatibility mode.
    EXPECT_TRUE(stats.cufile_compat_mode);
    EXPECT_TRUE(contains(stats.reason, "compatibility mode")) << stats.reason;
    EXPECT_TRUE(contains(stats.reason, ZEROWAIT_FAKE_CUFILE)) << stats.reason;
    setenv("ZW_FAKE_CUFILE_MAX_READ", "1000", 1);  // cuFileRead may return less than asked
    expect_exact_reads(*reader);
    EXPECT_EQ(reader->stats().posix_bytes, 0u);
    EXPECT_GT(reader->stats().cufile_bytes, content_.size());
  }
  EXPECT_EQ(fake_open_handles(), 0) << "the file's registration outlived its reader";
}

TEST_F(DeviceReaderTest, AutoUsesCufileWhereItWorksAndFallsBackWhereRegistrationFails) {
  use_library(ZEROWAIT_FAKE_CUFILE);
  EXPECT_EQ(open(GdsMode::kAuto)->stats().path, "cufile");
  setenv("ZW_FAKE_CUFILE_REGISTER_ERROR", "5018", 1);  // CU_FILE_INVALID_FILE_TYPE
  auto reader = open(GdsMode::kAuto);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(reader->stats().path, "posix");
  EXPECT_TRUE(contains(reader->stats().reason, "cuFileHandleRegister") &&
              contains(reader->stats().reason, "CU_FILE_INVALID_FILE_TYPE (5018)"))
      << reader->stats().reason;
  expect_exact_reads(*reader);
  auto on = DeviceReader::open(dir_ / "data", {.mode = GdsMode::kOn});
  EXPECT_EQ(on.status().code(), ErrorCode::kUnsupported);
  EXPECT_TRUE(contains(on.status().message(), "CU_FILE_INVALID_FILE_TYPE"))
      << on.status().message();
}

TEST_F(DeviceReaderTest, AutoFallsBackWhenTheFirstCufileReadFailsButOnDoesNot) {
  use_library(ZEROWAIT_FAKE_CUFILE);
  auto reader = open(GdsMode::kAuto);
  auto on = open(GdsMode::kOn);
  ASSERT_NE(reader, nullptr);
  ASSERT_NE(on, nullptr);
  EXPECT_EQ(reader->stats().path, "cufile");
  setenv("ZW_FAKE_CUFILE_READ_ERROR", "5030", 1);  // CU_FILE_INTERNAL_ERROR
  const uint64_t before = internal::fallback_count("gds");
  expect_exact_reads(*reader);
  const DeviceReaderStats stats = reader->stats();
  EXPECT_EQ(stats.path, "posix");
  EXPECT_TRUE(contains(stats.reason, "first read failed") &&
              contains(stats.reason, "CU_FILE_INTERNAL_ERROR"))
      << stats.reason;
  EXPECT_EQ(stats.gds_fallbacks, 1u);
  EXPECT_EQ(internal::fallback_count("gds"), before + 1);
  std::string out(10, '\0');
  EXPECT_EQ(on->read(out.data(), out.size(), 0).code(), ErrorCode::kIo);
  EXPECT_EQ(on->stats().path, "cufile");
}

TEST_F(DeviceReaderTest, ADriverThatDoesNotOpenIsNamed) {
  use_library(ZEROWAIT_FAKE_CUFILE);
  setenv("ZW_FAKE_CUFILE_DRIVER_ERROR", "5001", 1);
  auto on = DeviceReader::open(dir_ / "data", {.mode = GdsMode::kOn});
  EXPECT_TRUE(contains(on.status().message(), "cuFileDriverOpen") &&
              contains(on.status().message(), "CU_FILE_DRIVER_NOT_INITIALIZED"))
      << on.status().message();
  const GdsEvidence evidence = gds_evidence();
  EXPECT_FALSE(evidence.cufile_usable);
  EXPECT_TRUE(contains(evidence.summary, "does not open")) << evidence.summary;
}

TEST_F(DeviceReaderTest, CufileReadErrorsNameTheFileTheOffsetAndTheReason) {
  use_library(ZEROWAIT_FAKE_CUFILE);
  auto reader = open(GdsMode::kOn);
  ASSERT_NE(reader, nullptr);
  std::string out(5000, '\0');
  setenv("ZW_FAKE_CUFILE_READ_ERROR", "5044", 1);
  Status failed = reader->read(out.data(), out.size(), 4096);
  EXPECT_EQ(failed.code(), ErrorCode::kIo);
  EXPECT_TRUE(contains(failed.message(), dir_ / "data") &&
              contains(failed.message(), "offset 4096") &&
              contains(failed.message(), "CU_FILE_IO_ERROR"))
      << failed.message();
  setenv("ZW_FAKE_CUFILE_READ_ERROR", "1", 1);  // -1 with errno EIO
  failed = reader->read(out.data(), out.size(), 4096);
  EXPECT_TRUE(contains(failed.message(), std::strerror(EIO))) << failed.message();
}

TEST_F(DeviceReaderTest, OnWithoutODirectStillTriesCufileAndAutoDoesNot) {
  use_library(ZEROWAIT_FAKE_CUFILE);
  internal::fail_direct_open_for_testing(EINVAL);
  auto on = open(GdsMode::kOn);
  auto fallback = open(GdsMode::kAuto);
  internal::fail_direct_open_for_testing(0);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(fallback, nullptr);
  EXPECT_EQ(on->stats().path, "cufile");
  EXPECT_EQ(on->stats().direct_fallbacks, 1u);
  expect_exact_reads(*on);
  EXPECT_EQ(fallback->stats().path, "posix");
  EXPECT_TRUE(contains(fallback->stats().reason, "O_DIRECT")) << fallback->stats().reason;
}

TEST_F(DeviceReaderTest, EvidenceNamesTheLibraryAndTheNvidiaFsVersion) {
  use_library(ZEROWAIT_FAKE_CUFILE);
  setenv("ZW_FAKE_CUFILE_NVFS", "2.17", 1);
  const GdsEvidence evidence = gds_evidence();
  EXPECT_TRUE(evidence.cufile_usable);
  auto fact = [&](const std::string& name) {
    for (const auto& [key, value] : evidence.facts) {
      if (key == name) return value;
    }
    ADD_FAILURE() << "no fact " << name;
    return std::string();
  };
  EXPECT_EQ(fact("library"), ZEROWAIT_FAKE_CUFILE);
  EXPECT_EQ(fact("cufile_version"), "1150");
  EXPECT_TRUE(contains(fact("nvfs_version"), "2.17")) << fact("nvfs_version");
  EXPECT_TRUE(contains(fact("allow_compat_mode"), "true")) << fact("allow_compat_mode");
  // The stand-in has no cuFileGetParameterBool: said, not guessed.
  EXPECT_TRUE(contains(fact("force_compat_mode"), "unknown")) << fact("force_compat_mode");
  EXPECT_FALSE(fact("cufile_json").empty());
  // Without /proc/driver/nvidia-fs cuFile cannot go direct, whatever version it reports.
  if (!evidence.compat_mode) {
    EXPECT_FALSE(contains(fact("nvidia_fs"), "absent")) << fact("nvidia_fs");
  } else {
    EXPECT_TRUE(contains(evidence.summary, "compatibility mode")) << evidence.summary;
  }
}

TEST(CufileLibrary, ALibraryWithoutCufilesEntryPointsIsRefusedByName) {
  const internal::CufileApi api = internal::load_cufile("libc.so.6");
  EXPECT_FALSE(api.ok);
  EXPECT_TRUE(contains(api.reason, "lacks an entry point") && contains(api.reason, "cuFile"))
      << api.reason;
  EXPECT_TRUE(internal::load_cufile(ZEROWAIT_FAKE_CUFILE).ok);
}

}  // namespace
}  // namespace zerowait
