// Fuzzes tar reading: the header and pax parsers, the index builder (and every sample of an index
// it accepts), and the streaming walker over an input of unknown length, as a gzip stream is.
#include <cstdlib>
#include <cstring>

#include "shard/tar/tar_header.hpp"
#include "zerowait/shard/reader.hpp"
#include "zerowait/shard/webdataset.hpp"

namespace {

using namespace zerowait;

// A stream whose length is only found by reading to its end.
class UnsizedInput final : public internal::TarInput {
 public:
  explicit UnsizedInput(std::span<const std::byte> bytes) : bytes_(bytes) {}
  Result<size_t> read(std::span<std::byte> dst) override {
    const size_t n = std::min(dst.size(), bytes_.size() - pos_);
    if (n > 0) std::memcpy(dst.data(), bytes_.data() + pos_, n);
    pos_ += n;
    return n;
  }
  Result<uint64_t> skip(uint64_t n) override {
    n = std::min<uint64_t>(n, bytes_.size() - pos_);
    pos_ += n;
    return n;
  }
  uint64_t position() const override { return pos_; }
  std::optional<uint64_t> known_size() const override { return std::nullopt; }

 private:
  std::span<const std::byte> bytes_;
  size_t pos_ = 0;
};

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);

  if (size >= internal::kTarBlockSize) {
    internal::TarHeader header;
    (void)internal::parse_tar_header(bytes.first<internal::kTarBlockSize>(), &header);
  }
  internal::PaxOverrides pax;
  (void)internal::parse_pax_records(std::string_view(reinterpret_cast<const char*>(data), size),
                                    &pax);

  std::shared_ptr<ByteSource> source = make_memory_source("fuzz.tar", bytes);
  auto index = build_tar_index(*source);
  if (index.is_ok()) {
    // Whatever the builder accepts must pass the validation a sidecar load applies.
    const std::string serialized = index->serialize();
    check(format::ShardIndex::parse(std::as_bytes(std::span(serialized)), 0, size, "fuzz.tar")
              .is_ok());
    ShardReader reader(source, std::move(*index), format::kNoChecksums, ShardKind::kTar);
    for (uint64_t i = 0; i < reader.size(); ++i) check(reader.read_sample(i).is_ok());
  }

  UnsizedInput input(bytes);
  internal::TarWalker walker(&input, "fuzz.tar");
  internal::TarMember member;
  zerowait::internal::ByteBuffer member_data;
  for (int n = 0;; ++n) {
    auto more = walker.next(&member);
    if (!more.is_ok() || !*more) break;
    // Read every other member, skip the rest: both paths through the walker.
    if (n % 2 == 0 && !walker.read_data(&member_data).is_ok()) break;
  }
  return 0;
}
