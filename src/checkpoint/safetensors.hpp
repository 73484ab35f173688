// The safetensors file layout, exactly as the format defines it: an 8-byte little-endian header
// length N, N bytes of JSON header, then the tensor bytes. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the end of the header,
// contiguous, in order, covering the whole data area) and may hold "__metadata__", a map of
// strings to strings. The JSON may be padded at its end with spaces; zerowait pads it so the data
// area starts at a multiple of 4096 bytes (O_DIRECT-friendly), which every reader accepts.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait::internal::safetensors {

// The dtype names safetensors defines and their element sizes in bytes ("BOOL" 1, "U8" 1, "I8" 1,
// "F8_E5M2" 1, "F8_E4M3" 1, "F8_E8M0" 1, "I16"/"U16"/"F16"/"BF16" 2, "I32"/"U32"/"F32" 4,
// "I64"/"U64"/"F64"/"C64" 8). Returns 0 for a name it does not define.
uint32_t dtype_size(std::string_view dtype);

struct TensorEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // relative to the start of the data area
  uint64_t end = 0;
};

struct Header {
  std::vector<TensorEntry> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // absolute file offset of the data area: 8 + header length
};

// Encodes a header for `tensors` (their begin/end must already be contiguous from 0) padded with
// spaces so that 8 + its length is a multiple of `alignment`. Returns the 8 length bytes followed
// by the JSON.
Result<std::string> encode_header(const std::vector<TensorEntry>& tensors,
                                  const std::map<std::string, std::string>& metadata,
                                  uint64_t alignment = 4096);

// Parses and validates the first bytes of a file (at least 8 + header length of them; `file_size`
// is the whole file's size): the JSON, every dtype name, shape × dtype size = data_offsets span,
// offsets contiguous from 0 and ending exactly at the end of the file. Errors are kCorrupt and
// name `path` and the offending tensor or field.
Result<Header> decode_header(std::string_view file_prefix, uint64_t file_size,
                             const std::string& path);

// The length of the header JSON stated in the first 8 bytes (kCorrupt past 100 MB, the limit the
// format's reference reader enforces).
Result<uint64_t> header_length(std::string_view first8, const std::string& path);

}  // namespace zerowait::internal::safetensors
