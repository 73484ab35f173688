#include "checkpoint/safetensors.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "common/endian.hpp"

namespace zerowait::internal::safetensors {
namespace {

using json = nlohmann::json;

// The reference reader's limit; a larger header is refused rather than allocated.
constexpr uint64_t kMaxHeaderLength = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";

// shape × element size in bytes (dimensions are not negative), or nullopt if it overflows.
std::optional<uint64_t> tensor_bytes(const std::vector<int64_t>& shape, uint32_t element_size) {
  uint64_t total = element_size;
  for (int64_t dim : shape) {
    if (__builtin_mul_overflow(total, static_cast<uint64_t>(dim), &total)) return std::nullopt;
  }
  return total;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Checks that `tensors` (sorted by offset) tile [0, their end) exactly, each spanning
// shape × dtype bytes; `fail` builds the error for one tensor.
template <typename Fail>
Status check_layout(const std::vector<TensorEntry>& tensors, Fail fail) {
  uint64_t expected_begin = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& t : tensors) {
    const uint32_t size = dtype_size(t.dtype);
    if (size == 0) return fail(t, "unknown dtype '" + t.dtype + "'");
    if (t.end < t.begin) {
      return fail(t, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                         "] end before they begin");
    }
    if (t.begin != expected_begin) {
      std::string why = previous == nullptr        ? "a gap at the start of the data"
                        : t.begin < expected_begin ? "overlaps tensor '" + previous->name + "'"
                                                   : "a gap after tensor '" + previous->name + "'";
      return fail(t, "data_offsets begin at " + std::to_string(t.begin) + ", expected " +
                         std::to_string(expected_begin) + " (" + why + ")");
    }
    if (std::any_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d < 0; })) {
      return fail(t, "shape " + shape_string(t.shape) + " has a negative dimension");
    }
    std::optional<uint64_t> bytes = tensor_bytes(t.shape, size);
    if (!bytes) return fail(t, "shape " + shape_string(t.shape) + " overflows 64 bits");
    if (*bytes != t.end - t.begin) {
      return fail(t, "shape " + shape_string(t.shape) + " of " + t.dtype + " needs " +
                         std::to_string(*bytes) + " bytes, data_offsets span " +
                         std::to_string(t.end - t.begin));
    }
    expected_begin = t.end;
    previous = &t;
  }
  return Status::ok();
}

// Parses one tensor's entry; `fail` names the tensor and the field.
Result<TensorEntry> parse_entry(const std::string& name, const json& value,
                                const std::string& path) {
  auto fail = [&](const std::string& why) {
    return corrupt("safetensors header of '" + path + "': tensor '" + name + "': " + why);
  };
  if (!value.is_object()) return fail("is not an object");
  TensorEntry entry;
  entry.name = name;

  auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return fail("'dtype' is missing or not a string");
  }
  entry.dtype = dtype->get<std::string>();
  if (dtype_size(entry.dtype) == 0) return fail("unknown dtype '" + entry.dtype + "'");

  auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) return fail("'shape' is missing or not a list");
  for (const json& dim : *shape) {
    if (!dim.is_number_unsigned() ||
        dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return fail("'shape' " + shape->dump() + " holds something other than a dimension");
    }
    entry.shape.push_back(dim.get<int64_t>());
  }

  auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return fail("'data_offsets' is missing or not [begin, end]");
  }
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  return entry;
}

Result<std::map<std::string, std::string>> parse_metadata(const json& value,
                                                          const std::string& path) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;  // the reference reader takes null as "none"
  if (!value.is_object()) {
    return corrupt("safetensors header of '" + path + "': '__metadata__' is not an object");
  }
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return corrupt("safetensors header of '" + path + "': '__metadata__' entry '" + key +
                     "' is not a string");
    }
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

}  // namespace

uint32_t dtype_size(std::string_view dtype) {
  static const std::map<std::string_view, uint32_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},     {"C64", 8},
  };
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

