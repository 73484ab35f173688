// The dataset manifest (manifest.json): one file that lists every shard, so opening a dataset of
// 10,000 shards reads one file, not 10,000.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait {

struct ManifestShard {
  std::string path;  // relative to the manifest's directory
  uint64_t samples = 0;
  uint64_t bytes = 0;    // file size
  std::string checksum;  // the shard's index checksum (footer), 16 hex digits
};

// Which part of a `zerowait pack --part I/N` run a manifest describes. Only part manifests carry
// one; merge_parts() (zerowait/shard/pack.hpp) joins parts into a manifest without it.
struct ManifestPart {
  uint32_t index = 0;  // I, < count
  uint32_t count = 0;  // N, > 1
  std::string input;   // fingerprint of the full input listing and options, 16 hex digits
};

// A plain value: no hidden state, safe to copy and to read from many threads; not synchronised
// for concurrent modification. parse() and load() return kCorrupt for a document that is not a
// valid manifest (naming the file and the field or shard entry), kUnsupported for an unknown
// version.
struct Manifest {
  static constexpr const char* kFormatName = "zerowait-dataset";

  uint32_t version = 1;
  uint64_t samples = 0;
  uint64_t bytes = 0;
  bool aligned = false;
  std::vector<std::string> fields;   // every field name that occurs, sorted
  std::vector<std::string> classes;  // ImageFolder class names; "cls" values index this
  std::optional<ManifestPart> part;  // absent for a whole dataset
  std::vector<ManifestShard> shards;

  // JSON text (stable key order, so equal manifests are equal bytes).
  std::string to_json() const;
  // Parses and validates (format name, version, counts add up). `name` goes into errors.
  static Result<Manifest> parse(const std::string& json_text, const std::string& name);
  static Result<Manifest> load(const std::string& path);
  // Writes to "<path>.tmp", fsyncs, renames over `path`, fsyncs the directory.
  Status save(const std::string& path, bool sync = true) const;
};

}  // namespace zerowait
