// Tar headers parsed by hand: libarchive would do it, but it is not among the project's
// dependencies, and the index builder needs header offsets and seek-over-data reads that a
// streaming API hides. Formats: v7, ustar (prefix), GNU (base-256, 'L'/'K' long names), pax.
#include "shard/tar/tar_header.hpp"

#include <algorithm>
#include <array>

#include "common/align.hpp"

namespace zerowait::internal {
namespace {

constexpr size_t kNameOffset = 0, kNameSize = 100;
constexpr size_t kSizeOffset = 124, kSizeSize = 12;
constexpr size_t kChecksumOffset = 148, kChecksumSize = 8;
constexpr size_t kTypeOffset = 156;
constexpr size_t kMagicOffset = 257;
constexpr size_t kPrefixOffset = 345, kPrefixSize = 155;
// Sizes beyond this are corruption, and the limit keeps offset arithmetic far from overflow.
constexpr uint64_t kMaxNumber = uint64_t{1} << 62;
// Bytes read or skipped per step when a member's data is consumed.
constexpr uint64_t kDataChunk = 16 << 20;

std::string_view field_string(const unsigned char* p, size_t size) {
  const char* s = reinterpret_cast<const char*>(p);
  return std::string_view(s, std::find(s, s + size, '\0') - s);
}

// Octal with optional leading spaces, ended by NUL, space or the field's end; or GNU base-256
// (leading byte 0x80, big-endian; 0xff and the star sign bit 0x40 mean negative).
Result<uint64_t> parse_number(const unsigned char* p, size_t size, const char* what) {
  uint64_t value = 0;
  if (p[0] & 0x80) {
    if (p[0] & 0x40) return corrupt(std::string("negative base-256 ") + what + " field");
    value = p[0] & 0x3f;
    for (size_t i = 1; i < size; ++i) {
      if (value > (kMaxNumber >> 8)) return corrupt(std::string(what) + " field too large");
      value = (value << 8) | p[i];
    }
    if (value > kMaxNumber) return corrupt(std::string(what) + " field too large");
    return value;
  }
  size_t i = 0;
  while (i < size && p[i] == ' ') ++i;
  for (; i < size && p[i] != '\0' && p[i] != ' '; ++i) {
    if (p[i] < '0' || p[i] > '7') {
      return corrupt(std::string("bad octal digit 0x") + "0123456789abcdef"[p[i] >> 4] +
                     "0123456789abcdef"[p[i] & 15] + " in " + what + " field");
    }
    value = value * 8 + (p[i] - '0');  // at most 12 digits: 36 bits, no overflow
  }
  return value;
}

Result<uint64_t> parse_decimal(std::string_view s, const char* what) {
  const bool digits_only =
      std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (s.empty() || s.size() > 18 || !digits_only) {
    return corrupt(std::string("bad ") + what + " '" + std::string(s.substr(0, 24)) + "'");
  }
  uint64_t value = 0;
  for (char c : s) value = value * 10 + static_cast<uint64_t>(c - '0');
  return value;
}

}  // namespace

Result<bool> parse_tar_header(std::span<const std::byte, kTarBlockSize> block, TarHeader* out) {
  const auto* b = reinterpret_cast<const unsigned char*>(block.data());
  if (std::all_of(b, b + kTarBlockSize, [](unsigned char c) { return c == 0; })) return false;

  auto stored = parse_number(b + kChecksumOffset, kChecksumSize, "checksum");
  if (!stored.is_ok()) return corrupt("bad header checksum: " + stored.status().message());
  // The checksum field counts as eight spaces; old tars summed signed chars, so accept both.
  int64_t unsigned_sum = 8 * ' ', signed_sum = 8 * ' ';
  for (size_t i = 0; i < kTarBlockSize; ++i) {
    if (i >= kChecksumOffset && i < kChecksumOffset + kChecksumSize) continue;
    unsigned_sum += b[i];
    signed_sum += static_cast<signed char>(b[i]);
  }
  if (static_cast<int64_t>(*stored) != unsigned_sum &&
      static_cast<int64_t>(*stored) != signed_sum) {
    return corrupt("bad header checksum: stored " + std::to_string(*stored) + ", computed " +
                   std::to_string(unsigned_sum) + " (not a tar archive, or a damaged header)");
  }

  ZW_ASSIGN_OR_RETURN(out->size, parse_number(b + kSizeOffset, kSizeSize, "size"));
  out->type = static_cast<char>(b[kTypeOffset]);
  out->name = std::string(field_string(b + kNameOffset, kNameSize));
  // Only POSIX ustar has a prefix; GNU tar ("ustar  \0") keeps times in that area.
  static constexpr unsigned char kUstarMagic[6] = {'u', 's', 't', 'a', 'r', '\0'};
  if (std::equal(kUstarMagic, kUstarMagic + 6, b + kMagicOffset)) {
    std::string_view prefix = field_string(b + kPrefixOffset, kPrefixSize);
    if (!prefix.empty()) out->name = std::string(prefix) + "/" + out->name;
  }
  return true;
}

Status parse_pax_records(std::string_view data, PaxOverrides* out) {
  size_t pos = 0;
  while (pos < data.size()) {
    if (data[pos] == '\0') break;  // some writers pad the record area with NULs
    const std::string where = "bad pax record at byte " + std::to_string(pos) + ": ";
    const size_t space = data.find(' ', pos);
    if (space == std::string_view::npos) return corrupt(where + "no length");
    auto length = parse_decimal(data.substr(pos, space - pos), "record length");
    if (!length.is_ok()) return corrupt(where + length.status().message());
    if (*length <= space - pos + 1 || *length > data.size() - pos) {
      return corrupt(where + "length " + std::to_string(*length) + " does not fit the " +
                     std::to_string(data.size()) + "-byte header");
    }
    std::string_view record = data.substr(space + 1, pos + *length - space - 1);
    if (record.back() != '\n') return corrupt(where + "no newline at its end");
    record.remove_suffix(1);
    const size_t eq = record.find('=');
    if (eq == std::string_view::npos) return corrupt(where + "no '='");
    std::string_view key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      // An empty value removes the override (POSIX).
      out->path = value.empty() ? std::nullopt : std::optional<std::string>(value);
    } else if (key == "size") {
      auto size = parse_decimal(value, "pax size");
      if (!size.is_ok()) return corrupt(where + size.status().message());
      if (*size > kMaxNumber) return corrupt(where + "pax size too large");
      out->size = *size;
    }
    pos += *length;
  }
  return Status::ok();
}

