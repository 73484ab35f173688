#include "loader/batch_builder.hpp"

#include <algorithm>
#include <cstring>

#include "common/align.hpp"
#include "common/random.hpp"

namespace zerowait {

namespace {

using internal::align_up;
using SteadyClock = std::chrono::steady_clock;

// Reads of samples closer than this are merged into one read: reading a small gap costs less
// than another request. Merged reads stop growing at kMaxRangeBytes so many stay in flight.
constexpr uint64_t kMaxGapBytes = 64 << 10;
constexpr uint64_t kMaxRangeBytes = 4 << 20;
constexpr uint64_t kColumnAlignment = 64;
// The loader's augmentation randomness stream (see sample_plan.cpp for the plan's streams).
constexpr uint64_t kAugmentStream = 0x6175676d;  // "augm"

// Publishes the read a builder is blocked in, for the consumer's hang report, while it lasts.
class ReportedRead {
 public:
  ReportedRead(ReadInFlight* in_flight, std::mutex* mutex, ReadInFlight read)
      : in_flight_(in_flight), mutex_(mutex) {
    std::lock_guard<std::mutex> lock(*mutex_);
    *in_flight_ = std::move(read);
  }
  ~ReportedRead() {
    std::lock_guard<std::mutex> lock(*mutex_);
    in_flight_->path.clear();
  }
  ReportedRead(const ReportedRead&) = delete;
  ReportedRead& operator=(const ReportedRead&) = delete;

