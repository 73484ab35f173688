// Fuzzes NumPy array fields: whatever the bytes (a .npy to start from), parse_npy_header()
// returns a header or an error, never reads outside them; and a column laid out from a parsed
// header copies exactly its row, or refuses the bytes with kCorrupt.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "zerowait/loader/array_field.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zerowait;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const Result<NpyHeader> header = parse_npy_header(bytes);
  if (!header) return 0;
  ArrayField column;
  column.dtype = header->dtype;
  column.shape = header->shape;
  if (!column.validate().is_ok()) return 0;
  if (column.row_bytes() > (64u << 20)) return 0;  // a header may promise more than the bytes
  std::vector<std::byte> row(column.row_bytes());
  const Status copied = column.decode(bytes, row.data());
  if (!copied.is_ok() && copied.code() != ErrorCode::kCorrupt) std::abort();
  return 0;
}
