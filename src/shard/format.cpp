#include "zerowait/shard/format.hpp"

#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "common/endian.hpp"
#include "common/xxhash.hpp"

namespace zerowait::format {
namespace {

using internal::get_u32;
using internal::get_u64;
using internal::set_u32;
using internal::set_u64;

// Each structure's last field ends where the structure does: the offsets and sizes agree.
static_assert(footer_at::kMagic + sizeof(kFooterMagic) == kFooterSize);
static_assert(index_header_at::kStringsSize + 8 == kIndexHeaderSize);
static_assert(sample_entry_at::kKeyOffset + 8 == kSampleEntrySize);
static_assert(field_entry_at::kSize + 8 == kFieldEntrySize);
static_assert(name_entry_at::kSize + 4 == kNameEntrySize);
static_assert(header_at::kDataOffset + 8 == header_at::kEnd && header_at::kEnd <= kHeaderSize);

bool magic_matches(const std::byte* p, const char (&magic)[8]) {
  return std::memcmp(p, magic, sizeof magic) == 0;
}

void put_magic(std::string& out, size_t offset, const char (&magic)[8]) {
  out.replace(offset, sizeof magic, magic, sizeof magic);
}

std::string entry_error(const std::string& name, uint64_t i, const std::string& what) {
  return "shard '" + name + "': index entry of sample " + std::to_string(i) + ": " + what;
}

Status version_error(const std::string& name, uint32_t version, const std::string& where) {
  return unsupported("shard '" + name + "' has format version " + std::to_string(version) + " (" +
                     where + "); this build reads version " + std::to_string(kVersion) +
                     ": upgrade zerowait");
}

// a + b <= limit, without overflow.
bool fits(uint64_t a, uint64_t b, uint64_t limit) { return a <= limit && b <= limit - a; }

}  // namespace

uint64_t checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string checksum_hex(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::string encode_header(uint32_t flags) {
  std::string out(kHeaderSize, '\0');
  put_magic(out, header_at::kMagic, kHeaderMagic);
  set_u32(out, header_at::kVersion, kVersion);
  set_u32(out, header_at::kFlags, flags);
  set_u64(out, header_at::kDataOffset, kHeaderSize);
  return out;
}

Status decode_header(std::span<const std::byte> bytes, uint32_t* flags, const std::string& name) {
  if (bytes.size() < header_at::kEnd) {
    return corrupt("shard '" + name + "': header shorter than " + std::to_string(header_at::kEnd) +
                   " bytes");
  }
  if (!magic_matches(bytes.data() + header_at::kMagic, kHeaderMagic)) {
    return corrupt("'" + name + "' is not a zerowait shard: bad header magic at offset " +
                   std::to_string(header_at::kMagic));
  }
  uint32_t version = get_u32(bytes.data() + header_at::kVersion);
  if (version != kVersion) {
    return version_error(name, version, "header, offset " + std::to_string(header_at::kVersion));
  }
  *flags = get_u32(bytes.data() + header_at::kFlags);
  if (get_u64(bytes.data() + header_at::kDataOffset) != kHeaderSize) {
    return corrupt("shard '" + name + "': header data offset (offset " +
                   std::to_string(header_at::kDataOffset) + ") is not " +
                   std::to_string(kHeaderSize));
  }
  return Status::ok();
}

std::string encode_footer(const Footer& f) {
  std::string out(kFooterSize, '\0');
  set_u64(out, footer_at::kIndexOffset, f.index_offset);
  set_u64(out, footer_at::kIndexSize, f.index_size);
  set_u64(out, footer_at::kIndexChecksum, f.index_checksum);
  set_u64(out, footer_at::kSampleCount, f.sample_count);
  set_u64(out, footer_at::kDataOffset, f.data_offset);
  set_u32(out, footer_at::kVersion, f.version);
  set_u32(out, footer_at::kFlags, f.flags);
  set_u64(out, footer_at::kChecksum, XXH3_64bits(out.data(), footer_at::kChecksum));
  put_magic(out, footer_at::kMagic, kFooterMagic);
  return out;
}

Result<Footer> decode_footer(std::span<const std::byte> bytes, uint64_t file_size,
                             const std::string& name) {
  const uint64_t at = file_size - kFooterSize;  // for messages: absolute offset of the footer
  auto where = [&](uint64_t field) { return " (offset " + std::to_string(at + field) + ")"; };
  if (bytes.size() != kFooterSize)
    return corrupt("shard '" + name + "': footer is not " + std::to_string(kFooterSize) + " bytes");
  if (!magic_matches(bytes.data() + footer_at::kMagic, kFooterMagic)) {
    return corrupt("shard '" + name + "': bad footer magic" + where(footer_at::kMagic) +
                   ": not a zerowait shard, or truncated");
  }
  Footer f;
  f.version = get_u32(bytes.data() + footer_at::kVersion);
  if (f.version != kVersion) {
    return version_error(name, f.version,
                         "footer, offset " + std::to_string(at + footer_at::kVersion));
  }
  if (get_u64(bytes.data() + footer_at::kChecksum) !=
      XXH3_64bits(bytes.data(), footer_at::kChecksum)) {
    return corrupt("shard '" + name + "': footer checksum mismatch" + where(footer_at::kChecksum));
  }
  f.index_offset = get_u64(bytes.data() + footer_at::kIndexOffset);
  f.index_size = get_u64(bytes.data() + footer_at::kIndexSize);
  f.index_checksum = get_u64(bytes.data() + footer_at::kIndexChecksum);
  f.sample_count = get_u64(bytes.data() + footer_at::kSampleCount);
  f.data_offset = get_u64(bytes.data() + footer_at::kDataOffset);
  f.flags = get_u32(bytes.data() + footer_at::kFlags);
  if ((f.flags & ~kKnownFlags) != 0) {
    return unsupported("shard '" + name + "': unknown flags " + std::to_string(f.flags) +
                       where(footer_at::kFlags));
  }
  if (f.data_offset != kHeaderSize) {
    return corrupt("shard '" + name + "': footer data offset" + where(footer_at::kDataOffset) +
                   " is " + std::to_string(f.data_offset) + ", not " + std::to_string(kHeaderSize));
  }
  if (f.index_offset < f.data_offset || !fits(f.index_offset, f.index_size, at)) {
    return corrupt("shard '" + name + "': footer points at index [" +
                   std::to_string(f.index_offset) + ", +" + std::to_string(f.index_size) +
                   "), which is not between the header (ends at " + std::to_string(kHeaderSize) +
                   ") and the footer (at " + std::to_string(at) + ")");
  }
  return f;
}

uint32_t ShardIndex::intern_name(std::string_view name) {
  for (uint32_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return i;
  }
  names.emplace_back(name);
  return static_cast<uint32_t>(names.size() - 1);
}

uint64_t ShardIndex::memory_bytes() const {
  uint64_t bytes = samples.capacity() * sizeof(SampleEntry) +
                   fields.capacity() * sizeof(FieldEntry) + strings.capacity();
  for (const std::string& name : names) bytes += sizeof(std::string) + name.capacity();
  return bytes;
}

std::string ShardIndex::serialize() const {
  std::string names_blob;
  for (const auto& n : names) names_blob += n;
  // Entries are written in place at the offsets of format.hpp; reserved bytes stay zero.
  std::string out(kIndexHeaderSize + samples.size() * kSampleEntrySize +
                      fields.size() * kFieldEntrySize + names.size() * kNameEntrySize,
                  '\0');
  put_magic(out, index_header_at::kMagic, kIndexMagic);
  set_u64(out, index_header_at::kSampleCount, samples.size());
  set_u64(out, index_header_at::kFieldCount, fields.size());
  set_u32(out, index_header_at::kNameCount, static_cast<uint32_t>(names.size()));
  set_u64(out, index_header_at::kStringsSize, strings.size() + names_blob.size());
  size_t at = kIndexHeaderSize;
  for (const SampleEntry& s : samples) {
    set_u64(out, at + sample_entry_at::kOffset, s.offset);
    set_u64(out, at + sample_entry_at::kSize, s.size);
    set_u64(out, at + sample_entry_at::kChecksum, s.checksum);
    set_u64(out, at + sample_entry_at::kFirstField, s.first_field);
    set_u32(out, at + sample_entry_at::kFieldCount, s.field_count);
    set_u32(out, at + sample_entry_at::kKeySize, s.key_size);
    set_u64(out, at + sample_entry_at::kKeyOffset, s.key_offset);
    at += kSampleEntrySize;
  }
  for (const FieldEntry& f : fields) {
    set_u32(out, at + field_entry_at::kNameId, f.name_id);
    set_u64(out, at + field_entry_at::kOffset, f.offset);
    set_u64(out, at + field_entry_at::kSize, f.size);
    at += kFieldEntrySize;
  }
  // Field names live in the string table after the keys.
  uint64_t name_offset = strings.size();
  for (const auto& n : names) {
    set_u32(out, at + name_entry_at::kOffset, static_cast<uint32_t>(name_offset));
    set_u32(out, at + name_entry_at::kSize, static_cast<uint32_t>(n.size()));
    name_offset += n.size();
    at += kNameEntrySize;
  }
  out += strings;
  out += names_blob;
  return out;
}

Result<ShardIndex> ShardIndex::parse(std::span<const std::byte> bytes, uint64_t data_begin,
                                     uint64_t data_end, const std::string& name) {
  const uint64_t n = bytes.size();
  if (n < kIndexHeaderSize || !magic_matches(bytes.data() + index_header_at::kMagic, kIndexMagic)) {
    return corrupt("shard '" + name + "': index does not start with its magic");
  }
  const uint64_t sample_count = get_u64(bytes.data() + index_header_at::kSampleCount);
  const uint64_t field_count = get_u64(bytes.data() + index_header_at::kFieldCount);
  const uint64_t name_count = get_u32(bytes.data() + index_header_at::kNameCount);
  const uint64_t strings_size = get_u64(bytes.data() + index_header_at::kStringsSize);
  // Sizes are checked by division first so corrupt counts cannot overflow the sum.
  const uint64_t room = n - kIndexHeaderSize;
  if (sample_count > room / kSampleEntrySize || field_count > room / kFieldEntrySize ||
      name_count > room / kNameEntrySize || strings_size > room ||
      kIndexHeaderSize + sample_count * kSampleEntrySize + field_count * kFieldEntrySize +
              name_count * kNameEntrySize + strings_size !=
          n) {
    return corrupt("shard '" + name + "': index counts (" + std::to_string(sample_count) +
                   " samples, " + std::to_string(field_count) + " fields, " +
                   std::to_string(name_count) + " names, " + std::to_string(strings_size) +
                   " string bytes) do not add up to the index size " + std::to_string(n));
  }
  ShardIndex index;
  const std::byte* p = bytes.data() + kIndexHeaderSize;
  const std::byte* field_p = p + sample_count * kSampleEntrySize;
  const std::byte* name_p = field_p + field_count * kFieldEntrySize;
  const char* strings_p = reinterpret_cast<const char*>(name_p + name_count * kNameEntrySize);
  index.strings.assign(strings_p, strings_size);

  index.names.reserve(name_count);
  // Names become column names and file name extensions (`unpack`): a '/' or a name given twice
  // would make two fields of a sample indistinguishable, or one field a path.
  std::unordered_map<std::string_view, uint64_t> name_ids;
  for (uint64_t i = 0; i < name_count; ++i, name_p += kNameEntrySize) {
    uint64_t off = get_u32(name_p + name_entry_at::kOffset);
    uint64_t size = get_u32(name_p + name_entry_at::kSize);
    if (!fits(off, size, strings_size) || size == 0) {
      return corrupt("shard '" + name + "': field name " + std::to_string(i) +
                     " lies outside the string table");
    }
    const std::string_view field_name(strings_p + off, size);
    if (field_name.find('/') != std::string_view::npos) {
      return corrupt("shard '" + name + "': field name " + std::to_string(i) + " ('" +
                     std::string(field_name) + "') contains '/'");
    }
    auto [first, fresh] = name_ids.emplace(field_name, i);
    if (!fresh) {
      return corrupt("shard '" + name + "': field name " + std::to_string(i) + " ('" +
                     std::string(field_name) + "') repeats field name " +
                     std::to_string(first->second));
    }
    index.names.emplace_back(field_name);
  }
  index.fields.resize(field_count);
  for (uint64_t i = 0; i < field_count; ++i, field_p += kFieldEntrySize) {
    FieldEntry& f = index.fields[i];
    f.name_id = get_u32(field_p + field_entry_at::kNameId);
    f.offset = get_u64(field_p + field_entry_at::kOffset);
    f.size = get_u64(field_p + field_entry_at::kSize);
    if (f.name_id >= name_count) {
      return corrupt("shard '" + name + "': field entry " + std::to_string(i) + " has name id " +
                     std::to_string(f.name_id) + " of " + std::to_string(name_count));
    }
  }
  index.samples.resize(sample_count);
  uint64_t next_field = 0;
  for (uint64_t i = 0; i < sample_count; ++i, p += kSampleEntrySize) {
    SampleEntry& s = index.samples[i];
    s.offset = get_u64(p + sample_entry_at::kOffset);
    s.size = get_u64(p + sample_entry_at::kSize);
    s.checksum = get_u64(p + sample_entry_at::kChecksum);
    s.first_field = get_u64(p + sample_entry_at::kFirstField);
    s.field_count = get_u32(p + sample_entry_at::kFieldCount);
    s.key_size = get_u32(p + sample_entry_at::kKeySize);
    s.key_offset = get_u64(p + sample_entry_at::kKeyOffset);
    if (s.offset < data_begin || !fits(s.offset, s.size, data_end)) {
      return corrupt(entry_error(name, i,
                                 "byte range [" + std::to_string(s.offset) + ", +" +
                                     std::to_string(s.size) + ") lies outside the data region"));
    }
    // Fields are stored in sample order, so each sample's fields follow the previous sample's.
    if (s.first_field != next_field || !fits(s.first_field, s.field_count, field_count)) {
      return corrupt(entry_error(name, i, "field list is out of order or out of range"));
    }
    next_field += s.field_count;
    if (!fits(s.key_offset, s.key_size, strings_size) || s.key_size == 0) {
      return corrupt(entry_error(name, i, "key lies outside the string table"));
    }
    for (const FieldEntry& f : index.fields_of(i)) {
      if (f.offset < s.offset || !fits(f.offset, f.size, s.offset + s.size)) {
        return corrupt(entry_error(
            name, i, "field '" + index.names[f.name_id] + "' lies outside its sample's bytes"));
      }
    }
  }
  if (next_field != field_count) {
    return corrupt("shard '" + name + "': index has " + std::to_string(field_count - next_field) +
                   " field entries that belong to no sample");
  }
  return index;
}

}  // namespace zerowait::format
