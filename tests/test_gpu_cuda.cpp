// The CUDA runtime as zerowait loads it (dlopen, host/cuda_runtime.hpp), on a real device:
// page-locked batch arenas and staging, device memory, and the fallback's message without one.
// Every test but the last skips, saying why, where there is no CUDA device; scripts/gpu-check.sh
// runs them on the GPU machine (`ctest -L gpu`).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "host/aligned_buffer.hpp"
#include "host/cuda_runtime.hpp"
#include "testing/cuda.hpp"
#include "testing/testing.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/writer.hpp"

namespace zerowait {
namespace {

using internal::cuda_memory_type;
using internal::cuda_runtime;

// A dataset of `samples` samples whose "bin" field is 96 KiB (above kOwnedColumnMaxBytes for a
// batch of one, so the column stays in the arena) of bytes that depend on the index.
std::shared_ptr<Dataset> write_dataset(const std::string& dir, int samples) {
  auto writer = ShardWriter::create(dir + "/shard-000.zws", {.sync = false});
  EXPECT_TRUE(writer.is_ok()) << writer.status().to_string();
  for (int i = 0; i < samples; ++i) {
    std::string bin(96 << 10, '\0');
    for (size_t b = 0; b < bin.size(); ++b) bin[b] = static_cast<char>(i * 131 + b);
    const std::string key = "sample-" + std::to_string(i);
    const std::vector<FieldData> fields = {{"bin", std::as_bytes(std::span(bin))}};
    EXPECT_TRUE(writer.value().add_sample(key, fields).is_ok());
  }
  EXPECT_TRUE(writer.value().finish().is_ok());
  auto dataset = Dataset::open(dir);
  EXPECT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  return std::move(dataset).value();
}

TEST(GpuCuda, RuntimeLoadsAndCountsDevices) {
  ZW_SKIP_WITHOUT_CUDA();
  EXPECT_GE(cuda_runtime().devices, 1);
  EXPECT_TRUE(cuda_runtime().reason.empty());
}

TEST(GpuCuda, PinnedBuffersArePageLockedUntilFreed) {
  ZW_SKIP_WITHOUT_CUDA();
  internal::AlignedBuffer pinned, plain;
  ASSERT_TRUE(pinned.reserve(8 << 20, 8 << 20, /*pin=*/true).is_ok());
  ASSERT_TRUE(plain.reserve(8 << 20, 8 << 20, /*pin=*/false).is_ok());
  EXPECT_TRUE(pinned.pinned());
  EXPECT_EQ(cuda_memory_type(pinned.data()), "host");
  // Every page of the registration, not just the first.
  EXPECT_EQ(cuda_memory_type(pinned.data() + (8 << 20) - 1), "host");
  EXPECT_EQ(cuda_memory_type(plain.data()), "unregistered");
}

TEST(GpuCuda, LoaderArenasArePinnedOnlyWhenAsked) {
  ZW_SKIP_WITHOUT_CUDA();
  testing::TempDir dir;
  auto dataset = write_dataset(dir.path(), 16);
  for (const bool pin : {true, false}) {
    LoaderOptions options;
    options.batch_size = 4;
    options.pin_memory = pin;
    auto loader = Loader::create(dataset, options);
    ASSERT_TRUE(loader.is_ok()) << loader.status().to_string();
    auto batch = loader.value()->next();
    ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
    const BatchColumn* bin = batch.value()->column("bin");
    ASSERT_NE(bin, nullptr);
    ASSERT_EQ(bin->copy, nullptr) << "a zero-copy column is expected (it lives in the arena)";
    EXPECT_EQ(batch.value()->pinned(), pin);
    EXPECT_EQ(loader.value()->stats().pinned, pin);
    EXPECT_EQ(cuda_memory_type(bin->data), pin ? "host" : "unregistered");
  }
}

TEST(GpuCuda, DeviceMemoryRoundTrip) {
  ZW_SKIP_WITHOUT_CUDA();
  const auto& rt = cuda_runtime();
  auto device = internal::DeviceBuffer::allocate(64 << 20);
  ASSERT_TRUE(device.is_ok()) << device.status().to_string();
  EXPECT_EQ(cuda_memory_type(device.value().data()), "device");
  std::vector<unsigned char> out(64 << 20), back(64 << 20);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(i * 7 + 3);
  ASSERT_TRUE(internal::cuda_status(rt.memcpy(device.value().data(), out.data(), out.size(),
                                              internal::kCudaMemcpyHostToDevice),
                                    "cudaMemcpy H2D")
                  .is_ok());
  ASSERT_TRUE(internal::cuda_status(rt.memcpy(back.data(), device.value().data(), back.size(),
                                              internal::kCudaMemcpyDeviceToHost),
                                    "cudaMemcpy D2H")
                  .is_ok());
  EXPECT_EQ(std::memcmp(out.data(), back.data(), out.size()), 0);
}

TEST(GpuCuda, WithoutCudaEverythingStaysHostMemoryAndSaysWhy) {
  if (cuda_runtime().ok) GTEST_SKIP() << "a CUDA device is present: the fallback is not taken";
  EXPECT_FALSE(cuda_runtime().reason.empty());
  EXPECT_FALSE(internal::host_memory_pinning_available());
  internal::AlignedBuffer buffer;
  ASSERT_TRUE(buffer.reserve(1 << 20, 1 << 20, /*pin=*/true).is_ok());
  EXPECT_FALSE(buffer.pinned());
  EXPECT_EQ(cuda_memory_type(buffer.data()), "");
  EXPECT_EQ(internal::DeviceBuffer::allocate(1 << 20).status().code(), ErrorCode::kUnsupported);
}

}  // namespace
}  // namespace zerowait
