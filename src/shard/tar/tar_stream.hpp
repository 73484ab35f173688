// Sequential reading of tar archives (plain or gzip-compressed), used by pack to stream
// WebDataset shards. Header parsing is shared with build_tar_index (webdataset.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/byte_buffer.hpp"
#include "zerowait/common/status.hpp"

namespace zerowait::internal {

struct TarMember {
  std::string path;            // full name after ustar prefix / GNU long name / pax path
  char type = '0';             // ustar typeflag ('0' or '\0' regular, '5' directory, ...)
  uint64_t size = 0;           // data bytes
  uint64_t header_offset = 0;  // offset of the member's (first) header block in the archive
  uint64_t data_offset = 0;    // offset of its data in the (uncompressed) archive
  bool is_regular() const { return type == '0' || type == '\0' || type == '7'; }
};

// Not thread-safe. Errors name the archive path and the member offset.
class TarStream {
 public:
  // Opens `path`: a local file or any URL the storage registry reads (open_source); gzip is
  // detected by its magic bytes, not the name.
  static Result<std::unique_ptr<TarStream>> open(const std::string& path);
  virtual ~TarStream() = default;

  // Advances to the next member (pax/GNU metadata records are consumed internally); returns
  // false at the end of the archive. Unread data of the previous member is skipped.
  virtual Result<bool> next(TarMember* member) = 0;
  // Reads the whole data of the current member into `out` (resized, not zero-filled first).
  virtual Status read_data(ByteBuffer* out) = 0;
};

}  // namespace zerowait::internal