Status TarWalker::error(uint64_t offset, const std::string& what) const {
  return corrupt("tar '" + archive_ + "' at offset " + std::to_string(offset) + ": " + what);
}

Result<bool> TarWalker::end_of_archive() {
  done_ = true;
  ZW_RETURN_IF_ERROR(input_->finish());
  return false;
}

Status TarWalker::truncated(uint64_t header_offset, uint64_t data_offset, uint64_t size,
                            uint64_t archive_end) const {
  if (archive_end >= data_offset + size) {
    return error(header_offset, "archive ends at " + std::to_string(archive_end) +
                                    " inside the padding after the member's data");
  }
  return error(header_offset, "member data truncated: needs " + std::to_string(size) +
                                  " bytes, archive ends at " + std::to_string(archive_end));
}

Status TarWalker::skip_to(uint64_t offset) {
  while (input_->position() < offset) {
    const uint64_t want = offset - input_->position();
    ZW_ASSIGN_OR_RETURN(uint64_t skipped, input_->skip(want));
    if (skipped == 0) {
      return truncated(current_.header_offset, current_.data_offset, current_.size,
                       input_->position());
    }
  }
  return Status::ok();
}

Status TarWalker::skip_record(uint64_t header_offset, uint64_t data_offset, uint64_t size) {
  current_ = TarMember();
  current_.size = size;
  current_.header_offset = header_offset;
  current_.data_offset = data_offset;
  return skip_to(data_offset + align_up(size, kTarBlockSize));
}

