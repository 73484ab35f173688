// Field decoders: how one field of every sample becomes batch columns.
//
// A decoder is a registered name ("raw", "int", "image", "tokens", ...: field_decoder_names())
// whose factory turns its options (FieldDecode::options) into a FieldDecoder. Each decoder lives
// in one folder, src/loader/decode/<name>/, and is listed once in src/loader/decode/decoders.inc;
// the loader, its batch builder and the Python bindings know decoders only through this header.
//
// Per loader, a decoder is asked once (in Loader::create) for its columns (layout(), after
// take_layout() from the first sample where needs_first_sample()), and for the bytes a sample
// takes (row_bytes_room(), which with the layout sizes the batch arenas); per sample, to decode
// one field into its rows (decode(), with the sample's augmentation seed).
#pragma once

#include <any>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/loader/dtype.hpp"

namespace zerowait {

// How one field of every sample becomes batch columns: a registered decoder and its options.
struct FieldDecode {
  std::string decoder = "raw";
  // Of the type the decoder's factory takes: ImageTransform for "image" and "image_device",
  // TokenWindow for "tokens", ArrayField for "array", AudioClip for "audio". Empty: its defaults.
  std::any options;
};

// One column a decoder fills, each sample one row of a fixed size.
struct DecodedColumn {
  std::string suffix;  // the column is "<field><suffix>": "" for the field itself, ".lengths", ...
  DType dtype = DType::kUInt8;
  std::vector<int64_t> row_shape;  // the column is [n, *row_shape]; {} for a value per sample
  // Rows of a few bytes (a label, a length): the column is copied out of the batch arena
  // whatever the batch size (kOwnedColumnMaxBytes), since a training loop keeps exactly these.
  bool small_rows = false;

  uint64_t row_bytes() const;
};

// A decoder's columns, in batch order.
struct FieldLayout {
  // Rows of any length first: "<field>" uint8 [total bytes] and "<field>.offsets" int64 [n + 1]
  // (row i is bytes offsets[i] to offsets[i + 1]; offsets are copied out like small rows).
  bool byte_rows = false;
  std::vector<DecodedColumn> columns;  // then these
};

// Where one sample's field lands.
struct DecodeOutput {
  uint64_t seed = 0;  // the sample's augmentation seed (augment_seed(): crops, offsets)
  // byte_rows: this sample's room (row_bytes_room() of its field's size), of which the decoder
  // fills the first `bytes_written`.
  std::span<std::byte> bytes;
  uint64_t bytes_written = 0;
  std::span<std::byte* const> rows;  // per DecodedColumn: this sample's row (row_bytes() each)
};

// What a decoder reuses from sample to sample on one thread (a JPEG decoder and its buffers).
class DecodeScratch {
 public:
  virtual ~DecodeScratch() = default;
};

// Thread-safety: a FieldDecoder is changed only while the loader is created (take_layout);
// afterwards it is const and shared by every worker thread, each of which makes its own
// DecodeScratch (make_scratch) and passes it to every decode() it runs.
class FieldDecoder {
 public:
  virtual ~FieldDecoder() = default;

  virtual FieldLayout layout() const = 0;
  // byte_rows: the room a sample's field of `field_bytes` bytes takes in "<field>" (what the
  // arenas are sized by). The bytes themselves unless a decoder writes something larger.
  virtual uint64_t row_bytes_room(uint64_t field_bytes) const { return field_bytes; }

  // True when layout() is known only from a sample (an Array() without a dtype): Loader::create
  // then calls take_layout() with the field of the first of the first samples that has it.
  virtual bool needs_first_sample() const { return false; }
  // kCorrupt (a message to follow "field 'x' ") when `field` cannot give a layout.
  virtual Status take_layout(std::span<const std::byte> /*field*/) { return Status::ok(); }

  virtual std::unique_ptr<DecodeScratch> make_scratch() const { return nullptr; }

  // Decodes a sample's field (nullopt: the sample has none) into `out`. An error's message is
  // phrased to follow "field 'x' " (missing_field(): "is missing"): the loader names the shard,
  // sample and key, makes it kCorrupt and applies on_corrupt; rows written so far are
  // overwritten by the next sample. `scratch` is this thread's make_scratch().
  virtual Status decode(std::optional<std::span<const std::byte>> field, DecodeOutput& out,
                        DecodeScratch* scratch) const = 0;
};

// The registry. kInvalidArgument for a name no decoder has (listing those that exist), options
// of another type than the decoder takes, or options its validation refuses.
Result<std::unique_ptr<FieldDecoder>> make_field_decoder(const FieldDecode& spec);
std::vector<std::string> field_decoder_names();  // sorted

// The error of a decoder that needs its field in every sample.
Status missing_field();

}  // namespace zerowait
