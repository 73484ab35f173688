// The first step of pack: walk the directory sources and group their files into samples, in a
// deterministic order (sorted keys, sorted fields), before any file content is read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/shard/pack.hpp"

namespace zerowait::internal {

struct PlannedField {
  std::string name;  // field name ("jpg", "seg.png", "cls")
  std::string path;  // file to read; empty for a synthesized field (see `inline_value`)
  std::string inline_value;
  uint64_t size = 0;  // size at planning time (progress only; the bytes read are authoritative)
};

struct PlannedSample {
  std::string key;
  std::vector<PlannedField> fields;
};

struct SourcePlan {
  std::string source;
  bool is_tar = false;                 // streamed by the tar path instead; counted as it streams
  std::vector<PlannedSample> samples;  // directories only
  uint64_t archive_bytes = 0;          // tar only: the archive's size (cuts --part ranges)
  uint64_t files = 0;
  uint64_t bytes = 0;
};

struct PackPlan {
  std::vector<SourcePlan> sources;
  std::vector<std::string> classes;  // ImageFolder classes, sorted
  uint64_t ignored = 0;              // files that form no sample (no extension, not an image...)
  uint64_t files = 0;
  uint64_t bytes = 0;
};

// True for .tar, .tar.gz and .tgz source files.
bool is_tar_source(const std::string& path);

// Walks every source. Missing sources are kNotFound; unreadable directories kIo.
Result<PackPlan> plan_pack(const PackOptions& options);

}  // namespace zerowait::internal