Result<std::string> TarWalker::read_metadata(uint64_t header_offset, uint64_t size) {
  if (size > kTarMaxMetadataSize) {
    return error(header_offset, "metadata record of " + std::to_string(size) +
                                    " bytes is larger than the limit of " +
                                    std::to_string(kTarMaxMetadataSize));
  }
  const uint64_t data_offset = input_->position();
  std::string data(size, '\0');
  ZW_ASSIGN_OR_RETURN(size_t got, input_->read(std::as_writable_bytes(std::span(data))));
  if (got < size) return truncated(header_offset, data_offset, size, data_offset + got);
  ZW_RETURN_IF_ERROR(skip_record(header_offset, data_offset, size));
  return data;
}

Result<bool> TarWalker::next(TarMember* member) {
  if (done_) return false;
  has_member_ = false;
  ZW_RETURN_IF_ERROR(skip_to(next_header_));
  uint64_t first_header = input_->position();
  std::optional<std::string> long_name;
  PaxOverrides pax;
  for (;;) {
    const uint64_t offset = input_->position();
    std::array<std::byte, kTarBlockSize> block;
    ZW_ASSIGN_OR_RETURN(size_t got, input_->read(block));
    if (got < kTarBlockSize) {
      // No end-of-archive blocks: accepted, like GNU tar.
      if (got == 0 && offset == first_header) return end_of_archive();
      if (got == 0) return error(first_header, "archive ends after a metadata record");
      return error(offset,
                   "archive truncated inside a header (" + std::to_string(got) + " of 512 bytes)");
    }
    TarHeader header;
    auto parsed = parse_tar_header(block, &header);
    if (!parsed.is_ok()) return error(offset, parsed.status().message());
    if (!*parsed) {
      // One zero block already ends the archive (GNU tar warns about a lone one, and stops).
      if (offset != first_header) return error(offset, "end of archive after a metadata record");
      return end_of_archive();
    }
    const uint64_t data_offset = offset + kTarBlockSize;
    if (header.type == 'L' || header.type == 'K' || header.type == 'x' || header.type == 'g') {
      if (header.type == 'g') {  // global pax defaults: nothing in them matters here
        ZW_RETURN_IF_ERROR(skip_record(offset, data_offset, header.size));
        // Not part of the next member, unless that member's own records came first.
        if (first_header == offset) first_header = input_->position();
        continue;
      }
      ZW_ASSIGN_OR_RETURN(std::string data, read_metadata(offset, header.size));
      if (header.type == 'L') {
        long_name = data.substr(0, data.find('\0'));
      } else if (header.type == 'x') {
        Status st = parse_pax_records(data, &pax);
        if (!st.is_ok()) return error(offset, st.message());
      }
      continue;
    }

    TarMember m;
    m.path = pax.path ? *pax.path : long_name ? *long_name : std::move(header.name);
    m.type = header.type;
    // Links, devices, directories and fifos carry no data whatever their size field says.
    const bool has_data = header.type < '1' || header.type > '6';
    m.size = has_data ? pax.size.value_or(header.size) : 0;
    m.header_offset = first_header;
    m.data_offset = data_offset;
    const std::optional<uint64_t> end = input_->known_size();
    if (end && (data_offset > *end || align_up(m.size, kTarBlockSize) > *end - data_offset)) {
      return truncated(first_header, data_offset, m.size, *end);
    }
    current_ = m;
    next_header_ = data_offset + align_up(m.size, kTarBlockSize);
    has_member_ = true;
    *member = std::move(m);
    return true;
  }
}

Status TarWalker::read_data(ByteBuffer* out) {
  if (!has_member_ || input_->position() != current_.data_offset) {
    return invalid_argument("tar '" + archive_ +
                            "': read_data needs a member returned by next() and not read yet");
  }
  has_member_ = false;
  out->clear();
  // Grown as bytes arrive, so that a corrupt size in a stream of unknown length cannot make us
  // allocate more than the archive holds.
  while (out->size() < current_.size) {
    const size_t done = out->size();
    const size_t chunk = static_cast<size_t>(std::min(current_.size - done, kDataChunk));
    out->resize(done + chunk);
    ZW_ASSIGN_OR_RETURN(size_t got, input_->read(std::span(*out).subspan(done, chunk)));
    if (got < chunk) {
      return truncated(current_.header_offset, current_.data_offset, current_.size,
                       current_.data_offset + done + got);
    }
  }
  return Status::ok();
}

}  // namespace zerowait::internal
