#include "checkpoint/checkpoint_io.hpp"

#include <algorithm>
#include <vector>

#include "checkpoint/checkpoint_manifest.hpp"
#include "checkpoint/file_digest.hpp"
#include "common/file.hpp"
#include "common/xxhash.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/checkpoint/restore.hpp"

namespace zerowait::internal {

Status write_small_file(Store& target, const std::string& path, std::string_view bytes) {
  return target.put(
      path,
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()),
      metadata_deadline());
}

Status publish_small_file(Store& target, const std::string& dir, const std::string& name,
                          std::string_view bytes) {
  const std::string prefix = dir.empty() ? "" : dir + "/";
  ZW_RETURN_IF_ERROR(write_small_file(target, prefix + name + kTempSuffix, bytes));
  ZW_RETURN_IF_ERROR(
      target.publish(prefix + name + kTempSuffix, prefix + name, metadata_deadline()));
  return target.sync_directory(dir, metadata_deadline());
}

Status size_mismatch(const std::string& path, uint64_t actual, uint64_t expected) {
  return corrupt("'" + path + "' is " + std::to_string(actual) + " bytes, its manifest says " +
                 std::to_string(expected) + " (truncated or replaced)");
}

Result<uint64_t> stream_source(
    ByteSource& source, const StoredFile& file, std::chrono::nanoseconds read_timeout,
    const std::function<Status(uint64_t offset, std::span<const std::byte> piece)>& each) {
  const uint64_t size = source.size();
  if (size != file.bytes) return size_mismatch(source.name(), size, file.bytes);
  constexpr uint64_t kChunk = 8ull << 20;
  std::vector<std::byte> buffer(std::min(kChunk, std::max<uint64_t>(size, 1)));
  FileDigest digest(file, source.name());
  source.advise_sequential();
  for (uint64_t off = 0; off < size; off += kChunk) {
    std::span<std::byte> piece(buffer.data(), std::min(kChunk, size - off));
    ZW_RETURN_IF_ERROR(source.read_at(off, piece, Deadline::after(read_timeout)));
    ZW_RETURN_IF_ERROR(digest.update(piece));
    ZW_RETURN_IF_ERROR(each(off, piece));
  }
  return digest.digest();
}

Status copy_verified(Store& from, const StoredFile& file, Store& to, const std::string& to_path,
                     std::chrono::nanoseconds write_timeout) {
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source,
                      from.open(file.path, IoBackend::kPread, metadata_deadline()));
  ZW_ASSIGN_OR_RETURN(auto out, to.create(to_path, metadata_deadline()));
  auto digest = stream_source(*source, file, kDefaultReadTimeout,
                              [&](uint64_t offset, std::span<const std::byte> piece) {
                                return out->write_at(offset, piece,
                                                     Deadline::after(write_timeout));
                              });
  if (!digest.is_ok()) return digest.status().with_context("not copied");
  if (digest.value() != file.xxh3) {
    return corrupt("'" + source->name() + "' does not match its checksum (xxh3 " +
                   hex64(digest.value()) + ", manifest " + hex64(file.xxh3) + "); not copied");
  }
  ZW_RETURN_IF_ERROR(out->sync(Deadline::after(write_timeout)));
  return out->close(Deadline::after(write_timeout));
}

namespace {

std::string run_name(const std::string& run_id) {
  return run_id.empty() ? "a run that recorded no run id" : "run " + run_id;
}

}  // namespace

Status require_step_free(Store& tier, uint64_t step, const std::string& run_id) {
  const std::string record_path = step_directory(step) + "/" + kCommitRecordName;
  ZW_ASSIGN_OR_RETURN(bool taken, tier.exists(record_path, metadata_deadline()));
  if (!taken) return Status::ok();
  std::string whose = "an unreadable commit record";
  if (auto text = tier.read(record_path, metadata_deadline()); text.is_ok()) {
    if (auto record = decode_commit_record(text.value(), record_path); record.is_ok()) {
      whose = run_name(record.value().info.run_id) + ", committed " + record.value().info.created;
    }
  }
  return Status(ErrorCode::kAlreadyExists,
                "step " + std::to_string(step) + " already exists in " + tier.describe() + " (" +
                    whose + "); " + run_name(run_id) +
                    " does not overwrite it: save under a new step number, or give each run a "
                    "directory and mirror of its own");
}

