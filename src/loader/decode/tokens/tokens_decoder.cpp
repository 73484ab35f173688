// "tokens": a token sequence (a TokenWindow) into int64 (or int32) [seq_len] rows, with
// "<field>.lengths" int64 the tokens of each row before its padding.
#include <cstring>

#include "loader/decode/common.hpp"
#include "zerowait/loader/field_decoder.hpp"
#include "zerowait/loader/token_window.hpp"

namespace zerowait {

namespace {

class TokensDecoder final : public FieldDecoder {
 public:
  explicit TokensDecoder(const TokenWindow& window) : window_(window) {}

  FieldLayout layout() const override {
    const DType dtype = window_.int32_rows ? DType::kInt32 : DType::kInt64;
    return {.byte_rows = false,
            .columns = {{"", dtype, {int64_t(window_.seq_len)}, false},
                        {".lengths", DType::kInt64, {}, true}}};
  }

  Status decode(std::optional<std::span<const std::byte>> field, DecodeOutput& out,
                DecodeScratch*) const override {
    if (!field) return missing_field();
    ZW_ASSIGN_OR_RETURN(const uint64_t taken, window_.decode(*field, out.seed, out.rows[0]));
    const auto length = static_cast<int64_t>(taken);
    std::memcpy(out.rows[1], &length, sizeof length);
    return Status::ok();
  }

 private:
  const TokenWindow window_;
};

}  // namespace

Result<std::unique_ptr<FieldDecoder>> make_tokens_decoder(const std::any& options) {
  return internal::make_decoder<TokensDecoder, TokenWindow>(options, "tokens", "TokenWindow");
}

}  // namespace zerowait
