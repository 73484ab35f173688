#include "zerowait/shard/format.hpp"

#include "common/xxhash.hpp"

#include <cstdio>
#include <cstring>
#include <limits>

#include "common/endian.hpp"

namespace zerowait::format {
namespace {

using internal::get_u32;
using internal::get_u64;
using internal::put_u32;
using internal::put_u64;

constexpr uint64_t kFooterChecksummedBytes = 48;  // footer bytes covered by its own checksum

bool magic_matches(const std::byte* p, const char (&magic)[8]) {
  return std::memcmp(p, magic, 8) == 0;
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
  std::string out(kHeaderMagic, 8);
  put_u32(out, kVersion);
  put_u32(out, flags);
  put_u64(out, kHeaderSize);  // data offset
  out.resize(kHeaderSize, '\0');
  return out;
}

Status decode_header(std::span<const std::byte> bytes, uint32_t* flags, const std::string& name) {
  if (bytes.size() < 24) return corrupt("shard '" + name + "': header shorter than 24 bytes");
  if (!magic_matches(bytes.data(), kHeaderMagic)) {
    return corrupt("'" + name + "' is not a zerowait shard: bad header magic at offset 0");
  }
  uint32_t version = get_u32(bytes.data() + 8);
  if (version != kVersion) {
    return version_error(name, version, "header, offset 8");
  }
  *flags = get_u32(bytes.data() + 12);
  if (get_u64(bytes.data() + 16) != kHeaderSize) {
    return corrupt("shard '" + name + "': header data offset (offset 16) is not " +
                   std::to_string(kHeaderSize));
  }
  return Status::ok();
}

std::string encode_footer(const Footer& f) {
  std::string out;
  out.reserve(kFooterSize);
  put_u64(out, f.index_offset);
  put_u64(out, f.index_size);
  put_u64(out, f.index_checksum);
  put_u64(out, f.sample_count);
  put_u64(out, f.data_offset);
  put_u32(out, f.version);
  put_u32(out, f.flags);
  put_u64(out, XXH3_64bits(out.data(), kFooterChecksummedBytes));
  out.append(kFooterMagic, 8);
  return out;
}

Result<Footer> decode_footer(std::span<const std::byte> bytes, uint64_t file_size,
                             const std::string& name) {
  const uint64_t at = file_size - kFooterSize;  // for messages: absolute offset of the footer
  auto where = [&](uint64_t field) { return " (offset " + std::to_string(at + field) + ")"; };
  if (bytes.size() != kFooterSize) return corrupt("shard '" + name + "': footer is not 64 bytes");
  if (!magic_matches(bytes.data() + 56, kFooterMagic)) {
    return corrupt("shard '" + name + "': bad footer magic" + where(56) +
                   ": not a zerowait shard, or truncated");
  }
  Footer f;
  f.version = get_u32(bytes.data() + 40);
  if (f.version != kVersion) {
    return version_error(name, f.version, "footer, offset " + std::to_string(at + 40));
  }
  if (get_u64(bytes.data() + 48) != XXH3_64bits(bytes.data(), kFooterChecksummedBytes)) {
    return corrupt("shard '" + name + "': footer checksum mismatch" + where(48));
  }
  f.index_offset = get_u64(bytes.data());
  f.index_size = get_u64(bytes.data() + 8);
  f.index_checksum = get_u64(bytes.data() + 16);
  f.sample_count = get_u64(bytes.data() + 24);
  f.data_offset = get_u64(bytes.data() + 32);
  f.flags = get_u32(bytes.data() + 44);
  if ((f.flags & ~kKnownFlags) != 0) {
    return unsupported("shard '" + name + "': unknown flags " + std::to_string(f.flags) +
                       where(44));
  }
  if (f.data_offset != kHeaderSize || f.index_offset < f.data_offset ||
      !fits(f.index_offset, f.index_size, at)) {
    return corrupt("shard '" + name + "': footer points at index [" +
                   std::to_string(f.index_offset) + ", +" + std::to_string(f.index_size) +
                   ") outside the file (size " + std::to_string(file_size) + ")");
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

std::string ShardIndex::serialize() const {
  std::string names_blob;
  for (const auto& n : names) names_blob += n;
  std::string out(kIndexMagic, 8);
  out.reserve(kIndexHeaderSize + samples.size() * kSampleEntrySize +
              fields.size() * kFieldEntrySize + names.size() * kNameEntrySize +
              strings.size() + names_blob.size());
  put_u64(out, samples.size());
  put_u64(out, fields.size());
  put_u32(out, static_cast<uint32_t>(names.size()));
  put_u32(out, 0);
  put_u64(out, strings.size() + names_blob.size());
  for (const SampleEntry& s : samples) {
    put_u64(out, s.offset);
    put_u64(out, s.size);
    put_u64(out, s.checksum);
    put_u64(out, s.first_field);
    put_u32(out, s.field_count);
    put_u32(out, s.key_size);
    put_u64(out, s.key_offset);
  }
  for (const FieldEntry& f : fields) {
    put_u32(out, f.name_id);
    put_u32(out, 0);
    put_u64(out, f.offset);
    put_u64(out, f.size);
  }
  // Field names live in the string table after the keys.
  uint64_t name_offset = strings.size();
  for (const auto& n : names) {
    put_u32(out, static_cast<uint32_t>(name_offset));
    put_u32(out, static_cast<uint32_t>(n.size()));
    name_offset += n.size();
  }
  out += strings;
  out += names_blob;
  return out;
}

Result<ShardIndex> ShardIndex::parse(std::span<const std::byte> bytes, uint64_t data_begin,
                                     uint64_t data_end, const std::string& name) {
  const uint64_t n = bytes.size();
  if (n < kIndexHeaderSize || !magic_matches(bytes.data(), kIndexMagic)) {
    return corrupt("shard '" + name + "': index does not start with its magic");
  }
  const uint64_t sample_count = get_u64(bytes.data() + 8);
  const uint64_t field_count = get_u64(bytes.data() + 16);
  const uint64_t name_count = get_u32(bytes.data() + 24);
  const uint64_t strings_size = get_u64(bytes.data() + 32);
  // Sizes are checked by division first so corrupt counts cannot overflow the sum.
  const uint64_t room = n - kIndexHeaderSize;
  if (sample_count > room / kSampleEntrySize || field_count > room / kFieldEntrySize ||
      name_count > room / kNameEntrySize ||
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
  for (uint64_t i = 0; i < name_count; ++i, name_p += kNameEntrySize) {
    uint64_t off = get_u32(name_p), size = get_u32(name_p + 4);
    if (!fits(off, size, strings_size) || size == 0) {
      return corrupt("shard '" + name + "': field name " + std::to_string(i) +
                     " lies outside the string table");
    }
    index.names.emplace_back(strings_p + off, size);
  }
  index.fields.resize(field_count);
  for (uint64_t i = 0; i < field_count; ++i, field_p += kFieldEntrySize) {
    FieldEntry& f = index.fields[i];
    f.name_id = get_u32(field_p);
    f.offset = get_u64(field_p + 8);
    f.size = get_u64(field_p + 16);
    if (f.name_id >= name_count) {
      return corrupt("shard '" + name + "': field entry " + std::to_string(i) +
                     " has name id " + std::to_string(f.name_id) + " of " +
                     std::to_string(name_count));
    }
  }
  index.samples.resize(sample_count);
  uint64_t next_field = 0;
  for (uint64_t i = 0; i < sample_count; ++i, p += kSampleEntrySize) {
    SampleEntry& s = index.samples[i];
    s.offset = get_u64(p);
    s.size = get_u64(p + 8);
    s.checksum = get_u64(p + 16);
    s.first_field = get_u64(p + 24);
    s.field_count = get_u32(p + 32);
    s.key_size = get_u32(p + 36);
    s.key_offset = get_u64(p + 40);
    if (s.offset < data_begin || !fits(s.offset, s.size, data_end)) {
      return corrupt(entry_error(name, i, "byte range [" + std::to_string(s.offset) + ", +" +
                                              std::to_string(s.size) +
                                              ") lies outside the data region"));
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
        return corrupt(entry_error(name, i, "field '" + index.names[f.name_id] +
                                                "' lies outside its sample's bytes"));
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
