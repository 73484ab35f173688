// Fills one batch arena: reads the batch's samples with coalesced reads per shard, checks their
// checksums, decodes the selected fields and lays out the columns. Runs on a loader worker thread;
// one BatchBuilder per thread (it owns that thread's reusable scratch: read plan, each decoder's
// DecodeScratch).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loader/arena_pool.hpp"
#include "loader/batch.hpp"
#include "loader/block_window.hpp"
#include "zerowait/loader/field_decoder.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"

namespace zerowait {

// A delivered field, resolved once per loader from LoaderOptions::fields and ::decode: its
// decoder (shared by the builders, const) and that decoder's columns.
struct FieldSpec {
  std::string name;
  std::shared_ptr<const FieldDecoder> decoder;
  FieldLayout layout;
};

// What one worker measured while building one batch.
struct BuildStats {
  uint64_t bytes_read = 0;
  uint64_t skipped = 0;  // corrupt samples left out of the batch
  // CorruptPolicy::kRaise: why each of them was left out, for next() to raise one at a time.
  std::vector<Status> corrupt;
  std::chrono::nanoseconds read{0};
  std::chrono::nanoseconds decode{0};
};

// Describes the read the builder is blocked in, for the consumer's hang report.
struct ReadInFlight {
  std::string path;
  uint64_t offset = 0;
  uint64_t requests = 0;
};

// ShuffleMode::kBlock: samples are read as whole blocks through a window shared by the loader's
// builders; `samples_per_block[s]` cuts shard s as the epoch order does.
struct BlockReads {
  std::shared_ptr<BlockWindow> window;
  std::vector<uint64_t> samples_per_block;

  // The file bytes of the block of shard `s` (read by `shard`) that sample `local` lies in:
  // from the block's first sample's start to its last one's end (samples are stored in index
  // order, but the span is taken over all of them to rely on nothing).
  struct Span {
    uint64_t offset = 0, length = 0;
  };
  Span span(const ShardReader& shard, size_t s, uint64_t local) const;
};

class BatchBuilder {
 public:
  // `blocks`: null unless the loader reads whole blocks; must outlive the builder.
  BatchBuilder(const Dataset& dataset, const LoaderOptions& options,
               const std::vector<FieldSpec>& fields, const BlockReads* blocks = nullptr);

  // Bytes a batch of these samples needs: coalesced reads, and columns. Also prepares the read
  // plan that build() then uses; call it first, for the same indices.
  struct Needs {
    uint64_t read_bytes = 0;
    uint64_t out_bytes = 0;
  };
  Result<Needs> plan(const std::vector<uint64_t>& indices);

  // Builds `batch` in its arena (already reserved for plan()'s needs). A corrupt sample is left
  // out of the batch, counted in stats->skipped and, under CorruptPolicy::kRaise, its error added
  // to stats->corrupt; read errors and missed deadlines fail the batch. Small columns are copied
  // out of the arena (kOwnedColumnMaxBytes). `in_flight` is updated under `in_flight_mutex`.
  Status build(const std::vector<uint64_t>& indices, uint64_t epoch, Batch::Impl* batch,
               BuildStats* stats, ReadInFlight* in_flight, std::mutex* in_flight_mutex);

 private:
  struct Item {  // one sample of the batch
    size_t shard = 0;
    uint64_t local = 0;
    uint64_t offset = 0;  // in the shard file
    uint64_t size = 0;
    uint64_t buffer_pos = 0;  // where its bytes land in the read buffer
    size_t block = 0;         // with whole-block reads: its block in wants_
  };
  struct Range {  // one coalesced read
    size_t shard = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t buffer_pos = 0;
  };

  Status read_ranges(Arena* arena, BuildStats* stats, ReadInFlight* in_flight,
                     std::mutex* in_flight_mutex);
  // Whole-block reads: the blocks holding items_, each wanted once.
  Status plan_blocks();
  Status read_blocks(BuildStats* stats, ReadInFlight* in_flight, std::mutex* in_flight_mutex);
  // The seed of a sample's random augmentations (crops, token offsets): a function of (seed,
  // epoch, global index) alone, so the same after an exact resume and whatever the threads.
  uint64_t augment_seed(uint64_t epoch, uint64_t global_index) const;
  Status fill_sample(const Item& item, uint64_t global_index, uint64_t epoch,
                     std::span<const std::byte> bytes, uint64_t row, Batch::Impl* batch,
                     uint64_t* raw_filled);

  const Dataset& dataset_;
  const LoaderOptions& options_;
  const std::vector<FieldSpec>& fields_;
  std::vector<size_t> column_of_field_;  // first batch column of each field
  std::vector<bool> per_sample_column_;  // 8 bytes a sample: always copied out
  std::vector<std::unique_ptr<DecodeScratch>> scratch_;  // per field: this thread's
  std::vector<std::vector<std::byte*>> rows_;  // per field: the sample's row in each column
  // The shards of the batch being built, by shard number; released when the next batch is
  // planned, so the dataset's index budget decides what stays open.
  std::vector<std::shared_ptr<ShardReader>> shards_;
  std::vector<size_t> shards_held_;
  std::vector<Item> items_;        // in batch order
  std::vector<size_t> by_offset_;  // item numbers sorted by (shard, offset)
  std::vector<Range> ranges_;
  std::vector<ReadRequest> requests_;
  const BlockReads* blocks_;
  std::vector<BlockWindow::Want> wants_;
  std::vector<std::shared_ptr<const WindowBlock>> held_blocks_;  // wants_' bytes, while building
  // Per field: room for all samples' bytes (fields with byte rows, row_bytes_room()).
  std::vector<uint64_t> raw_bytes_;
  std::vector<uint64_t> written_;  // per field: the byte rows the sample being filled wrote
};

// Column layout of a batch of `samples` rows, shared by plan() and build().
uint64_t batch_out_bytes(const std::vector<FieldSpec>& fields, uint64_t samples,
                         const std::vector<uint64_t>& raw_bytes);

}  // namespace zerowait
