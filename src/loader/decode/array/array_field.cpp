#include "zerowait/loader/array_field.hpp"

#include <array>
#include <charconv>
#include <cstring>
#include <string_view>
#include <utility>

namespace zerowait {

namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
  char kind;  // the .npy descr's kind character: 'u', 'i', 'f', 'b'
};

constexpr std::array<DTypeInfo, 12> kDTypes = {{
    {DType::kUInt8, "uint8", 1, 'u'},
    {DType::kInt32, "int32", 4, 'i'},
    {DType::kInt64, "int64", 8, 'i'},
    {DType::kInt8, "int8", 1, 'i'},
    {DType::kInt16, "int16", 2, 'i'},
    {DType::kUInt16, "uint16", 2, 'u'},
    {DType::kUInt32, "uint32", 4, 'u'},
    {DType::kUInt64, "uint64", 8, 'u'},
    {DType::kFloat16, "float16", 2, 'f'},
    {DType::kFloat32, "float32", 4, 'f'},
    {DType::kFloat64, "float64", 8, 'f'},
    {DType::kBool, "bool", 1, 'b'},
}};

const DTypeInfo& info(DType dtype) {
  for (const DTypeInfo& i : kDTypes) {
    if (i.dtype == dtype) return i;
  }
  return kDTypes[0];
}

// One row of a batch is at most this big (a 4096 x 4096 x 16 float32 volume).
constexpr uint64_t kMaxRowBytes = uint64_t{1} << 30;
// .npy headers are short Python dict literals; numpy itself refuses ones over 10,000 bytes.
constexpr size_t kMaxHeaderBytes = 1 << 16;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

// The text after "'key':" in the header dict, up to the end of the header.
Result<std::string_view> value_of(std::string_view dict, std::string_view key) {
  const std::string quoted = "'" + std::string(key) + "'";
  const size_t at = dict.find(quoted);
  if (at == std::string_view::npos) return corrupt("has a .npy header without '" +
                                                   std::string(key) + "'");
  std::string_view rest = trim(dict.substr(at + quoted.size()));
  if (rest.empty() || rest.front() != ':') return corrupt("has a malformed .npy header");
  return trim(rest.substr(1));
}

Result<std::vector<int64_t>> parse_shape(std::string_view text) {
  if (text.empty() || text.front() != '(') return corrupt("has a .npy header whose shape is "
                                                          "not a tuple");
  const size_t close = text.find(')');
  if (close == std::string_view::npos) return corrupt("has a malformed .npy shape");
  std::string_view inner = text.substr(1, close - 1);
  std::vector<int64_t> shape;
  while (!(inner = trim(inner)).empty()) {
    int64_t dim = 0;
    const auto [end, error] = std::from_chars(inner.data(), inner.data() + inner.size(), dim);
    if (error != std::errc() || dim < 0 || shape.size() == 32) {
      return corrupt("has a .npy shape that is not a tuple of sizes");
    }
    shape.push_back(dim);
    inner = trim(inner.substr(size_t(end - inner.data())));
    if (!inner.empty() && inner.front() == ',') inner.remove_prefix(1);
  }
  return shape;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }

const char* dtype_name(DType dtype) { return info(dtype).name; }

Result<DType> parse_dtype(const std::string& name) {
  std::string known;
  for (const DTypeInfo& i : kDTypes) {
    if (name == i.name) return i.dtype;
    known += (known.empty() ? "" : ", ") + std::string(i.name);
  }
  return invalid_argument("unknown dtype '" + name + "' (one of " + known + ")");
}

Result<DType> dtype_from_npy_descr(std::string_view descr) {
  if (descr.size() < 3 || descr.size() > 4) {
    return unsupported("holds a .npy array of dtype '" + std::string(descr) +
                       "'; the loader reads numbers and booleans");
  }
  const char order = descr[0], kind = descr[1];
  size_t size = 0;
  const auto [end, error] = std::from_chars(descr.data() + 2, descr.data() + descr.size(), size);
  if (error != std::errc() || end != descr.data() + descr.size()) {
    return corrupt("has a .npy dtype '" + std::string(descr) + "' that is not one");
  }
  if (order == '>' && size > 1) {
    return unsupported("holds a big-endian .npy array ('" + std::string(descr) +
                       "'); save it little-endian (array.astype(array.dtype.newbyteorder('<')))");
  }
  for (const DTypeInfo& i : kDTypes) {
    if (i.kind == kind && i.size == size) return i.dtype;
  }
  return unsupported("holds a .npy array of dtype '" + std::string(descr) +
                     "'; the loader reads numbers and booleans");
}

