// libFuzzer target: arbitrary bytes opened as a shard, then every sample read with checksum
// verification. Any crash, hang or sanitizer report is a bug; errors are expected.
#include <cstddef>
#include <cstdint>
#include <span>

#include "zerowait/io/byte_source.hpp"
#include "zerowait/shard/manifest.hpp"
#include "zerowait/shard/reader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace zerowait;
  auto bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size);
  auto reader = ShardReader::open(make_memory_source("fuzz.zws", bytes));
  if (reader.is_ok()) {
    for (uint64_t i = 0; i < (*reader)->size() && i < 10000; ++i) {
      (void)(*reader)->read_sample(i, ReadOptions{.verify = true});
    }
    (void)(*reader)->verify([](const BadSample&) {});
  }
  (void)Manifest::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
  return 0;
}
