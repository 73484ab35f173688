// A tensor file's checksum as its manifest records it (StoredFile::checksum): of the whole file,
// or of its segments — the safetensors header, then each non-empty tensor's bytes — so that a
// writer whose tensors are hashed already (the manifest's per-tensor xxh3s) hashes only the header.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/xxhash.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// The xxh3 over segment checksums added in file order (each as 8 little-endian bytes).
class SegmentDigest {
 public:
  void add(uint64_t segment_xxh3);
  uint64_t digest() const { return combined_.digest(); }

 private:
  Xxh3Stream combined_;
};

// Computes `file`'s checksum by its scheme from the file's bytes, given in order.
// update(): for kSegments, kCorrupt naming `name` when the header does not parse (checked as
// soon as it is whole); digest(): once every byte was given.
class FileDigest {
 public:
  FileDigest(const StoredFile& file, std::string name);
  Status update(std::span<const std::byte> piece);
  uint64_t digest() const;

 private:
  Status take_header();

  const StoredFile& file_;
  std::string name_;
  uint64_t offset_ = 0;          // bytes given so far
  Xxh3Stream whole_;             // kWholeFile: every byte; kSegments: the current segment's
  std::string header_;           // kSegments: the header as it arrives
  bool header_done_ = false;
  std::vector<uint64_t> ends_;   // kSegments: absolute end of each tensor segment, in order
  size_t segment_ = 0;           // the tensor segment bytes go to next
  SegmentDigest segments_;
};

}  // namespace zerowait::internal
