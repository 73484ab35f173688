#include "zerowait/shard/writer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "common/xxhash.hpp"

namespace zerowait {
namespace {

constexpr size_t kWriteBufferSize = 4 << 20;
// With sync on, writeback of each this many bytes starts right away, so the disk works while
// pack reads inputs and the final fsync has little left to wait for.
constexpr uint64_t kWritebackChunk = 16 << 20;
constexpr uint64_t kBlock = 4096;  // unit of hole detection

bool all_zero(const std::byte* p, size_t n) {
  // Compressed data rarely starts with zeros, so this returns on the first word almost always.
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    if (w != 0) return false;
  }
  for (; i < n; ++i) {
    if (p[i] != std::byte{0}) return false;
  }
  return true;
}

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace

struct ShardWriter::State {
  std::unique_ptr<WritableFile> file;
  std::string path;  // for messages
  ShardWriterOptions options;
  format::ShardIndex index;
  uint64_t file_size = 0;         // bytes appended so far (buffered ones included)
  std::vector<std::byte> buffer;  // pending bytes, starting at file offset buffer_start
  uint64_t buffer_start = 0;
  uint64_t writeback_start = 0;  // bytes below this offset were handed to writeback
  bool finished = false;

  Deadline call_deadline() const { return Deadline::after(options.write_timeout); }

  // Writes `data` at `offset`, leaving 4 KiB blocks of zeros as holes.
  Status write_out(std::span<const std::byte> data, uint64_t offset) {
    size_t pos = 0;
    while (pos < data.size()) {
      // Extend a run of non-zero blocks, then write it with one pwrite.
      size_t run_end = pos;
      while (run_end < data.size()) {
        const uint64_t file_pos = offset + run_end;
        const size_t len = std::min<uint64_t>(kBlock - file_pos % kBlock, data.size() - run_end);
        if (all_zero(data.data() + run_end, len)) break;
        run_end += len;
      }
      if (run_end > pos) {
        ZW_RETURN_IF_ERROR(
            file->write_at(offset + pos, data.subspan(pos, run_end - pos), call_deadline())
                .with_context("cannot write shard '" + path + "'"));
        pos = run_end;
        continue;
      }
      const uint64_t file_pos = offset + pos;
      pos += std::min<uint64_t>(kBlock - file_pos % kBlock, data.size() - pos);  // skip a hole
    }
    return Status::ok();
  }

  Status flush() {
    if (buffer.empty()) return Status::ok();
    Status st = write_out(buffer, buffer_start);
    buffer_start += buffer.size();
    buffer.clear();
    start_writeback();
    return st;
  }

  void start_writeback() {
    if (!options.sync || buffer_start - writeback_start < kWritebackChunk) return;
    // Advisory: a failure here only loses the overlap; fsync in finish() reports real errors.
    file->start_writeback(writeback_start, buffer_start - writeback_start, call_deadline());
    writeback_start = buffer_start;
  }

  Status append(std::span<const std::byte> data) {
    file_size += data.size();
    if (buffer.size() + data.size() <= kWriteBufferSize) {
      buffer.insert(buffer.end(), data.begin(), data.end());
      return Status::ok();
    }
    ZW_RETURN_IF_ERROR(flush());
    if (data.size() >= kWriteBufferSize) {  // large fields go straight to the file
      ZW_RETURN_IF_ERROR(write_out(data, buffer_start));
      buffer_start += data.size();
      start_writeback();
      return Status::ok();
    }
    buffer.assign(data.begin(), data.end());
    return Status::ok();
  }

  Status pad_to_alignment() {
    static const std::vector<std::byte> zeros(format::kAlignment);
    const uint64_t rem = file_size % format::kAlignment;
    if (rem == 0) return Status::ok();
    return append(std::span<const std::byte>(zeros).first(format::kAlignment - rem));
  }
};

ShardWriter::ShardWriter(std::unique_ptr<State> state) : state_(std::move(state)) {}
ShardWriter::ShardWriter(ShardWriter&&) noexcept = default;
ShardWriter& ShardWriter::operator=(ShardWriter&&) noexcept = default;
ShardWriter::~ShardWriter() = default;

Result<ShardWriter> ShardWriter::create(const std::string& path, ShardWriterOptions options) {
  const std::filesystem::path at(path);
  const std::filesystem::path dir = at.has_parent_path() ? at.parent_path() : ".";
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                      make_local_store(dir)->create(at.filename().string(), metadata_deadline()));
  return create(std::move(file), path, options);
}