Result<std::string> encode_header(const std::vector<TensorEntry>& tensors,
                                  const std::map<std::string, std::string>& metadata,
                                  uint64_t alignment) {
  if (alignment == 0) return invalid_argument("safetensors header alignment must be at least 1");
  auto fail = [](const TensorEntry& t, const std::string& why) {
    return invalid_argument("cannot encode safetensors tensor '" + t.name + "': " + why);
  };
  ZW_RETURN_IF_ERROR(check_layout(tensors, fail));

  // Built entry by entry, so the header lists the tensors in data order (a JSON object would
  // sort them by name).
  std::set<std::string_view> names;
  std::string text = "{";
  try {
    if (!metadata.empty()) text += json(kMetadataKey).dump() + ":" + json(metadata).dump();
    for (const TensorEntry& t : tensors) {
      if (t.name == kMetadataKey || !names.insert(t.name).second) {
        return fail(t, "the name is reserved or used twice");
      }
      json entry = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
      if (text.size() > 1) text += ",";
      text += json(t.name).dump() + ":" + entry.dump();
    }
  } catch (const json::exception& e) {  // a name or value that is not UTF-8
    return invalid_argument(std::string("cannot encode safetensors header: ") + e.what());
  }
  text += "}";
  const uint64_t unpadded = 8 + text.size();
  text.append((alignment - unpadded % alignment) % alignment, ' ');
  if (text.size() > kMaxHeaderLength) {
    return invalid_argument("safetensors header of " + std::to_string(text.size()) +
                            " bytes is past the format's limit of " +
                            std::to_string(kMaxHeaderLength));
  }
  std::string out;
  out.reserve(8 + text.size());
  put_u64(out, text.size());
  return out + text;
}

Result<uint64_t> header_length(std::string_view first8, const std::string& path) {
  if (first8.size() < 8) {
    return corrupt("safetensors file '" + path + "' is truncated: " +
                   std::to_string(first8.size()) + " bytes, fewer than the 8 of its header length");
  }
  const uint64_t length = get_u64(reinterpret_cast<const std::byte*>(first8.data()));
  if (length > kMaxHeaderLength) {
    return corrupt("safetensors file '" + path + "' states a header of " + std::to_string(length) +
                   " bytes, past the format's limit of " + std::to_string(kMaxHeaderLength));
  }
  return length;
}

Result<Header> decode_header(std::string_view file_prefix, uint64_t file_size,
                             const std::string& path) {
  ZW_ASSIGN_OR_RETURN(uint64_t length, header_length(file_prefix.substr(0, 8), path));
  Header header;
  header.data_start = 8 + length;
  if (header.data_start > file_size) {
    return corrupt("safetensors file '" + path + "' states a header of " + std::to_string(length) +
                   " bytes but the file has " + std::to_string(file_size) + " (truncated?)");
  }
  if (file_prefix.size() < header.data_start) {
    return invalid_argument("decoding the safetensors header of '" + path + "' needs its first " +
                            std::to_string(header.data_start) + " bytes, given " +
                            std::to_string(file_prefix.size()));
  }
  const std::string_view text = file_prefix.substr(8, length);
  auto fail = [&](const std::string& why) {
    return corrupt("safetensors header of '" + path + "': " + why);
  };
  if (text.empty() || text.front() != '{') return fail("does not start with '{'");

  // The JSON parser keeps the last of two equal keys; a tensor named twice is corrupt, not a
  // choice to make silently.
  std::set<std::string> keys;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 &&
        !keys.insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  json root;
  try {
    root = json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {
    return fail(std::string("not valid JSON: ") + e.what());
  }
  if (!duplicate.empty()) return fail("'" + duplicate + "' appears twice");
  if (!root.is_object()) return fail("is not a JSON object");

  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      ZW_ASSIGN_OR_RETURN(header.metadata, parse_metadata(value, path));
      continue;
    }
    ZW_ASSIGN_OR_RETURN(TensorEntry entry, parse_entry(key, value, path));
    header.tensors.push_back(std::move(entry));
  }
  // Data order; a zero-byte tensor shares its offset with a neighbour, so ties go by end, name.
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorEntry& a, const TensorEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  ZW_RETURN_IF_ERROR(
      check_layout(header.tensors, [&](const TensorEntry& t, const std::string& why) {
        return fail("tensor '" + t.name + "': " + why);
      }));
  const uint64_t data_end = header.tensors.empty() ? 0 : header.tensors.back().end;
  if (data_end != file_size - header.data_start) {
    return fail("the tensors cover " + std::to_string(data_end) +
                " bytes of data but the file has " + std::to_string(file_size - header.data_start) +
                " after the header");
  }
  return header;
}

}  // namespace zerowait::internal::safetensors
