// Token sequences for language-model training: a field that holds a document's tokens as a
// little-endian array (uint16, uint32 or int32, no header: what tokenizers write for GPT-2 /
// Llama vocabularies) becomes one fixed-length int64 row of a [batch, seq_len] tensor.
//
// Shorter sequences are padded with `pad` (the "<field>.lengths" column gives the real count);
// longer ones are cut to seq_len tokens, from their start or, with `random_offset`, from an
// offset drawn from (seed, epoch, sample index) like an image crop, so an exact resume sees the
// same windows. To train on packed rows without padding, concatenate documents and cut them into
// windows of seq_len when writing the dataset (zerowait.token_windows in Python).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "zerowait/common/status.hpp"

namespace zerowait {

struct TokenWindow {
  enum class DType { kUInt16, kUInt32, kInt32 };  // on disk, little-endian
  DType dtype = DType::kUInt16;
  uint32_t seq_len = 0;  // tokens per row, > 0
  int64_t pad = 0;       // the token that fills the rest of a shorter sequence's row
  bool random_offset = false;
  // Rows of int32 instead of int64: half the bytes written and moved (nn.Embedding takes either;
  // cross_entropy wants int64 targets, a cast on the GPU).
  bool int32_rows = false;

  // kInvalidArgument naming the bad field.
  Status validate() const;
  size_t token_bytes() const { return dtype == DType::kUInt16 ? 2 : 4; }

  size_t row_value_bytes() const { return int32_rows ? 4 : 8; }

  // Writes the row of a sequence stored in `bytes` into `row` (seq_len values of int64, or of
  // int32 with int32_rows) and returns how many tokens it took from the sequence. `seed` picks
  // the offset of a longer sequence when random_offset is set. kCorrupt when `bytes` is not a
  // whole number of tokens, or (int32 rows) a uint32 token does not fit an int32.
  Result<uint64_t> decode(std::span<const std::byte> bytes, uint64_t seed, std::byte* row) const;
};

// "uint16", "uint32", "int32" (numpy's names); kInvalidArgument otherwise.
Result<TokenWindow::DType> parse_token_dtype(const std::string& name);
const char* token_dtype_name(TokenWindow::DType dtype);

}  // namespace zerowait