Result<NpyHeader> parse_npy_header(std::span<const std::byte> bytes) {
  static constexpr char kMagic[] = "\x93NUMPY";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0) {
    return corrupt("is not a .npy array (no \\x93NUMPY magic)");
  }
  const auto major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = size_t(uint8_t(bytes[8])) | size_t(uint8_t(bytes[9])) << 8;
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return corrupt("ends inside its .npy header");
    for (int i = 0; i < 4; ++i) header_len |= size_t(uint8_t(bytes[8 + i])) << (8 * i);
    start = 12;
  } else {
    return unsupported("is a .npy array of format version " + std::to_string(major) +
                       " (1 to 3 are known)");
  }
  if (header_len > kMaxHeaderBytes || start + header_len > bytes.size()) {
    return corrupt("ends inside its .npy header");
  }
  const std::string_view dict(reinterpret_cast<const char*>(bytes.data()) + start, header_len);
  NpyHeader header;
  header.data_offset = start + header_len;

  ZW_ASSIGN_OR_RETURN(std::string_view descr, value_of(dict, "descr"));
  if (descr.empty() || descr.front() != '\'') {
    return unsupported("holds a .npy array of a structured dtype; the loader reads numbers and "
                       "booleans");
  }
  const size_t quote = descr.find('\'', 1);
  if (quote == std::string_view::npos) return corrupt("has a malformed .npy dtype");
  ZW_ASSIGN_OR_RETURN(header.dtype, dtype_from_npy_descr(descr.substr(1, quote - 1)));

  ZW_ASSIGN_OR_RETURN(std::string_view fortran, value_of(dict, "fortran_order"));
  header.fortran_order = fortran.starts_with("True");
  if (!header.fortran_order && !fortran.starts_with("False")) {
    return corrupt("has a malformed .npy fortran_order");
  }
  ZW_ASSIGN_OR_RETURN(std::string_view shape, value_of(dict, "shape"));
  ZW_ASSIGN_OR_RETURN(header.shape, parse_shape(shape));
  return header;
}

Status ArrayField::validate() const {
  if (!dtype.has_value()) {
    if (!header) return invalid_argument("an array field without a header needs a dtype");
    return Status::ok();
  }
  uint64_t bytes = dtype_size(*dtype);
  for (int64_t dim : shape) {
    if (dim < 0) return invalid_argument("array shape " + shape_text(shape) + " has a negative "
                                         "size");
    if (dim > 0 && bytes > kMaxRowBytes / uint64_t(dim)) {
      return invalid_argument("array rows of " + describe() + " exceed 1 GiB each");
    }
    bytes *= uint64_t(dim);
  }
  return Status::ok();
}

uint64_t ArrayField::row_bytes() const {
  if (!dtype.has_value()) return 0;
  uint64_t bytes = dtype_size(*dtype);
  for (int64_t dim : shape) bytes *= uint64_t(dim);
  return bytes;
}

std::string ArrayField::describe() const {
  return std::string(dtype ? dtype_name(*dtype) : "any") + " " + shape_text(shape);
}

Status ArrayField::decode(std::span<const std::byte> bytes, std::byte* row) const {
  const uint64_t want = row_bytes();
  size_t offset = 0;
  if (header) {
    // Every fault of one sample's array is kCorrupt, so that it costs that sample only.
    Result<NpyHeader> parsed = parse_npy_header(bytes);
    if (!parsed) return corrupt(parsed.status().message());
    const NpyHeader& h = *parsed;
    const bool fortran = h.fortran_order && h.shape.size() > 1;
    if (h.dtype != dtype || h.shape != shape) {
      return corrupt("is a " + std::string(dtype_name(h.dtype)) + " " + shape_text(h.shape) +
                     " array, not the column's " + describe() +
                     " (set by Array(dtype, shape), else by the first sample with the field)");
    }
    if (fortran) {
      return corrupt("is a Fortran-ordered .npy array; save numpy.ascontiguousarray(a)");
    }
    offset = h.data_offset;
  }
  if (bytes.size() - offset != want) {
    return corrupt("holds " + std::to_string(bytes.size() - offset) + " bytes of array data, not " +
                   std::to_string(want) + " (" + describe() + ")");
  }
  if (want > 0) std::memcpy(row, bytes.data() + offset, want);
  return Status::ok();
}

}  // namespace zerowait