Status mirror_step(Store& from, Store& to, uint64_t step, std::chrono::nanoseconds write_timeout) {
  const std::string dir = step_directory(step);
  const std::string tmp = dir + kTempSuffix;
  const std::string record_path = dir + "/" + kCommitRecordName;
  ZW_ASSIGN_OR_RETURN(std::string record_text, from.read(record_path, metadata_deadline()));
  ZW_ASSIGN_OR_RETURN(CommitRecord record, decode_commit_record(record_text, record_path));
  ZW_ASSIGN_OR_RETURN(bool mirrored, to.exists(record_path, metadata_deadline()));
  if (mirrored) {
    // The same commit record (its run, time and every manifest's checksum): already copied.
    auto there = to.read(record_path, metadata_deadline());
    if (there.is_ok() && there.value() == record_text) return Status::ok();
    ZW_RETURN_IF_ERROR(require_step_free(to, step, record.info.run_id));
  }
  ZW_RETURN_IF_ERROR(to.remove_all(tmp, metadata_deadline(), internal::kCommitRecordName));
  ZW_RETURN_IF_ERROR(to.make_directory(tmp, metadata_deadline()));
  std::vector<std::pair<std::string, std::string>> manifests;  // name, text
  for (const RankEntry& entry : record.ranks) {
    const std::string path = dir + "/" + entry.manifest;
    ZW_ASSIGN_OR_RETURN(std::string text, from.read(path, metadata_deadline()));
    if (text.size() != entry.bytes || XXH3_64bits(text.data(), text.size()) != entry.xxh3) {
      return corrupt("'" + path + "' in " + from.describe() +
                     " does not match the commit record's checksum; not mirrored");
    }
    ZW_ASSIGN_OR_RETURN(RankManifest manifest, decode_rank_manifest(text, path));
    for (const StoredFile& file : manifest.files) {
      const uint64_t owner = step_of_path(file.path).value_or(step);
      if (owner == step) {
        const std::string name = file.path.substr(file.path.find('/') + 1);
        ZW_RETURN_IF_ERROR(
            copy_verified(from, file, to, tmp + "/" + name, write_timeout));
        continue;
      }
      // An older step's file this one references: the mirror may have retired that step or
      // never seen it; its directory then holds referenced files only, like a retired step.
      ZW_ASSIGN_OR_RETURN(bool there, to.exists(file.path, metadata_deadline()));
      if (there) continue;
      const std::string owner_dir = step_directory(owner);
      ZW_RETURN_IF_ERROR(to.make_directory(owner_dir, metadata_deadline()));
      ZW_RETURN_IF_ERROR(
          copy_verified(from, file, to, file.path + kTempSuffix, write_timeout));
      ZW_RETURN_IF_ERROR(to.publish(file.path + kTempSuffix, file.path, metadata_deadline()));
      ZW_RETURN_IF_ERROR(to.sync_directory(owner_dir, metadata_deadline()));
    }
    manifests.emplace_back(entry.manifest, std::move(text));
  }
  for (const auto& [name, text] : manifests) {
    ZW_RETURN_IF_ERROR(write_small_file(to, tmp + "/" + name, text));
  }
  ZW_RETURN_IF_ERROR(write_small_file(to, tmp + "/" + kCommitRecordName, record_text));
  ZW_RETURN_IF_ERROR(to.sync_directory(tmp, metadata_deadline()));
  if (Status renamed = to.publish(tmp, dir, metadata_deadline(), kCommitRecordName);
      !renamed.is_ok()) {
    // Another run committed this step number there while it was copied.
    if (renamed.code() == ErrorCode::kAlreadyExists) {
      (void)to.remove_all(tmp, metadata_deadline(), internal::kCommitRecordName);
      return require_step_free(to, step, record.info.run_id);
    }
    return renamed;
  }
  ZW_RETURN_IF_ERROR(to.sync_directory("", metadata_deadline()));
  return publish_small_file(to, "", kLatestPointerName, dir + "\n");
}

}  // namespace zerowait::internal
