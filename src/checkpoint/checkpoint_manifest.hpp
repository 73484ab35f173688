// The JSON documents of a checkpoint step and the names inside its directory:
//
//   step-N/manifest.json            the commit record, written last by rank 0
//   step-N/rank-RRRRR.json          rank R's manifest: its structure, tensors and files
//   step-N/rank-RRRRR-FFFFF.safetensors | .zwc   rank R's tensor files
//
// No pickle anywhere: every field is plain JSON, described in docs/checkpoint.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerowait/checkpoint/manifest.hpp"

namespace zerowait::internal {

// The commit record's format version.
inline constexpr int kCheckpointFormatVersion = 1;
// The rank manifest's: 2 added files' "xxh3_of" (FileChecksum; absent in 1, where every checksum
// is of the whole file).
inline constexpr int kRankManifestVersion = 2;
inline constexpr const char* kCommitRecordName = "manifest.json";
inline constexpr const char* kLatestPointerName = "latest";
// Ranks meeting through files: the token of the current job's rank 0 (commit_protocol.hpp).
inline constexpr const char* kCoordinatorName = "coordinator";
// The first bytes of a compressed tensor file ("zerowait-zstd" container).
inline constexpr std::string_view kCompressedFileMagic{"ZWCKPT1\n", 8};

struct RankEntry {
  uint32_t rank = 0;
  std::string manifest;  // file name inside the step directory
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

struct CommitRecord {
  StepInfo info;
  std::vector<RankEntry> ranks;
};

std::string encode_commit_record(const CommitRecord& record);
Result<CommitRecord> decode_commit_record(std::string_view json, const std::string& path);
std::string encode_rank_manifest(const RankManifest& manifest);
Result<RankManifest> decode_rank_manifest(std::string_view json, const std::string& path);

std::string hex64(uint64_t value);
std::string rank_manifest_name(uint32_t rank);
// "step-N/manifest.json": the file whose presence makes step N committed.
std::string commit_record_path(uint64_t step);
std::string data_file_name(uint32_t rank, uint32_t index, bool compressed);
// "step-12" -> 12 (tmp false); "step-12.tmp" -> 12 (tmp true); anything else nullopt.
std::optional<uint64_t> parse_step_directory(std::string_view name, bool* tmp);
// The step a stored file path ("step-7/rank-...") belongs to.
std::optional<uint64_t> step_of_path(std::string_view path);
// The current time as ISO 8601 UTC ("2026-11-29T12:00:00Z").
std::string utc_now();

}  // namespace zerowait::internal
