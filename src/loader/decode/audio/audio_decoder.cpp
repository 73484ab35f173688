// "audio": an audio file (an AudioClip) into float32 [channels, length] rows, with
// "<field>.lengths" int64 the frames of each row before its zero padding.
#include <cstring>

#include "loader/decode/common.hpp"
#include "zerowait/loader/audio_clip.hpp"
#include "zerowait/loader/field_decoder.hpp"

namespace zerowait {

namespace {

class AudioDecoder final : public FieldDecoder {
 public:
  explicit AudioDecoder(const AudioClip& clip) : clip_(clip) {}

  FieldLayout layout() const override {
    return {
        .byte_rows = false,
        .columns = {{"", DType::kFloat32, {int64_t(clip_.channels), int64_t(clip_.length)}, false},
                    {".lengths", DType::kInt64, {}, true}}};
  }

  Status decode(std::optional<std::span<const std::byte>> field, DecodeOutput& out,
                DecodeScratch*) const override {
    if (!field) return missing_field();
    auto* row = reinterpret_cast<float*>(out.rows[0]);
    ZW_ASSIGN_OR_RETURN(const uint64_t frames, clip_.decode(*field, out.seed, row));
    const auto length = static_cast<int64_t>(frames);
    std::memcpy(out.rows[1], &length, sizeof length);
    return Status::ok();
  }

 private:
  const AudioClip clip_;
};

}  // namespace

Result<std::unique_ptr<FieldDecoder>> make_audio_decoder(const std::any& options) {
  return internal::make_decoder<AudioDecoder, AudioClip>(options, "audio", "AudioClip");
}

}  // namespace zerowait
