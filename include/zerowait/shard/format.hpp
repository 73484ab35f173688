// Shard format v1: the constants and the sample index. docs/format.md is the byte-by-byte spec;
// this header is the single source of truth for every number in it.
//
//   [0, 4096)              header: magic, version, flags, data offset
//   [4096, index_offset)   data region: samples back to back (each 4 KiB aligned with kAligned)
//   [index_offset, +size)  index: index header, sample entries, field entries, names, strings
//   [end - 64, end)        footer: index location and checksum, sample count, version, magic
//
// All integers are little-endian. A WebDataset .tar read in place gets the same index (without
// checksums), stored in a sidecar file, so one reader serves both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait::format {

inline constexpr uint32_t kVersion = 1;
inline constexpr char kHeaderMagic[8] = {'Z', 'W', 'S', 'H', 'A', 'R', 'D', '\0'};
inline constexpr char kIndexMagic[8] = {'Z', 'W', 'I', 'N', 'D', 'E', 'X', '\0'};
inline constexpr char kFooterMagic[8] = {'Z', 'W', 'F', 'O', 'O', 'T', 'E', 'R'};

inline constexpr uint64_t kAlignment = 4096;   // data region start, and samples with kAligned
inline constexpr uint64_t kHeaderSize = 4096;  // the data region starts right after it
inline constexpr uint64_t kFooterSize = 64;
inline constexpr uint64_t kIndexHeaderSize = 40;
inline constexpr uint64_t kSampleEntrySize = 48;
inline constexpr uint64_t kFieldEntrySize = 24;
inline constexpr uint64_t kNameEntrySize = 8;

// Where each field sits inside its structure: the byte offsets of docs/format.md's tables. The
// encoder, the decoder and tests that build shards by hand all use these.
namespace header_at {
inline constexpr uint64_t kMagic = 0, kVersion = 8, kFlags = 12, kDataOffset = 16;
inline constexpr uint64_t kEnd = 24;  // what a reader decodes; the rest is reserved zeros
}  // namespace header_at
namespace footer_at {
inline constexpr uint64_t kIndexOffset = 0, kIndexSize = 8, kIndexChecksum = 16;
inline constexpr uint64_t kSampleCount = 24, kDataOffset = 32, kVersion = 40, kFlags = 44;
inline constexpr uint64_t kChecksum = 48;  // covers footer bytes [0, kChecksum)
inline constexpr uint64_t kMagic = 56;
}  // namespace footer_at
namespace index_header_at {
inline constexpr uint64_t kMagic = 0, kSampleCount = 8, kFieldCount = 16, kNameCount = 24;
inline constexpr uint64_t kStringsSize = 32;
}  // namespace index_header_at
namespace sample_entry_at {
inline constexpr uint64_t kOffset = 0, kSize = 8, kChecksum = 16, kFirstField = 24;
inline constexpr uint64_t kFieldCount = 32, kKeySize = 36, kKeyOffset = 40;
}  // namespace sample_entry_at
namespace field_entry_at {
inline constexpr uint64_t kNameId = 0, kOffset = 8, kSize = 16;
}  // namespace field_entry_at
namespace name_entry_at {
inline constexpr uint64_t kOffset = 0, kSize = 4;
}  // namespace name_entry_at

inline constexpr const char* kShardExtension = ".zws";
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kQuarantineName = "quarantine.json";

// Header and footer flag bits.
enum Flags : uint32_t {
  kAligned = 1u << 0,     // every sample starts on a kAlignment boundary
  kNoChecksums = 1u << 1  // sample checksums absent (an index built over a WebDataset tar)
};
inline constexpr uint32_t kKnownFlags = kAligned | kNoChecksums;

// One sample: its byte span in the file (covering all its fields), the xxHash3-64 of exactly
// those bytes, its fields, and its key.
struct SampleEntry {
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t checksum = 0;
  uint64_t first_field = 0;  // index into ShardIndex::fields
  uint32_t field_count = 0;
  uint32_t key_size = 0;
  uint64_t key_offset = 0;  // into ShardIndex::strings
};

// One field of a sample: a name id and an absolute byte range inside its sample's span.
struct FieldEntry {
  uint32_t name_id = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

struct Footer {
  uint64_t index_offset = 0;
  uint64_t index_size = 0;
  uint64_t index_checksum = 0;  // xxHash3-64 of the index bytes
  uint64_t sample_count = 0;
  uint64_t data_offset = kHeaderSize;
  uint32_t version = kVersion;
  uint32_t flags = 0;
};

// Encodes the 4096-byte header / the 64-byte footer.
std::string encode_header(uint32_t flags);
std::string encode_footer(const Footer& footer);
// Decodes and checks magic, version (kUnsupported for an unknown one), flags and the footer's own
// checksum. `name` goes into error messages.
Status decode_header(std::span<const std::byte> bytes, uint32_t* flags, const std::string& name);
Result<Footer> decode_footer(std::span<const std::byte> bytes, uint64_t file_size,
                             const std::string& name);

// The in-memory sample index of one shard (or one indexed tar).
struct ShardIndex {
  std::vector<SampleEntry> samples;
  std::vector<FieldEntry> fields;
  std::vector<std::string> names;  // field names; FieldEntry::name_id indexes this
  std::string strings;             // sample keys, concatenated

  uint64_t sample_count() const { return samples.size(); }
  std::string_view key(uint64_t i) const {
    const SampleEntry& s = samples[i];
    return std::string_view(strings).substr(s.key_offset, s.key_size);
  }
  std::span<const FieldEntry> fields_of(uint64_t i) const {
    const SampleEntry& s = samples[i];
    return std::span<const FieldEntry>(fields).subspan(s.first_field, s.field_count);
  }
  // Returns the id of `name`, adding it when new (writer side).
  uint32_t intern_name(std::string_view name);
  // The heap memory this index holds (what a dataset's index budget counts).
  uint64_t memory_bytes() const;

  // Encodes the index region.
  std::string serialize() const;
  // Decodes an index region and validates every entry against the data region
  // [data_begin, data_end): ranges inside it, fields inside their sample, ids and keys in range.
  // Errors are kCorrupt and name `name`, the entry and the field that is wrong.
  static Result<ShardIndex> parse(std::span<const std::byte> bytes, uint64_t data_begin,
                                  uint64_t data_end, const std::string& name);
};

// xxHash3-64 of `bytes` (seed 0): the checksum used everywhere in the format.
uint64_t checksum(std::span<const std::byte> bytes);
// 16 lower-case hex digits.
std::string checksum_hex(uint64_t value);

}  // namespace zerowait::format
