// The device reader on a real GPU: bytes read into GPU memory in every mode (cuFile where this
// machine allows it, the POSIX path always) are the file's, bit for bit, at unaligned offsets and
// sizes, in batches, past 1 GiB, and from a file system without O_DIRECT. Every test skips,
// saying why, without a CUDA device; scripts/gpu-check.sh runs them on the GPU machine with
// $ZEROWAIT_CUFILE_LIBRARY naming the nvidia-cufile wheel's library.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iostream>
#include <string>
#include <vector>

#include "host/cuda_runtime.hpp"
#include "host/cufile.hpp"
#include "storage/local/file_sources.hpp"
#include "testing/cuda.hpp"
#include "testing/testing.hpp"
#include "zerowait/storage/device_reader.hpp"

namespace zerowait {
namespace {

using internal::cuda_runtime;
using internal::DeviceBuffer;
using testing::TempDir;

using ::zerowait::testing::contains;

std::string copy_to_host(const DeviceBuffer& buffer, size_t offset, size_t bytes) {
  std::string out(bytes, '\0');
  const Status status = internal::cuda_status(
      cuda_runtime().memcpy(out.data(), static_cast<const char*>(buffer.data()) + offset, bytes,
                            internal::kCudaMemcpyDeviceToHost),
      "cudaMemcpy to the host");
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  return out;
}

DeviceBuffer device_buffer(size_t bytes) {
  auto buffer = DeviceBuffer::allocate(bytes);
  EXPECT_TRUE(buffer.is_ok()) << buffer.status().to_string();
  return buffer.is_ok() ? std::move(buffer).value() : DeviceBuffer();
}

// Whether gds=on can read `path` here: a reader opens and a first read into GPU memory works.
// Otherwise `*why` holds what failed (the reader's error, which names cuFile's call and code).
bool cufile_reads(const std::string& path, std::string* why) {
  auto reader = DeviceReader::open(path, {.mode = GdsMode::kOn});
  if (!reader.is_ok()) {
    *why = reader.status().to_string();
    return false;
  }
  auto buffer = DeviceBuffer::allocate(4096);
  const Status read =
      buffer.is_ok() ? reader.value()->read(buffer.value().data(),
                                            std::min<uint64_t>(4096, reader.value()->size()), 0)
                     : buffer.status();
  *why = read.is_ok() ? "" : read.to_string();
  return read.is_ok();
}

// The modes to read `path` with here: off and auto always, on where cuFile reads (elsewhere the
// test of on is EvidenceAndTheOnModeAgree).
std::vector<GdsMode> modes_to_read_with(const std::string& path) {
  std::vector<GdsMode> modes = {GdsMode::kOff, GdsMode::kAuto};
  std::string why;
  if (cufile_reads(path, &why)) modes.push_back(GdsMode::kOn);
  return modes;
}

std::unique_ptr<DeviceReader> open_reader(const std::string& path, GdsMode mode) {
  auto reader = DeviceReader::open(path, {.mode = mode});
  EXPECT_TRUE(reader.is_ok()) << gds_mode_name(mode) << ": " << reader.status().to_string();
  return reader.is_ok() ? std::move(reader).value() : nullptr;
}

TEST(GpuGds, EvidenceAndTheOnModeAgree) {
  ZW_SKIP_WITHOUT_CUDA();
  const GdsEvidence evidence = gds_evidence();
  std::cout << "gds evidence: " << evidence.summary << "\n";
  for (const auto& [name, value] : evidence.facts)
    std::cout << "  " << name << ": " << value << "\n";
  ::testing::Test::RecordProperty("gds_summary", evidence.summary);
  EXPECT_FALSE(evidence.summary.empty());
  if (evidence.cufile_usable && !internal::cufile_evidence().nvidia_fs_present) {
    EXPECT_TRUE(evidence.compat_mode) << "no nvidia-fs, yet cuFile is said to go direct";
  }
  TempDir dir;
  testing::write_file(dir / "data", testing::random_bytes(1 << 20, 20));
  std::string why;
  const bool reads = cufile_reads(dir / "data", &why);
  std::cout << "gds=on here: " << (reads ? "reads through cuFile" : why) << "\n";
  if (!evidence.cufile_usable) {
    EXPECT_FALSE(reads) << "cuFile read without a driver that opens";
  }
  if (!reads) {
    // Loud and specific: the error names cuFile (and its call where one failed)...
    EXPECT_TRUE(contains(why, "cuFile") || contains(why, "CUDA")) << why;
    // ...and auto does not fail where on does: it reads through the POSIX path, counted.
    auto reader = open_reader(dir / "data", GdsMode::kAuto);
    ASSERT_NE(reader, nullptr);
    DeviceBuffer buffer = device_buffer(4096);
    ASSERT_TRUE(reader->read(buffer.data(), 4096, 0).is_ok());
    EXPECT_EQ(reader->stats().path, "posix") << reader->stats().reason;
    EXPECT_EQ(reader->stats().gds_fallbacks, 1u);
  }
}

TEST(GpuGds, UnalignedRangesAndBatchesAreBitExactInEveryMode) {
  ZW_SKIP_WITHOUT_CUDA();
  TempDir dir;
  const std::string content = testing::random_bytes((24 << 20) + 12345, 21);
  testing::write_file(dir / "data", content);
  DeviceBuffer buffer = device_buffer(content.size() + 8192);
  ASSERT_NE(buffer.data(), nullptr);
  auto* base = static_cast<std::byte*>(buffer.data());
  for (const GdsMode mode : modes_to_read_with(dir / "data")) {
    SCOPED_TRACE(gds_mode_name(mode));
    auto reader = open_reader(dir / "data", mode);
    ASSERT_NE(reader, nullptr);
    std::cout << gds_mode_name(mode) << ": " << reader->stats().path << " ("
              << reader->stats().reason << ")\n";
    // One range at an odd offset into an odd place of the buffer.
    ASSERT_TRUE(reader->read(base + 3, content.size() - 7, 7).is_ok());
    EXPECT_TRUE(copy_to_host(buffer, 3, content.size() - 7) == content.substr(7))
        << "a whole-file read differs";
    // A batch of small and large ranges, out of file order, packed into one buffer.
    const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
        {9 << 20, 333},          {1, 1}, {4095, 4097}, {100000, 5 << 20}, {content.size() - 1, 1},
        {8 << 20, (8 << 20) + 1}};
    std::vector<DeviceReadRequest> requests;
    uint64_t at = 0;
    for (const auto& [offset, size] : ranges) {
      requests.push_back({offset, size, base + at});
      at += size + 1;
    }
    ASSERT_TRUE(reader->read(requests).is_ok());
    for (size_t i = 0; i < ranges.size(); ++i) {
      const uint64_t to = static_cast<uint64_t>(static_cast<std::byte*>(requests[i].device) - base);
      EXPECT_TRUE(copy_to_host(buffer, to, ranges[i].second) ==
                  content.substr(ranges[i].first, ranges[i].second))
          << "range " << i << " at " << ranges[i].first;
    }
    const DeviceReaderStats stats = reader->stats();
    EXPECT_EQ(stats.cufile_bytes + stats.posix_bytes, content.size() - 7 + at - ranges.size());
    EXPECT_EQ(stats.path == "cufile" ? stats.posix_bytes : stats.cufile_bytes, 0u);
    if (mode == GdsMode::kOff) {
      EXPECT_EQ(stats.path, "posix");
    } else if (mode == GdsMode::kOn) {
      EXPECT_EQ(stats.path, "cufile");
    }
  }
}

TEST(GpuGds, AGibibyteAndMoreInOneRead) {
  ZW_SKIP_WITHOUT_CUDA();
  TempDir dir;
  const size_t size = (size_t{1} << 30) + 4097;
  const std::string content = testing::random_bytes(size, 22);
  testing::write_file(dir / "big", content);
  DeviceBuffer buffer = device_buffer(size);
  ASSERT_NE(buffer.data(), nullptr);
  for (const GdsMode mode : modes_to_read_with(dir / "big")) {
    if (mode == GdsMode::kAuto) continue;  // the same path as one of the other two
    SCOPED_TRACE(gds_mode_name(mode));
    auto reader = open_reader(dir / "big", mode);
    ASSERT_NE(reader, nullptr);
    ASSERT_TRUE(cuda_runtime().memset(buffer.data(), 0, size) == 0);
    const Status status = reader->read(buffer.data(), size, 0);
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    EXPECT_TRUE(copy_to_host(buffer, 0, size) == content) << "1 GiB read differs";
  }
}

TEST(GpuGds, AFileSystemWithoutODirectIsReadBufferedAndCounted) {
  ZW_SKIP_WITHOUT_CUDA();
  // /dev/shm (tmpfs) refuses O_DIRECT before Linux 6.6; the hook makes every kernel refuse it.
  const std::string path = "/dev/shm/zerowait-gds-test-" + std::to_string(::getpid());
  const std::string content = testing::random_bytes((3 << 20) + 5, 23);
  testing::write_file(path, content);
  DeviceBuffer buffer = device_buffer(content.size());
  ASSERT_NE(buffer.data(), nullptr);
  for (const GdsMode mode : {GdsMode::kOff, GdsMode::kAuto}) {
    SCOPED_TRACE(gds_mode_name(mode));
    internal::fail_direct_open_for_testing(EINVAL);
    auto reader = open_reader(path, mode);
    internal::fail_direct_open_for_testing(0);
    ASSERT_NE(reader, nullptr);
    const DeviceReaderStats stats = reader->stats();
    EXPECT_EQ(stats.direct_fallbacks, 1u);
    EXPECT_FALSE(stats.direct);
    EXPECT_EQ(stats.path, "posix") << stats.reason;
    if (mode == GdsMode::kAuto && internal::cufile_api().ok) {
      EXPECT_TRUE(contains(stats.reason, "O_DIRECT")) << stats.reason;
    }
    ASSERT_TRUE(reader->read(buffer.data(), content.size() - 1, 1).is_ok());
    EXPECT_TRUE(copy_to_host(buffer, 0, content.size() - 1) == content.substr(1));
  }
  ::unlink(path.c_str());
}

TEST(GpuGds, HostMemoryIsRefusedAndTheCallersDeviceIsKept) {
  ZW_SKIP_WITHOUT_CUDA();
  TempDir dir;
  testing::write_file(dir / "data", testing::random_bytes(100000, 24));
  auto reader = open_reader(dir / "data", GdsMode::kOff);
  ASSERT_NE(reader, nullptr);
  std::string host(1000, '\0');
  const Status refused = reader->read(host.data(), host.size(), 0);
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(refused.message(), "not GPU memory")) << refused.message();
  int before = -1, after = -1;
  cuda_runtime().get_device(&before);
  DeviceBuffer buffer = device_buffer(1000);
  ASSERT_TRUE(reader->read(buffer.data(), 1000, 50).is_ok());
  cuda_runtime().get_device(&after);
  EXPECT_EQ(before, after);
}

TEST(GpuGds, ARegisteredBufferIsReadIntoThroughCufile) {
  ZW_SKIP_WITHOUT_CUDA();
  TempDir dir;
  const std::string content = testing::random_bytes(4 << 20, 25);
  testing::write_file(dir / "data", content);
  std::string why;
  if (!cufile_reads(dir / "data", &why)) GTEST_SKIP() << "cuFile does not read here: " << why;
  DeviceBuffer buffer = device_buffer(content.size());
  auto registered = internal::CufileBuffer::register_memory(buffer.data(), content.size());
  ASSERT_TRUE(registered.is_ok()) << registered.status().to_string();
  auto reader = open_reader(dir / "data", GdsMode::kOn);
  ASSERT_NE(reader, nullptr);
  ASSERT_TRUE(reader->read(buffer.data(), content.size(), 0).is_ok());
  EXPECT_TRUE(copy_to_host(buffer, 0, content.size()) == content);
}

}  // namespace
}  // namespace zerowait
