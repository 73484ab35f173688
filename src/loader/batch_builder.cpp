#include "loader/batch_builder.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
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
    switch (field.decode.kind) {
      case FieldDecode::Kind::kRaw:
      case FieldDecode::Kind::kDeviceImage: {
        const uint64_t bytes = (*filled.raw_bytes)[f];
        add(field.name, DType::kUInt8, {static_cast<int64_t>(bytes)}, (*room.raw_bytes)[f], bytes);
        add(field.name + ".offsets", DType::kInt64, {n + 1}, (room.rows + 1) * 8,
            (filled.rows + 1) * 8);
        if (field.decode.kind == FieldDecode::Kind::kDeviceImage) {
          const uint64_t row_bytes = kDeviceCropColumns * sizeof(double);
          add(field.name + ".crop", DType::kFloat64, {n, kDeviceCropColumns}, room.rows * row_bytes,
              filled.rows * row_bytes);
        }
        break;
      }
      case FieldDecode::Kind::kInt:
        add(field.name, DType::kInt64, {n}, room.rows * 8, filled.rows * 8);
        break;
      case FieldDecode::Kind::kImage: {
        const int64_t side = field.decode.image.size;
        const uint64_t row_bytes = uint64_t(side * side * 3);
        add(field.name, DType::kUInt8, {n, side, side, 3}, room.rows * row_bytes,
            filled.rows * row_bytes);
        break;
      }
      case FieldDecode::Kind::kTokens: {
        const TokenWindow& t = field.decode.tokens;
        const int64_t seq_len = t.seq_len;
        const uint64_t row_bytes = uint64_t(seq_len) * t.row_value_bytes();
        add(field.name, t.int32_rows ? DType::kInt32 : DType::kInt64, {n, seq_len},
            room.rows * row_bytes, filled.rows * row_bytes);
        add(field.name + ".lengths", DType::kInt64, {n}, room.rows * 8, filled.rows * 8);
        break;
      }
      case FieldDecode::Kind::kArray: {
        const ArrayField& a = field.decode.array;
        std::vector<int64_t> shape = {n};
        shape.insert(shape.end(), a.shape.begin(), a.shape.end());
        add(field.name, *a.dtype, std::move(shape), room.rows * a.row_bytes(),
            filled.rows * a.row_bytes());
        break;
      }
      case FieldDecode::Kind::kAudio: {
        const AudioClip& a = field.decode.audio;
        add(field.name, DType::kFloat32, {n, int64_t(a.channels), int64_t(a.length)},
            room.rows * a.row_bytes(), filled.rows * a.row_bytes());
        add(field.name + ".lengths", DType::kInt64, {n}, room.rows * 8, filled.rows * 8);
        break;
      }
    }
  }
  return used;
}

// The first column of each field in lay_out()'s order: a raw field has two ("f", "f.offsets"), a
// kDeviceImage field three ("f", "f.offsets", "f.crop").
std::vector<size_t> column_of_fields(const std::vector<FieldSpec>& fields) {
  std::vector<size_t> first;
  size_t column = 1;  // after "__index__"
  for (const FieldSpec& field : fields) {
    first.push_back(column);
    const bool two = field.decode.kind == FieldDecode::Kind::kRaw ||
                     field.decode.kind == FieldDecode::Kind::kTokens ||
                     field.decode.kind == FieldDecode::Kind::kAudio;
    column += field.decode.kind == FieldDecode::Kind::kDeviceImage ? 3 : two ? 2 : 1;
  }
  return first;
}

// Which columns, in lay_out()'s order, hold 8 bytes per sample (indices, labels, offsets): cheap
// to copy whatever the batch size, and exactly what a training loop keeps.
std::vector<bool> per_sample_columns(const std::vector<FieldSpec>& fields) {
  std::vector<bool> per_sample = {true};  // "__index__"
  for (const FieldSpec& field : fields) {
    switch (field.decode.kind) {
      case FieldDecode::Kind::kRaw:
        per_sample.insert(per_sample.end(), {false, true});  // "f", "f.offsets"
        break;
      case FieldDecode::Kind::kInt:
        per_sample.push_back(true);
        break;
      case FieldDecode::Kind::kDeviceImage:
        per_sample.insert(per_sample.end(), {false, true, true});  // "f", "f.offsets", "f.crop"
        break;
      case FieldDecode::Kind::kImage:
      case FieldDecode::Kind::kArray:
        per_sample.push_back(false);
        break;
      case FieldDecode::Kind::kTokens:
      case FieldDecode::Kind::kAudio:
        per_sample.insert(per_sample.end(), {false, true});  // "f", "f.lengths"
        break;
    }
  }
  return per_sample;
}

