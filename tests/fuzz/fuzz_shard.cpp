// libFuzzer target: bytes opened as a shard, then every sample read with checksum verification,
// and the same bytes parsed as a manifest. Any crash, hang or sanitizer report is a bug; errors
// are expected.
//
// Random bytes never get past the index checksum, so the structure checks of docs/format.md
// (sizes add up, ranges inside the data region, fields inside samples, names) would go unfuzzed.
// The custom mutator below therefore takes a shard apart (bytes before the index, the index, the
// footer), mutates one part with libFuzzer's own mutator and re-seals the result: the footer
// records the index's new place, size and checksum and gets its own checksum, as the writer
// does. One mutation in eight is a plain byte mutation of the whole input, so the header and
// checksum checks stay fuzzed too. Seeds: real shards (tests/fuzz/make_seeds.sh).
//
// At exit the target prints how many inputs reached ShardIndex::parse (footer valid and index
// checksum matching: ShardReader::open had to parse the index) and how many opened.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>

#include "common/endian.hpp"
#include "zerowait/storage/byte_source.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/manifest.hpp"
#include "zerowait/shard/reader.hpp"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

using namespace zerowait;

struct Counters {
  uint64_t inputs = 0;
  uint64_t sealed = 0;  // footer valid and index checksum matching: reached ShardIndex::parse
  uint64_t opened = 0;  // ShardReader::open accepted the input
  ~Counters() {
    std::fprintf(stderr,
                 "fuzz_shard: %llu inputs, %llu reached ShardIndex::parse (valid footer and index "
                 "checksum), %llu opened as shards\n",
                 static_cast<unsigned long long>(inputs), static_cast<unsigned long long>(sealed),
                 static_cast<unsigned long long>(opened));
  }
};
Counters counters;

std::span<const std::byte> as_bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const std::byte*>(data), size};
}

// The footer's fields as stored, whether or not its checksum holds.
format::Footer raw_footer(const std::byte* p) {
  using namespace format::footer_at;
  format::Footer f;
  f.index_offset = internal::get_u64(p + kIndexOffset);
  f.index_size = internal::get_u64(p + kIndexSize);
  f.index_checksum = internal::get_u64(p + kIndexChecksum);
  f.sample_count = internal::get_u64(p + kSampleCount);
  f.data_offset = internal::get_u64(p + kDataOffset);
  f.version = internal::get_u32(p + kVersion);
  f.flags = internal::get_u32(p + kFlags);
  return f;
}

// Whether ShardReader::open gets as far as ShardIndex::parse for `bytes`.
bool reaches_index_parse(std::span<const std::byte> bytes) {
  if (bytes.size() < format::kHeaderSize + format::kFooterSize) return false;
  uint32_t flags = 0;
  if (!format::decode_header(bytes, &flags, "fuzz.zws").is_ok()) return false;
  auto footer = format::decode_footer(bytes.last(format::kFooterSize), bytes.size(), "fuzz.zws");
  if (!footer.is_ok() || footer->flags != flags) return false;
  return format::checksum(bytes.subspan(footer->index_offset, footer->index_size)) ==
         footer->index_checksum;
}

// Runs libFuzzer's mutator on `part` with room to grow up to `max_size` bytes.
void mutate(std::string& part, size_t max_size) {
  const size_t size = part.size();
  part.resize(std::max(max_size, size));
  part.resize(LLVMFuzzerMutate(reinterpret_cast<uint8_t*>(part.data()), size, part.size()));
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::minstd_rand rng(seed);
  const size_t min_size = format::kHeaderSize + format::kFooterSize;
  const bool shard_like =
      size >= min_size && std::memcmp(data + size - 8, format::kFooterMagic, 8) == 0;
  if (!shard_like || rng() % 8 == 0) return LLVMFuzzerMutate(data, size, max_size);

  const std::byte* footer_p = reinterpret_cast<const std::byte*>(data + size - format::kFooterSize);
  format::Footer footer = raw_footer(footer_p);
  const uint64_t footer_at = size - format::kFooterSize;
  if (footer.index_offset > footer_at || footer.index_size > footer_at - footer.index_offset) {
    return LLVMFuzzerMutate(data, size, max_size);
  }
  std::string before(reinterpret_cast<const char*>(data), footer.index_offset);
  std::string index(reinterpret_cast<const char*>(data) + footer.index_offset, footer.index_size);
  // The most bytes a part may grow to with the other part and the footer beside it.
  auto room = [&](size_t other) {
    return max_size > other + format::kFooterSize ? max_size - other - format::kFooterSize : 0;
  };
  switch (rng() % 8) {
    case 0:  // the data region (and the header with it)
      mutate(before, room(index.size()));
      if (before.size() < format::kHeaderSize) before.resize(format::kHeaderSize);
      break;
    case 1: {  // the footer's fields: the index stays as it is, only the footer is resealed
      std::string fields(reinterpret_cast<const char*>(footer_p), format::footer_at::kChecksum);
      mutate(fields, fields.size());
      fields.resize(format::footer_at::kChecksum);
      const std::string sealed =
          format::encode_footer(raw_footer(reinterpret_cast<const std::byte*>(fields.data())));
      std::memcpy(data + footer_at, sealed.data(), sealed.size());
      return size;
    }
    default:  // the index: what the structure checks read
      mutate(index, room(before.size()));
      break;
  }
  footer.index_offset = before.size();
  footer.index_size = index.size();
  footer.index_checksum = format::checksum(std::as_bytes(std::span(index)));
  const std::string out = before + index + format::encode_footer(footer);
  if (out.size() > max_size) return LLVMFuzzerMutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ++counters.inputs;
  const auto bytes = as_bytes(data, size);
  if (reaches_index_parse(bytes)) ++counters.sealed;
  auto reader = ShardReader::open(make_memory_source("fuzz.zws", bytes));
  if (reader.is_ok()) {
    ++counters.opened;
    for (uint64_t i = 0; i < (*reader)->size() && i < 10000; ++i) {
      (void)(*reader)->read_sample(i, ReadOptions{.verify = true});
    }
    (void)(*reader)->verify([](const BadSample&) {});
  }
  (void)Manifest::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
  return 0;
}
