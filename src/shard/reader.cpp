#include "zerowait/shard/reader.hpp"

#include <algorithm>

#include "zerowait/shard/webdataset.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

constexpr uint64_t kVerifyChunkBytes = 4 << 20;  // sequential reads of this size in verify()

// What opening a shard reads besides its footer. Locally: the header, then the index, each read
// exactly. Over the network, where every request is a round trip (and, at a thousand nodes, a
// GET against the object store's per-prefix limit): only the shard's tail, a 64th of it (64 KiB
// to 1 MiB), or all of it when that is small. The index lies just before the footer, so it
// usually comes in the same request; it is a second one when samples average under ~6 KB. The
// header holds nothing the footer does not (magic, version, flags): verify() checks it.
struct OpenReads {
  uint64_t tail_bytes = format::kFooterSize;
  bool header = true;  // read and checked at open
};

OpenReads open_reads(const ByteSource& source) {
  if (!reads_over_network(source.name())) return {};
  constexpr uint64_t kMin = 64 << 10, kMax = 1 << 20;
  const uint64_t tail = std::min(source.size(), std::clamp(source.size() / 64, kMin, kMax));
  return {tail, /*header=*/tail == source.size()};
}

Status check_header(std::span<const std::byte> header, uint32_t footer_flags,
                    const std::string& name) {
  uint32_t header_flags = 0;
  ZW_RETURN_IF_ERROR(format::decode_header(header, &header_flags, name));
  if (footer_flags != header_flags) {
    return corrupt("shard '" + name + "': header flags " + std::to_string(header_flags) +
                   " differ from footer flags " + std::to_string(footer_flags));
  }
  return Status::ok();
}

}  // namespace

