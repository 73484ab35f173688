// Tar parsing shared by the random-access index builder (webdataset.cpp) and the streaming reader
// (tar_stream.cpp): one header-block parser, one pax parser, and a walker that turns header
// blocks, GNU long names and pax records into members, whatever feeds it the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shard/tar/tar_stream.hpp"
#include "zerowait/common/status.hpp"

namespace zerowait::internal {

inline constexpr uint64_t kTarBlockSize = 512;
// Largest GNU long name or pax header held in memory; a larger length is taken as corruption.
inline constexpr uint64_t kTarMaxMetadataSize = 1 << 20;

// What one header block says about its member.
struct TarHeader {
  std::string name;  // ustar prefix + '/' + name, or the name alone
  char type = '0';
  uint64_t size = 0;
};

// Parses one header block: checksum (unsigned or signed sum), octal or GNU base-256 numbers, the
// ustar prefix. Returns false for an all-zero block (end of archive). kCorrupt says only what is
// wrong ("bad header checksum: stored 0, computed 1234"); callers add archive and offset.
Result<bool> parse_tar_header(std::span<const std::byte, kTarBlockSize> block, TarHeader* out);

// The pax records that change how a member is read; others (mtime, uid, ...) are ignored.
struct PaxOverrides {
  std::optional<std::string> path;
  std::optional<uint64_t> size;
};

// Parses the data of a pax header ("<length> <key>=<value>\n" records) into `out`. kCorrupt names
// the byte position of the bad record inside `data`.
Status parse_pax_records(std::string_view data, PaxOverrides* out);

// A sequential cursor over the (uncompressed) bytes of an archive.
class TarInput {
 public:
  virtual ~TarInput() = default;
  // Reads up to dst.size() bytes at position(); returns fewer only at the end of the archive.
  virtual Result<size_t> read(std::span<std::byte> dst) = 0;
  // Advances by up to `n` bytes without returning them; returns fewer only at the end.
  virtual Result<uint64_t> skip(uint64_t n) = 0;
  virtual uint64_t position() const = 0;
  // The archive's size when known without reading it all (plain files), else nullopt.
  virtual std::optional<uint64_t> known_size() const = 0;
  // Called once the end of the archive is found. A compressed input reads the rest of its stream
  // there, so that a damaged or truncated trailer (gzip's CRC) is an error, not ignored.
  virtual Status finish() { return Status::ok(); }
};

// Walks the members of an archive. End of archive: one or two zero blocks, or a clean end of
// input at a header boundary. Every error is kCorrupt (or the input's own kIo) and names the
// archive and the offset of the header concerned. Not thread-safe.
class TarWalker {
 public:
  TarWalker(TarInput* input, std::string archive) : input_(input), archive_(std::move(archive)) {}

  // Advances to the next member, skipping what is left of the previous one; returns false at the
  // end of the archive. On success the input is positioned at member->data_offset.
  Result<bool> next(TarMember* member);
  // Reads the data of the member last returned by next(), once.
  Status read_data(ByteBuffer* out);

 private:
  Status error(uint64_t offset, const std::string& what) const;
  Result<bool> end_of_archive();
  Status truncated(uint64_t header_offset, uint64_t data_offset, uint64_t size,
                   uint64_t archive_end) const;
  // Skips to `offset`, the header after the current member.
  Status skip_to(uint64_t offset);
  // Skips the rest of a metadata record; a truncation error names its header.
  Status skip_record(uint64_t header_offset, uint64_t data_offset, uint64_t size);
  // Reads the `size` data bytes of a metadata record whose header is at `header_offset`.
  Result<std::string> read_metadata(uint64_t header_offset, uint64_t size);

  TarInput* input_;
  std::string archive_;
  bool done_ = false;
  bool has_member_ = false;  // a member was returned and its data not read yet
  TarMember current_;
  uint64_t next_header_ = 0;
};

}  // namespace zerowait::internal
