// Garbage collection of a checkpoint directory: retiring steps past retention, and removing
// what no committed step needs (files of retired steps, step-N.tmp leftovers of saves that never
// committed).
#include <algorithm>
#include <set>

#include "checkpoint/checkpoint_manifest.hpp"
#include "common/file.hpp"
#include "zerowait/checkpoint/maintenance.hpp"
#include "zerowait/checkpoint/manifest.hpp"

namespace zerowait {

namespace {

// The bytes of the files directly in `dir` (step directories are flat).
uint64_t directory_bytes(Store& target, const std::string& dir) {
  uint64_t bytes = 0;
  auto names = target.list(dir, metadata_deadline());
  if (!names.is_ok()) return 0;
  for (const std::string& name : names.value()) {
    auto size = target.size(dir + "/" + name, metadata_deadline());
    if (size.is_ok()) bytes += size.value();
  }
  return bytes;
}

}  // namespace

Result<GcReport> collect_garbage(Store& target, uint32_t keep_last, uint64_t keep_every,
                                 bool only_settled_tmp, const std::vector<uint64_t>& spare) {
  GcReport report;
  ZW_ASSIGN_OR_RETURN(std::vector<uint64_t> committed, list_steps(target));

  // Retention: retire steps neither among the newest keep_last nor a multiple of keep_every.
  // Removing the commit record first (and making that durable) means a step is never seen as
  // committed while its files are being deleted.
  if (keep_last > 0) {
    std::vector<uint64_t> kept;
    for (size_t i = 0; i < committed.size(); ++i) {
      const bool newest = i + keep_last >= committed.size();
      const bool milestone = keep_every > 0 && committed[i] % keep_every == 0;
      const bool spared = std::find(spare.begin(), spare.end(), committed[i]) != spare.end();
      if (newest || milestone || spared) {
        kept.push_back(committed[i]);
        continue;
      }
      const std::string dir = step_directory(committed[i]);
      ZW_RETURN_IF_ERROR(
          target.remove(dir + "/" + internal::kCommitRecordName, metadata_deadline()));
      ZW_RETURN_IF_ERROR(target.sync_directory(dir, metadata_deadline()));
      report.removed.push_back(dir + "/" + internal::kCommitRecordName);
    }
    committed = std::move(kept);
  }

  // Files still needed: those of every committed step, including what they reference.
  std::set<std::string> referenced;
  bool all_known = true;
  for (uint64_t step : committed) {
    auto manifests = read_rank_manifests(target, step);
    if (!manifests.is_ok()) {
      all_known = false;  // nothing is deleted below: its references are unknown
      continue;
    }
    for (const RankManifest& m : manifests.value()) {
      for (const StoredFile& f : m.files) referenced.insert(f.path);
    }
  }

  ZW_ASSIGN_OR_RETURN(auto names, target.list("", metadata_deadline()));
  const uint64_t newest = committed.empty() ? 0 : committed.back();
  for (const std::string& name : names) {
    bool tmp = false;
    auto step = internal::parse_step_directory(name, &tmp);
    if (!step) continue;
    if (tmp) {
      if (only_settled_tmp && (committed.empty() || *step > newest)) continue;
      report.bytes_freed += directory_bytes(target, name);
      ZW_RETURN_IF_ERROR(target.remove_all(name, metadata_deadline(), internal::kCommitRecordName));
      report.removed.push_back(name);
      continue;
    }
    ZW_ASSIGN_OR_RETURN(bool is_committed,
                        target.exists(internal::commit_record_path(*step), metadata_deadline()));
    // A retired step keeps the files a committed one references; when a manifest could not be
    // read, nothing is deleted (its references are unknown).
    if (is_committed || !all_known) continue;
    ZW_ASSIGN_OR_RETURN(auto files, target.list(name, metadata_deadline()));
    size_t kept_files = 0;
    for (const std::string& file : files) {
      const std::string path = name + "/" + file;
      if (referenced.count(path) != 0) {
        ++kept_files;
        continue;
      }
      auto size = target.size(path, metadata_deadline());
      ZW_RETURN_IF_ERROR(target.remove(path, metadata_deadline()));
      report.removed.push_back(path);
      if (size.is_ok()) report.bytes_freed += size.value();
    }
    if (kept_files == 0) {
      ZW_RETURN_IF_ERROR(target.remove_all(name, metadata_deadline(), internal::kCommitRecordName));
      report.removed.push_back(name);
    }
  }
  if (!report.removed.empty()) ZW_RETURN_IF_ERROR(target.sync_directory("", metadata_deadline()));
  return report;
}

}  // namespace zerowait
