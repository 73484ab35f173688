// The loader's block window (shuffle "block"): whole blocks read once into memory, shared by the
// builders, and the memory of the blocks it drops reused for the next ones.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "loader/block_window.hpp"
#include "testing/testing.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait {
namespace {

using testing::TempDir;

// Sixteen windows of four blocks pass through a window with room for eight: every block's bytes
// are the file's, each is read once, and after the first eight the blocks reuse the buffers of
// the ones dropped, so the memory held never passes the budget however long the epoch.
TEST(BlockWindow, ReusesTheMemoryOfDroppedBlocksAndStaysWithinItsBudget) {
  TempDir dir;
  constexpr uint64_t kBlock = 100'000;  // not a multiple of 4 KiB: O_DIRECT widens each read
  constexpr uint64_t kBlocks = 64;
  const std::string bytes = testing::random_bytes(kBlock * kBlocks + 1234, 7);
  testing::write_file(dir / "shard", bytes);
  for (IoBackend io : {IoBackend::kPread, IoBackend::kDirect}) {
    SCOPED_TRACE(io_backend_name(io));
    auto source = open_file_source(dir / "shard", io);
    ASSERT_TRUE(source.is_ok()) << source.status().to_string();
    const uint64_t budget = 8 * (kBlock + 2 * 4096);  // eight blocks, widened
    BlockWindow window(budget);
    uint64_t bytes_read = 0;
    for (uint64_t first = 0; first < kBlocks; first += 4) {
      std::vector<BlockWindow::Want> wants;
      for (uint64_t b = first; b < first + 4; ++b) {
        wants.push_back({0, b, b * kBlock, kBlock, source->get()});
      }
      std::vector<std::shared_ptr<const WindowBlock>> held;
      // Twice: the second call finds every block in memory.
      for (int round = 0; round < 2; ++round) {
        const uint64_t before = bytes_read;
        Status status = window.acquire(wants, Deadline::none(), &held, &bytes_read);
        ASSERT_TRUE(status.is_ok()) << status.to_string();
        if (round == 1) {
          EXPECT_EQ(bytes_read, before) << "block " << first << " read again";
        }
        for (size_t j = 0; j < wants.size(); ++j) {
          const auto got = held[j]->bytes(wants[j].offset, kBlock);
          ASSERT_EQ(testing::to_string(got),
                    bytes.substr(wants[j].offset, kBlock))
              << "block " << wants[j].block;
        }
      }
      const BlockWindow::Memory memory = window.memory();
      EXPECT_LE(memory.resident_bytes + memory.spare_bytes, budget) << "after block " << first;
    }
    // Each block read once, whole (O_DIRECT: widened to 4 KiB boundaries, at most 8 KiB more).
    EXPECT_GE(bytes_read, kBlocks * kBlock);
    EXPECT_LE(bytes_read, kBlocks * (kBlock + 2 * 4096));
    EXPECT_EQ(window.memory().buffers_allocated, 8u);
  }
}

// A block still held by a builder when the window drops it stays valid for that builder, and
// its memory is not handed to another block.
TEST(BlockWindow, ABlockHeldPastItsEvictionKeepsItsBytes) {
  TempDir dir;
  constexpr uint64_t kBlock = 64 << 10;
  const std::string bytes = testing::random_bytes(kBlock * 8, 11);
  testing::write_file(dir / "shard", bytes);
  auto source = open_file_source(dir / "shard", IoBackend::kPread);
  ASSERT_TRUE(source.is_ok()) << source.status().to_string();
  BlockWindow window(2 * kBlock);
  uint64_t bytes_read = 0;
  std::vector<std::shared_ptr<const WindowBlock>> kept;
  const std::vector<BlockWindow::Want> first = {{0, 0, 0, kBlock, source->get()}};
  ASSERT_TRUE(window.acquire(first, Deadline::none(), &kept, &bytes_read).is_ok());
  for (uint64_t b = 1; b < 8; ++b) {
    std::vector<std::shared_ptr<const WindowBlock>> held;
    const std::vector<BlockWindow::Want> want = {{0, b, b * kBlock, kBlock, source->get()}};
    ASSERT_TRUE(window.acquire(want, Deadline::none(), &held, &bytes_read).is_ok());
  }
  const auto got = kept[0]->bytes(0, kBlock);
  EXPECT_EQ(testing::to_string(got),
            bytes.substr(0, kBlock));
  EXPECT_EQ(bytes_read, 8 * kBlock);
  const BlockWindow::Memory memory = window.memory();
  EXPECT_LE(memory.resident_bytes + memory.spare_bytes, 2 * kBlock);
}

}  // namespace
}  // namespace zerowait
