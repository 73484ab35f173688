#include "shard/pack/pack_part.hpp"

#include <charconv>
#include <cstdio>
#include <filesystem>

#include "common/xxhash.hpp"
#include "zerowait/shard/format.hpp"

namespace zerowait {
namespace internal {
namespace {

uint64_t unit_weight(const PlannedSample& s) {
  uint64_t bytes = 1;
  for (const PlannedField& f : s.fields) bytes += f.size;
  return bytes;
}

uint64_t unit_weight(const SourcePlan& tar) { return tar.archive_bytes + 1; }

// Feeds values into an XXH3 unambiguously: strings carry their length.
class Fingerprint {
 public:
  void add(uint64_t value) { hash_.update(&value, sizeof value); }
  void add(const std::string& text) {
    add(uint64_t{text.size()});
    hash_.update(text.data(), text.size());
  }
  std::string hex() const { return format::checksum_hex(hash_.digest()); }

 private:
  Xxh3Stream hash_;
};

}  // namespace

Status check_part(uint32_t index, uint32_t count) {
  if (count == 0 || index >= count) {
    return invalid_argument("part " + std::to_string(index) + "/" + std::to_string(count) +
                            " does not exist: --part I/N needs 0 <= I < N (parts are numbered "
                            "from 0: 0/4 to 3/4 are the four parts of four)");
  }
  return Status::ok();
}

std::string input_fingerprint(const PackPlan& full, const PackOptions& options) {
  Fingerprint f;
  f.add(std::string("zerowait pack --part 1"));  // bump when what the fingerprint covers changes
  f.add(uint64_t{options.part_count});
  f.add(uint64_t{options.imagefolder} | uint64_t{options.align} << 1 |
        uint64_t{options.verify_images} << 2);
  f.add(uint64_t{full.classes.size()});
  for (const std::string& c : full.classes) f.add(c);
  f.add(uint64_t{full.sources.size()});
  for (const SourcePlan& source : full.sources) {
    f.add(uint64_t{source.is_tar});
    if (source.is_tar) {
      f.add(std::filesystem::path(source.source).filename().string());
      f.add(source.archive_bytes);
      continue;
    }
    f.add(uint64_t{source.samples.size()});
    for (const PlannedSample& s : source.samples) {
      f.add(s.key);
      f.add(uint64_t{s.fields.size()});
      for (const PlannedField& field : s.fields) {
        f.add(field.name);
        f.add(field.size);
        f.add(field.inline_value);
      }
    }
  }
  return f.hex();
}

PartPlan select_part(PackPlan full, const PackOptions& options) {
  PartPlan part;
  part.input = input_fingerprint(full, options);
  unsigned __int128 total = 0;
  for (const SourcePlan& source : full.sources) {
    if (source.is_tar) total += unit_weight(source);
    for (const PlannedSample& s : source.samples) total += unit_weight(s);
  }
  // The part holding the first byte of a unit that starts `before` bytes into the listing.
  const auto part_of = [&](unsigned __int128 before) {
    return static_cast<uint32_t>(before * options.part_count / total);
  };
  unsigned __int128 before = 0;
  PackPlan& plan = part.plan;
  plan.classes = std::move(full.classes);
  plan.ignored = options.part_index == 0 ? full.ignored : 0;  // counted once, by part 0
  for (SourcePlan& source : full.sources) {
    if (source.is_tar) {
      const uint32_t p = part_of(before);
      before += unit_weight(source);
      if (p == options.part_index) plan.sources.push_back(std::move(source));
      continue;
    }
    SourcePlan kept;
    kept.source = std::move(source.source);
    for (PlannedSample& s : source.samples) {
      const uint32_t p = part_of(before);
      before += unit_weight(s);
      if (p < options.part_index) part.earlier_keys.insert(s.key);
      if (p != options.part_index) continue;
      for (const PlannedField& field : s.fields) {
        kept.files += field.path.empty() ? 0 : 1;
        kept.bytes += field.size;
      }
      kept.samples.push_back(std::move(s));
    }
    plan.files += kept.files;
    plan.bytes += kept.bytes;
    plan.sources.push_back(std::move(kept));
  }
  return part;
}

}  // namespace internal

Status parse_pack_part(std::string_view text, uint32_t* index, uint32_t* count) {
  const size_t slash = text.find('/');
  const auto parse = [](std::string_view digits, uint32_t* value) {
    const char* end = digits.data() + digits.size();
    auto [stop, error] = std::from_chars(digits.data(), end, *value);
    return !digits.empty() && error == std::errc() && stop == end;
  };
  if (slash == std::string_view::npos || !parse(text.substr(0, slash), index) ||
      !parse(text.substr(slash + 1), count)) {
    return invalid_argument(
        "expected I/N, two integers with 0 <= I < N (0/4 to 3/4 are the four "
        "parts of four), got '" +
        std::string(text) + "'");
  }
  return internal::check_part(*index, *count);
}

std::string pack_part_dir_name(uint32_t index, uint32_t count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "part-%04u-of-%04u", index, count);
  return buf;
}

}  // namespace zerowait