 private:
  ReadInFlight* in_flight_;
  std::mutex* mutex_;
};

// How many rows, and bytes of each raw field, a batch has (or has room for).
struct Extent {
  uint64_t rows = 0;
  const std::vector<uint64_t>* raw_bytes = nullptr;  // per field; only raw fields count
};

// Lays out the columns of a batch from `base` (nullptr: only measures) with room for `room`,
// each column's shape and byte count describing `filled` (at most `room`). Returns the bytes the
// room takes. Every batch has "__index__" first, then the fields in order (column_of_fields()).
uint64_t lay_out(const std::vector<FieldSpec>& fields, Extent room, Extent filled, std::byte* base,
                 std::vector<BatchColumn>* columns) {
  uint64_t used = 0;
  auto add = [&](std::string name, DType dtype, std::vector<int64_t> shape, uint64_t room_bytes,
                 uint64_t filled_bytes) {
    used = align_up(used, kColumnAlignment);
    if (columns != nullptr) {
      columns->push_back({std::move(name), dtype, std::move(shape),
                          base == nullptr ? nullptr : base + used, filled_bytes, nullptr});
    }
    used += room_bytes;
  };
  const auto n = static_cast<int64_t>(filled.rows);
  add("__index__", DType::kInt64, {n}, room.rows * 8, filled.rows * 8);
  for (size_t f = 0; f < fields.size(); ++f) {
    const FieldSpec& field = fields[f];
    if (field.layout.byte_rows) {
      const uint64_t bytes = (*filled.raw_bytes)[f];
      add(field.name, DType::kUInt8, {static_cast<int64_t>(bytes)}, (*room.raw_bytes)[f], bytes);
      add(field.name + ".offsets", DType::kInt64, {n + 1}, (room.rows + 1) * 8,
          (filled.rows + 1) * 8);
    }
    for (const DecodedColumn& column : field.layout.columns) {
      std::vector<int64_t> shape = {n};
      shape.insert(shape.end(), column.row_shape.begin(), column.row_shape.end());
      const uint64_t row_bytes = column.row_bytes();
      add(field.name + column.suffix, column.dtype, std::move(shape), room.rows * row_bytes,
          filled.rows * row_bytes);
    }
  }
  return used;
}

// The first column of each field in lay_out()'s order.
std::vector<size_t> column_of_fields(const std::vector<FieldSpec>& fields) {
  std::vector<size_t> first;
  size_t column = 1;  // after "__index__"
  for (const FieldSpec& field : fields) {
    first.push_back(column);
    column += (field.layout.byte_rows ? 2 : 0) + field.layout.columns.size();
  }
  return first;
}

// Which columns, in lay_out()'s order, hold a few bytes per sample (indices, labels, offsets):
// cheap to copy whatever the batch size, and exactly what a training loop keeps.
std::vector<bool> per_sample_columns(const std::vector<FieldSpec>& fields) {
  std::vector<bool> per_sample = {true};  // "__index__"
  for (const FieldSpec& field : fields) {
    if (field.layout.byte_rows) per_sample.insert(per_sample.end(), {false, true});
    for (const DecodedColumn& column : field.layout.columns) {
      per_sample.push_back(column.small_rows);
    }
  }
  return per_sample;
}

std::string sample_name(const ShardReader& shard, uint64_t local) {
  return "shard '" + shard.name() + "' sample " + std::to_string(local) + " (key '" +
         std::string(shard.key(local)) + "')";
}

}  // namespace

uint64_t batch_out_bytes(const std::vector<FieldSpec>& fields, uint64_t samples,
                         const std::vector<uint64_t>& raw_bytes) {
  const Extent extent{samples, &raw_bytes};
  return lay_out(fields, extent, extent, nullptr, nullptr);
}

BatchBuilder::BatchBuilder(const Dataset& dataset, const LoaderOptions& options,
                           const std::vector<FieldSpec>& fields, const BlockReads* blocks)
    : dataset_(dataset),
      options_(options),
      fields_(fields),
      column_of_field_(column_of_fields(fields)),
      per_sample_column_(per_sample_columns(fields)),
      shards_(dataset.shard_count()),
      blocks_(blocks),
      written_(fields.size(), 0) {
  for (const FieldSpec& field : fields) {
    scratch_.push_back(field.decoder->make_scratch());
    rows_.emplace_back(field.layout.columns.size(), nullptr);
  }
}

Result<BatchBuilder::Needs> BatchBuilder::plan(const std::vector<uint64_t>& indices) {
  items_.clear();
  raw_bytes_.assign(fields_.size(), 0);
  for (size_t s : shards_held_) shards_[s].reset();
  shards_held_.clear();
  for (uint64_t global : indices) {
    ZW_ASSIGN_OR_RETURN(SampleLocation where, dataset_.locate(global));
    if (shards_[where.shard] == nullptr) {
      ZW_ASSIGN_OR_RETURN(shards_[where.shard], dataset_.shard(where.shard));
      shards_held_.push_back(where.shard);
    }
    const ShardReader& shard = *shards_[where.shard];
    const format::ShardIndex& index = shard.index();
    const format::SampleEntry& entry = index.samples[where.local];
    items_.push_back({where.shard, where.local, entry.offset, entry.size, 0});
    for (const format::FieldEntry& f : index.fields_of(where.local)) {
      const std::string& name = index.names[f.name_id];
      for (size_t i = 0; i < fields_.size(); ++i) {
        if (fields_[i].layout.byte_rows && fields_[i].name == name) {
          raw_bytes_[i] += fields_[i].decoder->row_bytes_room(f.size);
        }
      }
    }
  }

  if (blocks_ != nullptr) {
    ZW_RETURN_IF_ERROR(plan_blocks());
    return Needs{0, batch_out_bytes(fields_, indices.size(), raw_bytes_)};
  }

  // Coalesce reads per shard in file order.
  by_offset_.resize(items_.size());
  for (size_t i = 0; i < items_.size(); ++i) by_offset_[i] = i;
  std::sort(by_offset_.begin(), by_offset_.end(), [&](size_t a, size_t b) {
    return std::tie(items_[a].shard, items_[a].offset) <
           std::tie(items_[b].shard, items_[b].offset);
  });
  const bool direct = options_.io == IoBackend::kDirect;
  const uint64_t alignment = direct ? kDirectIoAlignment : kColumnAlignment;
  ranges_.clear();
  uint64_t buffer_end = 0;
  for (size_t i : by_offset_) {
    Item& item = items_[i];
    Range* last = ranges_.empty() ? nullptr : &ranges_.back();
    const uint64_t item_end = item.offset + item.size;
    const bool merge = last != nullptr && last->shard == item.shard &&
                       item.offset <= last->offset + last->length + kMaxGapBytes &&
                       item_end - last->offset <= kMaxRangeBytes;
    if (merge) {
      const uint64_t new_length = std::max(last->length, item_end - last->offset);
      buffer_end += new_length - last->length;
      last->length = new_length;
    } else {
      buffer_end = align_up(buffer_end, alignment);
      // O_DIRECT reads whole aligned blocks: start the range on a block boundary.
      const uint64_t start = direct ? item.offset / alignment * alignment : item.offset;
      ranges_.push_back({item.shard, start, item_end - start, buffer_end});
      buffer_end += item_end - start;
      last = &ranges_.back();
    }
    item.buffer_pos = last->buffer_pos + (item.offset - last->offset);
  }
  if (direct) {
    // ...and end on one, except at the end of the file (the source reads that tail itself).
    for (Range& r : ranges_) {
      const uint64_t file_size = shards_[r.shard]->source().size();
      const uint64_t end = std::min(file_size, align_up(r.offset + r.length, alignment));
      r.length = end - r.offset;
    }
    buffer_end = 0;
    for (const Range& r : ranges_) buffer_end = std::max(buffer_end, r.buffer_pos + r.length);
    buffer_end = align_up(buffer_end + alignment, alignment);
  }
  return Needs{buffer_end, batch_out_bytes(fields_, indices.size(), raw_bytes_)};
}

BlockReads::Span BlockReads::span(const ShardReader& shard, size_t s, uint64_t local) const {
  const uint64_t per_block = samples_per_block[s];
  const auto& samples = shard.index().samples;
  const uint64_t first = local / per_block * per_block;
  const uint64_t end = std::min<uint64_t>(first + per_block, samples.size());
  uint64_t begin_byte = UINT64_MAX, end_byte = 0;
  for (uint64_t i = first; i < end; ++i) {
    begin_byte = std::min(begin_byte, samples[i].offset);
    end_byte = std::max(end_byte, samples[i].offset + samples[i].size);
  }
  return {begin_byte, end_byte - begin_byte};
}

Status BatchBuilder::plan_blocks() {
  wants_.clear();
  for (Item& item : items_) {
    const uint64_t block = item.local / blocks_->samples_per_block[item.shard];
    auto same = [&](const BlockWindow::Want& w) {
      return w.shard == item.shard && w.block == block;
    };
    auto found = std::find_if(wants_.begin(), wants_.end(), same);
    item.block = static_cast<size_t>(found - wants_.begin());
    if (found != wants_.end()) continue;
    ShardReader& shard = *shards_[item.shard];
    const BlockReads::Span span = blocks_->span(shard, item.shard, item.local);
    wants_.push_back({item.shard, block, span.offset, span.length, &shard.source()});
  }
  return Status::ok();
}

Status BatchBuilder::read_blocks(BuildStats* stats, ReadInFlight* in_flight,
                                 std::mutex* in_flight_mutex) {
  ReportedRead reported(in_flight, in_flight_mutex,
                        {wants_.front().source->name(), wants_.front().offset, wants_.size()});
  return blocks_->window->acquire(wants_, Deadline::after(options_.read_timeout), &held_blocks_,
                                  &stats->bytes_read);
}

Status BatchBuilder::read_ranges(Arena* arena, BuildStats* stats, ReadInFlight* in_flight,
                                 std::mutex* in_flight_mutex) {
  const Deadline deadline = Deadline::after(options_.read_timeout);
  size_t first = 0;
  while (first < ranges_.size()) {
    size_t end = first;
    requests_.clear();
    while (end < ranges_.size() && ranges_[end].shard == ranges_[first].shard) {
      const Range& r = ranges_[end];
      requests_.push_back({r.offset, {arena->read.data() + r.buffer_pos, r.length}});
      stats->bytes_read += r.length;
      ++end;
    }
    ByteSource& source = shards_[ranges_[first].shard]->source();
    ReportedRead reported(in_flight, in_flight_mutex,
                          {source.name(), ranges_[first].offset, requests_.size()});
    ZW_RETURN_IF_ERROR(source.read(requests_, deadline));
    first = end;
  }
  return Status::ok();
}

uint64_t augment_seed(uint64_t seed, uint64_t epoch, uint64_t index) {
  return internal::combine_seed(internal::combine_seed(seed, epoch), index, kAugmentStream);
}

uint64_t BatchBuilder::augment_seed(uint64_t epoch, uint64_t global_index) const {
  return zerowait::augment_seed(options_.shuffle.seed, epoch, global_index);
}

Status BatchBuilder::fill_sample(const Item& item, uint64_t global_index, uint64_t epoch,
                                 std::span<const std::byte> bytes, uint64_t row, Batch::Impl* batch,
                                 uint64_t* raw_filled) {
  const ShardReader& shard = *shards_[item.shard];
  if (options_.verify) ZW_RETURN_IF_ERROR(shard.check_sample(item.local, bytes));
  const SampleView view = shard.make_view(item.local, bytes);
  std::vector<BatchColumn>& columns = batch->columns;
  const uint64_t seed = augment_seed(epoch, global_index);
  for (size_t f = 0; f < fields_.size(); ++f) {
    const FieldSpec& spec = fields_[f];
    const FieldView* field = view.field(spec.name);
    size_t column = column_of_field_[f];
    DecodeOutput out;
    out.seed = seed;
    if (spec.layout.byte_rows) {
      const uint64_t room =
          field == nullptr ? 0 : spec.decoder->row_bytes_room(field->bytes.size());
      out.bytes = {columns[column].data + raw_filled[f], room};
      column += 2;
    }
    std::vector<std::byte*>& rows = rows_[f];
    for (size_t c = 0; c < rows.size(); ++c) {
      rows[c] = columns[column + c].data + row * spec.layout.columns[c].row_bytes();
    }
    out.rows = rows;
    Status decoded = spec.decoder->decode(
        field == nullptr ? std::nullopt : std::optional(field->bytes), out, scratch_[f].get());
    if (!decoded.is_ok()) {
      return corrupt(sample_name(shard, item.local) + ": field '" + spec.name + "' " +
                     decoded.message());
    }
    written_[f] = out.bytes_written;
  }
  // Byte rows: now that nothing else about this sample can fail, take its bytes and record the
  // end offset of its row.
  for (size_t f = 0; f < fields_.size(); ++f) {
    if (!fields_[f].layout.byte_rows) continue;
    raw_filled[f] += written_[f];
    const auto end = static_cast<int64_t>(raw_filled[f]);
    std::memcpy(columns[column_of_field_[f] + 1].data + (row + 1) * 8, &end, 8);
  }
  std::memcpy(columns[0].data + row * 8, &global_index, 8);
  return Status::ok();
}

Status BatchBuilder::build(const std::vector<uint64_t>& indices, uint64_t epoch, Batch::Impl* batch,
                           BuildStats* stats, ReadInFlight* in_flight,
                           std::mutex* in_flight_mutex) {
  Arena* arena = batch->arena;
  const auto read_start = SteadyClock::now();
  if (blocks_ != nullptr) {
    if (!items_.empty()) ZW_RETURN_IF_ERROR(read_blocks(stats, in_flight, in_flight_mutex));
  } else {
    ZW_RETURN_IF_ERROR(read_ranges(arena, stats, in_flight, in_flight_mutex));
  }
  const auto decode_start = SteadyClock::now();
  stats->read += decode_start - read_start;

  const Extent room{indices.size(), &raw_bytes_};
  batch->columns.clear();
  lay_out(fields_, room, room, arena->out.data(), &batch->columns);
  std::vector<uint64_t> raw_filled(fields_.size(), 0);
  for (size_t f = 0; f < fields_.size(); ++f) {
    if (fields_[f].layout.byte_rows) {
      std::memset(batch->columns[column_of_field_[f] + 1].data, 0, 8);  // offsets[0] = 0
    }
  }
  batch->keys.clear();
  uint64_t rows = 0;
  for (size_t i = 0; i < items_.size(); ++i) {
    const Item& item = items_[i];
    const std::span<const std::byte> bytes =
        blocks_ != nullptr
            ? held_blocks_[item.block]->bytes(item.offset, item.size)
            : std::span<const std::byte>(arena->read.data() + item.buffer_pos, item.size);
    Status status = fill_sample(item, indices[i], epoch, bytes, rows, batch, raw_filled.data());
    if (!status.is_ok()) {
      if (status.code() != ErrorCode::kCorrupt) return status;
      // Only this sample is lost: its row is overwritten by the next one. Under kRaise the
      // consumer gets the error first, then the batch without it.
      ++stats->skipped;
      if (options_.on_corrupt == CorruptPolicy::kRaise) stats->corrupt.push_back(status);
      continue;
    }
    if (options_.keys) batch->keys.emplace_back(shards_[item.shard]->key(item.local));
    ++rows;
  }
  // The same places, with shapes that say how many rows (and raw bytes) were filled.
  batch->columns.clear();
  lay_out(fields_, room, {rows, &raw_filled}, arena->out.data(), &batch->columns);
  copy_small_columns(per_sample_column_, batch);
  batch->samples = rows;
  held_blocks_.clear();  // the window decides what stays in memory
  stats->decode += SteadyClock::now() - decode_start;
  return Status::ok();
}

}  // namespace zerowait
