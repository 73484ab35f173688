// Writes one rank's part of a save (part_writer.cpp): hashes the staged tensors, decides what an
// incremental save writes again, writes and fsyncs the files (safetensors, or zstd chunks) into
// step-N.tmp, then this rank's manifest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpointer_state.hpp"

namespace zerowait {

// Whether a tensor of `bytes` starts a new file when `file_bytes` of tensors are in the current
// one (`first`: no file yet): files are cut at about max_file_bytes, never before their first
// tensor. write_part() plans the files by it; the staging layout follows the same cut.
inline bool starts_new_file(bool first, uint64_t file_bytes, uint64_t bytes,
                            uint64_t max_file_bytes) {
  return first || (file_bytes > 0 && file_bytes + bytes > max_file_bytes);
}

// Where each tensor goes in a save's staging pool, laid out as the tensor files' data: the
// tensors of a file back to back (aligned to their element size only, as safetensors packs them)
// from a page-aligned start. So an uncompressed file's data is, in the usual case (every tensor
// written, none with padding before it), one span of staging whose offsets in memory and in the
// file agree modulo the page: O_DIRECT writes it straight from staging, with no copy into a write
// buffer (src/storage/local/local_store.cpp). Returns the offsets and sets `total`.
std::vector<uint64_t> staging_layout(const std::vector<TensorToSave>& tensors,
                                     uint64_t max_file_bytes, uint64_t* total);

struct FilePlan {
  std::string path;             // relative to the root
  std::vector<size_t> tensors;  // indices into the job's tensors, in data order
};

class PartWriter {
 public:
  PartWriter(CheckpointerState& state, SaveJob& job) : state_(state), job_(job) {}

  // Hashes, picks what to write, writes and fsyncs the files and this rank's manifest.
  Status write_part();

  RankManifest& manifest() { return manifest_; }
  uint64_t bytes_written() const { return bytes_written_; }
  uint64_t tensors_written() const { return tensors_written_; }

 private:
  Status write_safetensors(const FilePlan& plan, StoredFile& out);
  Status write_compressed(const FilePlan& plan, StoredFile& out);

  CheckpointerState& state_;
  SaveJob& job_;
  std::string tmp_dir_;
  std::vector<StoredTensor> stored_;  // per job tensor
  RankManifest manifest_;
  uint64_t bytes_written_ = 0;
  uint64_t tensors_written_ = 0;
};

}  // namespace zerowait