Result<ShardWriter> ShardWriter::create(std::unique_ptr<WritableFile> file, std::string path,
                                        ShardWriterOptions options) {
  auto state = std::make_unique<State>();
  state->file = std::move(file);
  state->path = std::move(path);
  state->options = options;
  state->buffer.reserve(kWriteBufferSize);
  ZW_RETURN_IF_ERROR(state->append(
      as_bytes(format::encode_header(options.align_samples ? format::kAligned : 0u))));
  return ShardWriter(std::move(state));
}

uint64_t ShardWriter::sample_checksum(std::span<const FieldData> fields) {
  if (fields.size() == 1) return format::checksum(fields[0].bytes);
  internal::Xxh3Stream hash;
  for (const FieldData& f : fields) hash.update(f.bytes.data(), f.bytes.size());
  return hash.digest();
}

Status ShardWriter::add_sample(std::string_view key, std::span<const FieldData> fields) {
  return add_sample(key, fields, sample_checksum(fields));
}

Status ShardWriter::add_sample(std::string_view key, std::span<const FieldData> fields,
                               uint64_t checksum) {
  State& s = *state_;
  if (s.finished) return invalid_argument("shard '" + s.path + "' is already finished");
  if (key.empty()) return invalid_argument("empty sample key in shard '" + s.path + "'");
  for (size_t i = 0; i < fields.size(); ++i) {
    const auto& name = fields[i].name;
    if (name.empty() || name.find('/') != std::string_view::npos) {
      return invalid_argument("sample '" + std::string(key) + "': bad field name '" +
                              std::string(name) + "'");
    }
    for (size_t j = 0; j < i; ++j) {
      if (fields[j].name == name) {
        return invalid_argument("sample '" + std::string(key) + "': field '" + std::string(name) +
                                "' given twice");
      }
    }
  }
  if (s.options.align_samples) ZW_RETURN_IF_ERROR(s.pad_to_alignment());

  format::SampleEntry entry;
  entry.offset = s.file_size;
  entry.first_field = s.index.fields.size();
  entry.field_count = static_cast<uint32_t>(fields.size());
  entry.key_offset = s.index.strings.size();
  entry.key_size = static_cast<uint32_t>(key.size());
  for (const FieldData& field : fields) {
    s.index.fields.push_back(
        {s.index.intern_name(field.name), s.file_size, static_cast<uint64_t>(field.bytes.size())});
    ZW_RETURN_IF_ERROR(s.append(field.bytes));
  }
  entry.size = s.file_size - entry.offset;
  entry.checksum = checksum;
  s.index.strings.append(key);
  s.index.samples.push_back(entry);
  return Status::ok();
}

Result<ShardSummary> ShardWriter::finish() {
  State& s = *state_;
  if (s.finished) return invalid_argument("shard '" + s.path + "' is already finished");
  s.finished = true;
  const std::string index_bytes = s.index.serialize();
  format::Footer footer;
  footer.index_offset = s.file_size;
  footer.index_size = index_bytes.size();
  footer.index_checksum = format::checksum(as_bytes(index_bytes));
  footer.sample_count = s.index.sample_count();
  footer.flags = s.options.align_samples ? format::kAligned : 0u;
  ZW_RETURN_IF_ERROR(s.append(as_bytes(index_bytes)));
  ZW_RETURN_IF_ERROR(s.append(as_bytes(format::encode_footer(footer))));
  ZW_RETURN_IF_ERROR(s.flush());
  // No hole at the end can shorten the file: the footer, last, ends in its magic number.
  if (s.options.sync) ZW_RETURN_IF_ERROR(s.file->sync(s.call_deadline()));
  ZW_RETURN_IF_ERROR(s.file->close(s.call_deadline()));
  return ShardSummary{s.index.sample_count(), s.file_size, footer.index_checksum};
}

uint64_t ShardWriter::samples() const { return state_->index.sample_count(); }
uint64_t ShardWriter::bytes_written() const { return state_->file_size; }
const std::string& ShardWriter::path() const { return state_->path; }

}  // namespace zerowait
