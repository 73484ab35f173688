// Writes one rank's part of a save (part_writer.cpp): hashes the staged tensors, decides what an
// incremental save writes again, writes and fsyncs the files (safetensors, or zstd chunks) into
// step-N.tmp, then this rank's manifest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpointer_state.hpp"

namespace zerowait {

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
