// What the decoders share: their options out of FieldDecode::options, numbers written as text.
#pragma once

#include <any>
#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "zerowait/common/status.hpp"
#include "zerowait/loader/field_decoder.hpp"

namespace zerowait::internal {

// The decoder's options: `options` when it holds an Options, the defaults when it is empty.
// kInvalidArgument naming `type_name` (the options' name in Python) otherwise.
template <typename Options>
Result<Options> decoder_options(const std::any& options, const char* decoder,
                                const char* type_name) {
  if (!options.has_value()) return Options{};
  if (const Options* given = std::any_cast<Options>(&options)) return *given;
  return invalid_argument(std::string("decoder '") + decoder + "' takes " + type_name + " options");
}

// A factory: a Decoder made from its validated Options (decoder_options(), Options::validate()).
template <typename Decoder, typename Options>
Result<std::unique_ptr<FieldDecoder>> make_decoder(const std::any& options, const char* decoder,
                                                   const char* type_name) {
  ZW_ASSIGN_OR_RETURN(const Options given, decoder_options<Options>(options, decoder, type_name));
  ZW_RETURN_IF_ERROR(given.validate());
  return std::unique_ptr<FieldDecoder>(std::make_unique<Decoder>(given));
}

// The number a field holds as ASCII text (std::from_chars' syntax), white space around it
// allowed. kCorrupt "is not `what` ('<the text>')" otherwise.
template <typename Number>
Result<Number> parse_ascii_number(std::span<const std::byte> bytes, const char* what) {
  std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  Number value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    const std::string shown(text.substr(0, 32));
    return corrupt(std::string("is not ") + what + " ('" + shown + "')");
  }
  return value;
}

// A number written as text (parse_ascii_number; `what` names the kind it must be) into a column
// of `dtype`, one value per sample.
template <typename Number>
class TextNumberDecoder final : public FieldDecoder {
 public:
  TextNumberDecoder(DType dtype, const char* what) : dtype_(dtype), what_(what) {}

  FieldLayout layout() const override {
    return {.byte_rows = false, .columns = {{"", dtype_, {}, true}}};
  }

  Status decode(std::optional<std::span<const std::byte>> field, DecodeOutput& out,
                DecodeScratch*) const override {
    if (!field) return missing_field();
    ZW_ASSIGN_OR_RETURN(const Number value, parse_ascii_number<Number>(*field, what_));
    std::memcpy(out.rows[0], &value, sizeof value);
    return Status::ok();
  }

 private:
  const DType dtype_;
  const char* const what_;
};

}  // namespace zerowait::internal
