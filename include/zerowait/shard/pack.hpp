// `zerowait pack`: turns trees of small files, ImageFolder trees and WebDataset tars into shards
// plus a manifest. Corrupt inputs are quarantined (listed, never packed). A large input can be
// packed in parts on many machines (`pack --part I/N`) and the parts joined with merge_parts().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait {

struct PackProgress {
  uint64_t files_done = 0;
  uint64_t files_total = 0;  // 0 while unknown (tar inputs are counted as they stream)
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

struct PackOptions {
  std::vector<std::string> sources;  // directories, .tar, .tar.gz / .tgz files
  // A local directory, or s3://BUCKET/PREFIX: shards are then uploaded one by one as they are
  // finished, under hash-named key prefixes (PREFIX/3f2a/shard-000042.zws), and the manifest last.
  std::string out_dir;
  // Writes out_dir through this Store instead of the one open_store() gives for it (a FaultStore
  // in tests); out_dir then only names the output in messages.
  std::shared_ptr<Store> out_store;
  // s3:// output only: where each shard is written before its upload (about two shards of local
  // space); empty: $TMPDIR, else /tmp.
  std::string tmp_dir;
  uint64_t shard_size = 256ull << 20;  // a shard is closed once it reaches this many bytes
  unsigned threads = 0;                // file readers; 0 = number of CPUs
  bool align = false;                  // 4 KiB-align every sample
  bool imagefolder = false;            // CLASS/FILE.ext -> fields <ext> and "cls"
  bool verify_images = false;          // full JPEG/PNG decode instead of a header check
  bool overwrite = false;              // replace an existing dataset in out_dir
  bool sync = true;                    // fsync shards, manifest and directory
  // Pack only part `part_index` of `part_count` (`--part I/N`): the full input is listed and cut
  // into `part_count` contiguous ranges of about equal bytes (whole samples, whole tar files);
  // this call packs range `part_index` into out_dir/pack_part_dir_name(I, N) with a manifest
  // that records the part. 0/1 is a plain pack of everything into out_dir.
  uint32_t part_index = 0;
  uint32_t part_count = 1;
  std::function<void(const PackProgress&)> on_progress;  // called from the writer thread
};

struct QuarantineEntry {
  std::string path;  // the input file, or "archive.tar:member"
  std::string reason;
};

struct PackReport {
  uint64_t samples = 0;
  uint64_t files = 0;      // input files packed
  uint64_t ignored = 0;    // inputs that are not sample files (no extension, directories, links)
  uint64_t bytes_in = 0;   // payload bytes packed
  uint64_t bytes_out = 0;  // shard bytes written
  uint64_t shards = 0;
  double seconds = 0;
  std::string manifest_path;  // out_dir/manifest.json, or the part directory's
  std::vector<QuarantineEntry> quarantined;
};

// Packs `options.sources` into `options.out_dir`. Same inputs and options give byte-identical
// output. Shards are written under temporary names and renamed once complete; the manifest is
// written last, so an interrupted pack never leaves a manifest pointing at partial shards.
// A non-empty quarantine is not an error: the report lists it and quarantine.json records it.
// Blocks: the calling thread is the writer (and runs `on_progress`); `threads` reader threads are
// started and joined before it returns, also on error. Errors name the input or output file:
// kInvalidArgument for options, kAlreadyExists for an existing dataset without `overwrite`,
// kIo for reads and writes (a full disk), never a partially published dataset.
// With part_count > 1 the same holds for the part directory; out_dir/manifest.json (a merged
// dataset the part would change) is refused, or removed first with `overwrite`.
// To s3://: the same contract on the prefix (its manifest.json is uploaded last, so a failed pack
// leaves none); errors name the bucket and key. Credentials and endpoint come from the
// environment and AWS files (docs/remote.md). A part goes to PREFIX/part-IIII-of-NNNN.
Result<PackReport> pack(const PackOptions& options);

// Parses `--part I/N`: two decimal integers with 0 <= I < N. kInvalidArgument quoting `text`.
Status parse_pack_part(std::string_view text, uint32_t* index, uint32_t* count);
// "part-0003-of-0008": the directory under out_dir that part 3 of 8 is packed into.
std::string pack_part_dir_name(uint32_t index, uint32_t count);

struct MergeOptions {
  std::string out_dir;  // the directory the parts were packed into; manifest.json goes here
  // Part directories (or their manifest.json) inside out_dir; empty: every directory named
  // part-IIII-of-NNNN directly in out_dir.
  std::vector<std::string> parts;
  bool overwrite = false;  // replace an existing out_dir/manifest.json
  bool sync = true;        // fsync the manifest and out_dir
  // `parts` are whole datasets written on their own (zerowait.ray's write tasks), not the output
  // of `pack --part I/N`: they are taken in the order listed and need no part record (so no
  // fingerprint is compared); every other check holds. `parts` must name them.
  bool whole_datasets = false;
};

struct MergedPart {
  std::string dir;  // relative to out_dir, '/'-separated
  uint32_t index = 0;
  uint64_t samples = 0;
  uint64_t shards = 0;
  uint64_t bytes = 0;
};

struct MergeReport {
  std::string manifest_path;
  uint32_t part_count = 0;
  std::vector<MergedPart> parts;  // in part order
  uint64_t samples = 0;
  uint64_t shards = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

// Joins the parts of one `pack --part I/N` run into out_dir/manifest.json without copying a
// byte of shard data: the merged manifest lists part 0's shards, then part 1's, ... by paths
// relative to out_dir, so the samples come in the order a single pack writes them. Before anything
// is written it checks that every part 0..N-1 is there exactly once, that all were packed from the
// same input listing with the same options (fingerprint, class list, alignment), that every shard
// matches its part's manifest (footer and index are read, not the samples) and that no sample key
// is in two parts. Errors name the part and the fix: kNotFound for a missing part or manifest,
// kInvalidArgument for parts that do not belong together or lie outside out_dir, kAlreadyExists for
// an existing manifest without `overwrite`, kCorrupt for a damaged part. The manifest is written
// atomically (temporary file, rename).
Result<MergeReport> merge_parts(const MergeOptions& options);

}  // namespace zerowait
