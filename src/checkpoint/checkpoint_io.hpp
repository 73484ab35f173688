// File operations the checkpoint engine builds its commit protocol from, on any Store.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait::internal {

// How long a checkpoint waits for its own copies between CUDA memory and pinned staging. They
// are queued behind the caller's GPU work, which may be long; a GPU that has not got there by
// then is hung, and the wait says so instead of hanging the job.
inline constexpr std::chrono::minutes kDeviceCopyTimeout{10};

// create → write → fsync → close (Store::put), all within the metadata deadline.
Status write_small_file(Store& target, const std::string& path, std::string_view bytes);
// Makes `dir/name` appear whole or not at all: "name.tmp", fsync, rename, fsync of `dir`.
Status publish_small_file(Store& target, const std::string& dir, const std::string& name,
                          std::string_view bytes);
// kCorrupt "'<path>' is N bytes, its manifest says M (truncated or replaced)".
Status size_mismatch(const std::string& path, uint64_t actual, uint64_t expected);
// Reads `source`, which its manifest says is `file.bytes` long (else size_mismatch), in
// 8 MiB pieces, each read within `read_timeout`, giving each piece to `each` with its offset;
// returns the file's checksum by `file.checksum` (file_digest.hpp), to compare with `file.xxh3`.
Result<uint64_t> stream_source(
    ByteSource& source, const StoredFile& file, std::chrono::nanoseconds read_timeout,
    const std::function<Status(uint64_t offset, std::span<const std::byte> piece)>& each);
// Copies `file` from one target to another (written to `to_path`) through their Store reads and
// writes, each read within kDefaultReadTimeout, hashing the bytes on the way: kCorrupt, naming
// the source, when they do not match its checksum or size. The copy is fsynced and closed; each
// of its write calls within `write_timeout`.
Status copy_verified(Store& from, const StoredFile& file, Store& to, const std::string& to_path,
                     std::chrono::nanoseconds write_timeout);
// kAlreadyExists when `tier` already holds committed step `step` (saved by another run, or
// earlier by this one: a tier never gets a step number twice), naming the tier, both runs and
// when the step there was committed; ok when it does not. `run_id` is the run asking.
Status require_step_free(Store& tier, uint64_t step, const std::string& run_id);
// Copies committed step `step` (every rank's files, manifests and the commit record, plus any
// older file it references that `to` lacks) with the same commit protocol as a save: files into
// step-N.tmp, fsync, commit record last, rename, fsync, latest pointer. A step `to` already has
// with the same commit record is left alone; with another one (another run's step N) it is
// kAlreadyExists, as when that step appears in `to` while this copy is made. Each write call on
// a copied file gets `write_timeout`.
Status mirror_step(Store& from, Store& to, uint64_t step, std::chrono::nanoseconds write_timeout);

}  // namespace zerowait::internal