std::string sample_name(const ShardReader& shard, uint64_t local) {
  return "shard '" + shard.name() + "' sample " + std::to_string(local) + " (key '" +
         std::string(shard.key(local)) + "')";
}

Result<int64_t> parse_label(std::span<const std::byte> bytes) {
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    const std::string shown(text.substr(0, 32));
    return corrupt("is not a decimal integer ('" + shown + "')");
  }
  return value;
}

}  // namespace

uint64_t row_bytes_room(const FieldDecode& decode, uint64_t field_bytes) {
  if (decode.kind != FieldDecode::Kind::kDeviceImage) return field_bytes;
  const uint64_t side = uint64_t(decode.image.size);
  return std::max(field_bytes, side * side * 3);
}

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
      decoded_here_(fields.size(), false) {}

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
        const FieldDecode::Kind kind = fields_[i].decode.kind;
        const bool bytes_column =
            kind == FieldDecode::Kind::kRaw || kind == FieldDecode::Kind::kDeviceImage;
        if (bytes_column && fields_[i].name == name) {
          raw_bytes_[i] += row_bytes_room(fields_[i].decode, f.size);
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

Status BatchBuilder::plan_blocks() {
  wants_.clear();
  for (Item& item : items_) {
    const uint64_t per_block = blocks_->samples_per_block[item.shard];
    const uint64_t block = item.local / per_block;
    auto same = [&](const BlockWindow::Want& w) {
      return w.shard == item.shard && w.block == block;
    };
    auto found = std::find_if(wants_.begin(), wants_.end(), same);
    item.block = static_cast<size_t>(found - wants_.begin());
    if (found != wants_.end()) continue;
    // The block's bytes: from its first sample's start to its last one's end (samples are
    // stored in index order, but the span is taken over all of them to rely on nothing).
    ShardReader& shard = *shards_[item.shard];
    const auto& samples = shard.index().samples;
    const uint64_t first = block * per_block;
    const uint64_t end = std::min<uint64_t>(first + per_block, samples.size());
    uint64_t begin_byte = UINT64_MAX, end_byte = 0;
    for (uint64_t local = first; local < end; ++local) {
      begin_byte = std::min(begin_byte, samples[local].offset);
      end_byte = std::max(end_byte, samples[local].offset + samples[local].size);
    }
    wants_.push_back({item.shard, block, begin_byte, end_byte - begin_byte, &shard.source()});
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
  for (size_t f = 0; f < fields_.size(); ++f) {
    const FieldSpec& spec = fields_[f];
    const FieldView* field = view.field(spec.name);
    BatchColumn& column = columns[column_of_field_[f]];
    auto field_error = [&](const std::string& what) {
      return corrupt(sample_name(shard, item.local) + ": field '" + spec.name + "' " + what);
    };
    switch (spec.decode.kind) {
      case FieldDecode::Kind::kRaw:
        break;  // copied below, once nothing else about this sample can fail
      case FieldDecode::Kind::kDeviceImage: {
        if (field == nullptr) return field_error("is missing");
        // An image decoded here lands where the row's bytes go (the room has space for it,
        // row_bytes_room); a JPEG is copied below, like a raw field.
        const ImageTransform& t = spec.decode.image;
        const uint64_t pixel_bytes = uint64_t(t.size) * t.size * 3;
        auto* pixels = reinterpret_cast<uint8_t*>(column.data + raw_filled[f]);
        Result<DeviceCrop> crop = decoder_.prepare_for_device(
            field->bytes, t, augment_seed(epoch, global_index), {pixels, pixel_bytes});
        if (!crop.is_ok()) return field_error(crop.status().message());
        decoded_here_[f] = crop->decoded;
        double row_values[kDeviceCropColumns];
        row_values[kDeviceCropX0] = crop->area.x0;
        row_values[kDeviceCropY0] = crop->area.y0;
        row_values[kDeviceCropX1] = crop->area.x1;
        row_values[kDeviceCropY1] = crop->area.y1;
        row_values[kDeviceCropFlip] = crop->area.flip ? 1.0 : 0.0;
        row_values[kDeviceCropWidth] = crop->width;
        row_values[kDeviceCropHeight] = crop->height;
        row_values[kDeviceCropDecoded] = crop->decoded ? 1.0 : 0.0;
        std::memcpy(columns[column_of_field_[f] + 2].data + row * sizeof row_values, row_values,
                    sizeof row_values);
        break;
      }
      case FieldDecode::Kind::kInt: {
        if (field == nullptr) return field_error("is missing");
        Result<int64_t> label = parse_label(field->bytes);
        if (!label.is_ok()) return field_error(label.status().message());
        std::memcpy(column.data + row * 8, &label.value(), 8);
        break;
      }
      case FieldDecode::Kind::kImage: {
        if (field == nullptr) return field_error("is missing");
        const ImageTransform& t = spec.decode.image;
        const uint64_t row_bytes = uint64_t(t.size) * t.size * 3;
        auto* out = reinterpret_cast<uint8_t*>(column.data + row * row_bytes);
        Status decoded =
            decoder_.decode(field->bytes, t, augment_seed(epoch, global_index), {out, row_bytes});
        if (!decoded.is_ok()) return field_error(decoded.message());
        break;
      }
      case FieldDecode::Kind::kTokens: {
        if (field == nullptr) return field_error("is missing");
        const TokenWindow& t = spec.decode.tokens;
        std::byte* out = column.data + row * t.seq_len * t.row_value_bytes();
        Result<uint64_t> taken = t.decode(field->bytes, augment_seed(epoch, global_index), out);
        if (!taken.is_ok()) return field_error(taken.status().message());
        const auto length = static_cast<int64_t>(*taken);
        std::memcpy(columns[column_of_field_[f] + 1].data + row * 8, &length, 8);
        break;
      }
      case FieldDecode::Kind::kArray: {
        if (field == nullptr) return field_error("is missing");
        const ArrayField& a = spec.decode.array;
        Status copied = a.decode(field->bytes, column.data + row * a.row_bytes());
        if (!copied.is_ok()) return field_error(copied.message());
        break;
      }
      case FieldDecode::Kind::kAudio: {
        if (field == nullptr) return field_error("is missing");
        const AudioClip& a = spec.decode.audio;
        auto* out = reinterpret_cast<float*>(column.data + row * a.row_bytes());
        Result<uint64_t> frames = a.decode(field->bytes, augment_seed(epoch, global_index), out);
        if (!frames.is_ok()) return field_error(frames.status().message());
        const auto length = static_cast<int64_t>(*frames);
        std::memcpy(columns[column_of_field_[f] + 1].data + row * 8, &length, 8);
        break;
      }
    }
  }
  // Raw and kDeviceImage fields: append the bytes, record the end offset of this row.
  for (size_t f = 0; f < fields_.size(); ++f) {
    const FieldDecode& decode = fields_[f].decode;
    if (decode.kind != FieldDecode::Kind::kRaw && decode.kind != FieldDecode::Kind::kDeviceImage) {
      continue;
    }
    const FieldView* field = view.field(fields_[f].name);
    const size_t column = column_of_field_[f];
    uint64_t size = field == nullptr ? 0 : field->bytes.size();
    if (decode.kind == FieldDecode::Kind::kDeviceImage && decoded_here_[f]) {
      size = uint64_t(decode.image.size) * decode.image.size * 3;  // already in place
    } else if (size > 0) {
      std::memcpy(columns[column].data + raw_filled[f], field->bytes.data(), size);
    }
    raw_filled[f] += size;
    const auto end = static_cast<int64_t>(raw_filled[f]);
    std::memcpy(columns[column + 1].data + (row + 1) * 8, &end, 8);
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
    const FieldDecode::Kind kind = fields_[f].decode.kind;
    if (kind == FieldDecode::Kind::kRaw || kind == FieldDecode::Kind::kDeviceImage) {
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
