// The field decoder registry: the table decoders.inc lists, looked up by name.
#include <algorithm>
#include <string_view>

#include "zerowait/loader/field_decoder.hpp"

namespace zerowait {

#define ZW_FIELD_DECODER(name, factory) \
  Result<std::unique_ptr<FieldDecoder>> factory(const std::any& options);
#include "loader/decode/decoders.inc"
#undef ZW_FIELD_DECODER

namespace {

struct Registered {
  std::string_view name;
  Result<std::unique_ptr<FieldDecoder>> (*make)(const std::any& options);
};

constexpr Registered kDecoders[] = {
#define ZW_FIELD_DECODER(name, factory) {name, &factory},
#include "loader/decode/decoders.inc"
#undef ZW_FIELD_DECODER
};

}  // namespace

uint64_t DecodedColumn::row_bytes() const {
  uint64_t bytes = dtype_size(dtype);
  for (int64_t dim : row_shape) bytes *= uint64_t(dim);
  return bytes;
}

Result<std::unique_ptr<FieldDecoder>> make_field_decoder(const FieldDecode& spec) {
  for (const Registered& r : kDecoders) {
    if (r.name == spec.decoder) return r.make(spec.options);
  }
  std::string known;
  for (const std::string& name : field_decoder_names()) {
    known += (known.empty() ? "" : ", ") + name;
  }
  return invalid_argument("no decoder is named '" + spec.decoder + "' (one of " + known + ")");
}

std::vector<std::string> field_decoder_names() {
  std::vector<std::string> names;
  for (const Registered& r : kDecoders) names.emplace_back(r.name);
  std::sort(names.begin(), names.end());
  return names;
}

Status missing_field() { return corrupt("is missing"); }

}  // namespace zerowait