const FieldView* SampleView::field(std::string_view name) const {
  for (const FieldView& f : fields) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

ShardReader::ShardReader(std::shared_ptr<ByteSource> source, format::ShardIndex index,
                         uint32_t flags, ShardKind kind, uint64_t index_checksum)
    : source_(std::move(source)),
      index_(std::move(index)),
      flags_(flags),
      kind_(kind),
      index_checksum_(index_checksum) {}

Result<std::shared_ptr<ShardReader>> ShardReader::open(std::shared_ptr<ByteSource> source) {
  const std::string& name = source->name();
  const uint64_t size = source->size();
  if (size < format::kHeaderSize + format::kFooterSize) {
    return corrupt("'" + name + "' is too small to be a shard (" + std::to_string(size) +
                   " bytes; a shard has at least " +
                   std::to_string(format::kHeaderSize + format::kFooterSize) + "): truncated?");
  }
  const OpenReads reads = open_reads(*source);
  std::vector<std::byte> tail(reads.tail_bytes);
  const uint64_t tail_offset = size - tail.size();
  std::byte header[format::header_at::kEnd];
  std::vector<ReadRequest> requests = {{tail_offset, tail}};
  if (reads.header && tail_offset > 0) requests.push_back({0, header});
  // Header, footer and index are metadata: a cache fetches them without their whole blocks.
  ZW_RETURN_IF_ERROR(source->read_metadata(requests, Deadline::none()));
  if (reads.header && tail_offset == 0) std::copy_n(tail.begin(), sizeof header, header);
  const std::span<const std::byte> footer_bytes =
      std::span<const std::byte>(tail).last(format::kFooterSize);
  ZW_ASSIGN_OR_RETURN(format::Footer footer, format::decode_footer(footer_bytes, size, name));
  if (reads.header) ZW_RETURN_IF_ERROR(check_header(header, footer.flags, name));
  std::vector<std::byte> index_bytes(footer.index_size);
  if (footer.index_offset >= tail_offset) {
    // decode_footer checked that the index lies before the footer.
    std::copy_n(tail.begin() + static_cast<ptrdiff_t>(footer.index_offset - tail_offset),
                index_bytes.size(), index_bytes.begin());
  } else {
    const ReadRequest index_request{footer.index_offset, index_bytes};
    ZW_RETURN_IF_ERROR(source->read_metadata({&index_request, 1}, Deadline::none()));
  }
  if (format::checksum(index_bytes) != footer.index_checksum) {
    return corrupt("shard '" + name + "': index checksum mismatch (index at offset " +
                   std::to_string(footer.index_offset) + ", " + std::to_string(footer.index_size) +
                   " bytes)");
  }
  ZW_ASSIGN_OR_RETURN(
      format::ShardIndex index,
      format::ShardIndex::parse(index_bytes, footer.data_offset, footer.index_offset, name));
  if (index.sample_count() != footer.sample_count) {
    return corrupt("shard '" + name + "': footer says " + std::to_string(footer.sample_count) +
                   " samples, the index holds " + std::to_string(index.sample_count()));
  }
  if (footer.flags & format::kAligned) {
    for (uint64_t i = 0; i < index.sample_count(); ++i) {
      if (index.samples[i].offset % format::kAlignment != 0) {
        return corrupt("shard '" + name + "': sample " + std::to_string(i) +
                       " is not 4 KiB aligned in an aligned shard");
      }
    }
  }
  return std::make_shared<ShardReader>(std::move(source), std::move(index), footer.flags,
                                       ShardKind::kNative, footer.index_checksum);
}

Result<std::shared_ptr<ShardReader>> ShardReader::open_path(const std::string& path,
                                                            IoBackend backend) {
  if (path.ends_with(".tar")) return open_tar_shard(path, backend);
  ZW_ASSIGN_OR_RETURN(std::shared_ptr<ByteSource> source,
                      open_source(path, backend, open_deadline()));
  return open(std::move(source));
}

SampleView ShardReader::make_view(uint64_t i, std::span<const std::byte> bytes) const {
  const format::SampleEntry& s = index_.samples[i];
  SampleView view;
  view.index = i;
  view.key = index_.key(i);
  view.bytes = bytes;
  view.fields.reserve(s.field_count);
  for (const format::FieldEntry& f : index_.fields_of(i)) {
    view.fields.push_back({index_.names[f.name_id], bytes.subspan(f.offset - s.offset, f.size)});
  }
  return view;
}

Status ShardReader::check_sample(uint64_t i, std::span<const std::byte> bytes) const {
  if (!has_checksums()) return Status::ok();
  const uint64_t expected = index_.samples[i].checksum;
  const uint64_t actual = format::checksum(bytes);
  if (actual == expected) return Status::ok();
  return corrupt("shard '" + name() + "' sample " + std::to_string(i) + " (key '" +
                 std::string(key(i)) + "', offset " + std::to_string(index_.samples[i].offset) +
                 "): checksum mismatch (stored " + format::checksum_hex(expected) + ", read " +
                 format::checksum_hex(actual) + ")");
}

Result<SampleView> ShardReader::read_sample(uint64_t i, std::span<std::byte> buffer,
                                            const ReadOptions& options) const {
  if (i >= size()) {
    return invalid_argument("sample " + std::to_string(i) + " out of range: shard '" + name() +
                            "' has " + std::to_string(size()) + " samples");
  }
  const format::SampleEntry& s = index_.samples[i];
  if (buffer.size() < s.size) {
    return invalid_argument("buffer of " + std::to_string(buffer.size()) + " bytes for sample " +
                            std::to_string(i) + " of " + std::to_string(s.size) + " bytes");
  }
  auto bytes = buffer.first(s.size);
  ZW_RETURN_IF_ERROR(source_->read_at(s.offset, bytes, options.deadline));
  if (options.verify) ZW_RETURN_IF_ERROR(check_sample(i, bytes));
  return make_view(i, bytes);
}

Result<Sample> ShardReader::read_sample(uint64_t i, const ReadOptions& options) const {
  if (i >= size()) {
    return invalid_argument("sample " + std::to_string(i) + " out of range: shard '" + name() +
                            "' has " + std::to_string(size()) + " samples");
  }
  Sample sample;
  sample.buffer.resize(index_.samples[i].size);
  ZW_ASSIGN_OR_RETURN(sample.view, read_sample(i, sample.buffer, options));
  return sample;
}

uint64_t ShardReader::span_bytes(uint64_t first, uint64_t count) const {
  if (count == 0 || first >= size()) return 0;
  const uint64_t last = std::min(first + count, size()) - 1;
  return index_.samples[last].offset + index_.samples[last].size - index_.samples[first].offset;
}

Result<std::vector<SampleView>> ShardReader::read_samples(uint64_t first, uint64_t count,
                                                          std::span<std::byte> buffer,
                                                          const ReadOptions& options) const {
  if (first > size() || count > size() - first) {
    return invalid_argument("samples [" + std::to_string(first) + ", +" + std::to_string(count) +
                            ") out of range: shard '" + name() + "' has " + std::to_string(size()) +
                            " samples");
  }
  const uint64_t bytes = span_bytes(first, count);
  if (buffer.size() < bytes) {
    return invalid_argument("buffer of " + std::to_string(buffer.size()) + " bytes for " +
                            std::to_string(bytes) + " bytes of samples");
  }
  std::vector<SampleView> views;
  if (count == 0) return views;
  const uint64_t base = index_.samples[first].offset;
  ZW_RETURN_IF_ERROR(source_->read_at(base, buffer.first(bytes), options.deadline));
  views.reserve(count);
  for (uint64_t i = first; i < first + count; ++i) {
    const format::SampleEntry& s = index_.samples[i];
    auto sample_bytes = std::span<const std::byte>(buffer).subspan(s.offset - base, s.size);
    if (options.verify) ZW_RETURN_IF_ERROR(check_sample(i, sample_bytes));
    views.push_back(make_view(i, sample_bytes));
  }
  return views;
}

Status ShardReader::scan(const std::function<Status(std::span<const SampleView>)>& visit,
                         const ScanOptions& options) const {
  if (size() == 0) return Status::ok();
  source_->advise_sequential();
  const uint64_t data_end = index_.samples.back().offset + index_.samples.back().size;
  uint64_t prefetched_until = index_.samples.front().offset;
  std::vector<std::byte> buffer;
  ReadOptions read_options{options.verify, options.deadline};
  for (uint64_t first = 0; first < size();) {
    uint64_t count = 1;
    while (first + count < size() && span_bytes(first, count + 1) <= options.chunk_bytes) ++count;
    // Keep `prefetch_bytes` of hints in flight beyond the chunk read now.
    const uint64_t position = index_.samples[first].offset;
    const uint64_t target =
        std::min(data_end, position + options.chunk_bytes + options.prefetch_bytes);
    if (options.prefetch_bytes > 0 && target > prefetched_until) {
      source_->prefetch(std::max(prefetched_until, position),
                        target - std::max(prefetched_until, position));
      prefetched_until = target;
    }
    buffer.resize(std::max<uint64_t>(buffer.size(), span_bytes(first, count)));
    ZW_ASSIGN_OR_RETURN(std::vector<SampleView> views,
                        read_samples(first, count, buffer, read_options));
    ZW_RETURN_IF_ERROR(visit(views));
    first += count;
  }
  return Status::ok();
}

Result<uint64_t> ShardReader::verify(const std::function<void(const BadSample&)>& on_bad,
                                     const std::function<void(uint64_t)>& on_progress) const {
  if (kind_ == ShardKind::kNative) {
    // A shard opened over the network was opened without reading its header.
    std::byte header[format::header_at::kEnd];
    const ReadRequest request{0, header};
    ZW_RETURN_IF_ERROR(source_->read_metadata({&request, 1}, Deadline::none()));
    ZW_RETURN_IF_ERROR(check_header(header, flags_, source_->name()));
  }
  uint64_t bad = 0;
  ScanOptions options;
  options.chunk_bytes = kVerifyChunkBytes;
  ZW_RETURN_IF_ERROR(scan(
      [&](std::span<const SampleView> views) {
        uint64_t bytes = 0;
        for (const SampleView& v : views) {
          bytes += v.bytes.size();
          if (!has_checksums()) continue;
          const format::SampleEntry& s = index_.samples[v.index];
          const uint64_t actual = format::checksum(v.bytes);
          if (actual == s.checksum) continue;
          ++bad;
          if (on_bad) {
            on_bad({v.index, std::string(v.key),
                    "checksum mismatch at offset " + std::to_string(s.offset) + " (stored " +
                        format::checksum_hex(s.checksum) + ", read " +
                        format::checksum_hex(actual) + ")"});
          }
        }
        if (on_progress) on_progress(bytes);
        return Status::ok();
      },
      options));
  return bad;
}

}  // namespace zerowait
