// What a committed checkpoint step records, and how to list and read those records without a
// Checkpointer. Layout and every field: docs/checkpoint.md; the JSON the manifests are written in:
// docs/checkpoint-manifest.schema.json (C++, `zerowait ckpt ... --json` and Python all use it).
//
// Thread-safety: the functions only read, through the target's calls, which are thread-safe; they
// may run from several threads at once. The records are plain values the caller owns.
// Errors: kNotFound "step N is not a committed checkpoint in ..." for a step without a commit
// record; kCorrupt naming the file for a record that does not parse, does not match the checksum
// the commit record holds, or describes another step or rank; the target's kIo otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait {

// Where a tensor's bytes are stored.
struct StoredTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  uint64_t xxh3 = 0;    // of the raw bytes
  std::string file;     // relative to the checkpoint root: "step-90/rank-00000-00001.safetensors"
  uint64_t offset = 0;  // of the (first) stored byte in that file
  uint64_t stored_bytes = 0;     // nbytes, or the compressed size
  std::string codec = "none";    // "none" | "zstd"
  uint32_t group_bytes = 1;      // byte grouping element size (1: none)
  uint64_t chunk_bytes = 0;      // raw bytes per compressed chunk
  std::vector<uint64_t> chunks;  // compressed size of each chunk
};

// What a file's xxh3 is computed over (docs/checkpoint.md, "A file's checksum").
enum class FileChecksum {
  kWholeFile,  // every byte in order: compressed files, and every file of format version 1
  // The xxh3 of the 8-byte little-endian xxh3s of the file's segments, in order: its safetensors
  // header (length bytes and JSON), then each non-empty tensor's bytes. A writer that holds each
  // tensor's checksum already (the manifest's) hashes only the header.
  kSegments,
};

struct StoredFile {
  std::string path;  // relative to the checkpoint root
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;  // of the whole file, or of its segments: see `checksum`
  FileChecksum checksum = FileChecksum::kWholeFile;
  std::string container;  // "safetensors" | "zerowait-zstd"
};

// One rank's part of a committed step.
struct RankManifest {
  uint64_t step = 0;
  std::string run_id;  // the run that saved it ("" in checkpoints older than run ids)
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // Ranks meeting through files: the rank 0 (its token in the directory's `coordinator` file)
  // this part was written for; rank 0 commits only parts carrying its own. "" otherwise.
  std::string coordinator;
  std::string structure_json;
  std::vector<StoredTensor> tensors;
  std::vector<StoredFile> files;  // every file the tensors live in, this step's and older ones
};

struct StepInfo {
  uint64_t step = 0;
  std::string run_id;  // the run that committed it (rank 0's); "" in older checkpoints
  uint32_t world_size = 1;
  uint64_t bytes_total = 0;          // raw tensor bytes, all ranks
  uint64_t bytes_stored = 0;         // bytes in this step's own files, all ranks
  std::vector<uint64_t> references;  // older steps whose files it uses
  std::string created;               // ISO 8601 UTC
};

// The directory names: "step-N", "step-N.tmp".
std::string step_directory(uint64_t step);

// Each call below makes its listings and reads within `deadline` (kDeadlineExceeded naming the
// object after it).
// Committed steps (directories "step-N" holding manifest.json), ascending. Does not verify data.
Result<std::vector<uint64_t>> list_steps(Store& target, Deadline deadline = metadata_deadline());
// Reads and validates step N's commit record.
Result<StepInfo> read_step_info(Store& target, uint64_t step,
                                Deadline deadline = metadata_deadline());
// Reads rank `rank`'s manifest of committed step N (validated against the commit record);
// kInvalidArgument when the step was saved by fewer ranks.
Result<RankManifest> read_rank_manifest(Store& target, uint64_t step, uint32_t rank,
                                        Deadline deadline = metadata_deadline());
// Every rank's manifest of committed step N, rank 0 first (the first error, if any).
Result<std::vector<RankManifest>> read_rank_manifests(Store& target, uint64_t step,
                                                      Deadline deadline = metadata_deadline());

}  // namespace zerowait
