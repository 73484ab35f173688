// The read side of checkpoints: listing committed steps, reading manifests, parallel verified
// restore and verification of whole steps (garbage collection is in checkpoint_gc.cpp).
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "checkpoint/checkpoint_io.hpp"
#include "checkpoint/checkpoint_manifest.hpp"
#include "checkpoint/device_restore.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/tensor_codec.hpp"
#include "host/aligned_buffer.hpp"
#include "common/file.hpp"
#include "common/log.hpp"
#include "common/thread_pool.hpp"
#include "common/xxhash.hpp"
#include "storage/store_path.hpp"
#include "zerowait/host/page_cache.hpp"
#include "zerowait/checkpoint/maintenance.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/checkpoint/restore.hpp"

namespace zerowait {

using internal::hex64;

namespace {

constexpr uint64_t kReadPiece = 16ull << 20;  // one task's span of a file
constexpr uint64_t kReadRange = 2ull << 20;   // one io_uring read: 8 in flight per task
constexpr uint64_t kMergeGap = 64ull << 10;   // small tensors closer than this share a read

Result<internal::CommitRecord> read_commit_record(Store& target, uint64_t step, Deadline deadline) {
  const std::string path = internal::commit_record_path(step);
  auto text = target.read(path, deadline);
  if (!text.is_ok()) {
    if (text.status().code() == ErrorCode::kNotFound) {
      return not_found("step " + std::to_string(step) + " is not a committed checkpoint in " +
                       target.describe());
    }
    return text.status();
  }
  ZW_ASSIGN_OR_RETURN(auto record, internal::decode_commit_record(text.value(), path));
  if (record.info.step != step) {
    return corrupt("'" + path + "' describes step " + std::to_string(record.info.step));
  }
  return record;
}

// A restore thread waits for its reads, then copies and hashes what arrived: two per core (and
// at least four) keep the disk busy while others copy. Measured with bench/run checkpoint.
unsigned read_threads(unsigned requested) {
  return requested != 0 ? requested : std::max(4u, 2 * internal::available_cpus());
}

// Asks for transparent huge pages on the 2 MiB pages wholly inside [data, data + bytes).
void advise_huge_pages(std::byte* data, uint64_t bytes) {
  constexpr uintptr_t kHuge = 2u << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) / kHuge * kHuge;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / kHuge * kHuge;
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// Whether the page cache holds (nearly) all of local file `path`. False when it cannot be told
// (another user's file, see page_cache.hpp) or `path` is not a local file.
bool in_page_cache(const std::string& path) {
  constexpr double kResidentShare = 0.9;
  auto residency = file_residency(path);
  return residency.is_ok() && residency.value().measured &&
         residency.value().resident_bytes >= kResidentShare * residency.value().bytes;
}

}  // namespace

Result<std::vector<uint64_t>> list_steps(Store& target, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(auto names, target.list("", deadline));
  std::vector<uint64_t> steps;
  for (const std::string& name : names) {
    bool tmp = false;
    auto step = internal::parse_step_directory(name, &tmp);
    if (!step || tmp) continue;
    ZW_ASSIGN_OR_RETURN(bool committed,
                        target.exists(internal::commit_record_path(*step), deadline));
    if (committed) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

Result<StepInfo> read_step_info(Store& target, uint64_t step, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(auto record, read_commit_record(target, step, deadline));
  return record.info;
}

namespace {

// Rank `rank`'s manifest of the step `record` commits, checked against the record.
Result<RankManifest> read_rank_manifest_of(Store& target, const internal::CommitRecord& record,
                                           uint32_t rank, Deadline deadline) {
  const uint64_t step = record.info.step;
  if (rank >= record.info.world_size) {
    return invalid_argument("step " + std::to_string(step) + " was saved by world_size " +
                            std::to_string(record.info.world_size) + "; there is no rank " +
                            std::to_string(rank));
  }
  const internal::RankEntry& entry = record.ranks[rank];
  const std::string path = step_directory(step) + "/" + entry.manifest;
  ZW_ASSIGN_OR_RETURN(std::string text, target.read(path, deadline));
  if (text.size() != entry.bytes || XXH3_64bits(text.data(), text.size()) != entry.xxh3) {
    return corrupt("'" + path + "' in " + target.describe() +
                   " does not match the checksum its commit record holds (damaged file)");
  }
  ZW_ASSIGN_OR_RETURN(RankManifest manifest, internal::decode_rank_manifest(text, path));
  if (manifest.step != step || manifest.rank != rank) {
    return corrupt("'" + path + "' is rank " + std::to_string(manifest.rank) + "'s part of step " +
                   std::to_string(manifest.step));
  }
  return manifest;
}

}  // namespace

Result<RankManifest> read_rank_manifest(Store& target, uint64_t step, uint32_t rank,
                                        Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(auto record, read_commit_record(target, step, deadline));
  return read_rank_manifest_of(target, record, rank, deadline);
}

Result<std::vector<RankManifest>> read_rank_manifests(Store& target, uint64_t step,
                                                      Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(auto record, read_commit_record(target, step, deadline));
  std::vector<RankManifest> manifests;
  for (uint32_t r = 0; r < record.info.world_size; ++r) {
    ZW_ASSIGN_OR_RETURN(RankManifest m, read_rank_manifest_of(target, record, r, deadline));
    manifests.push_back(std::move(m));
  }
  return manifests;
}

// --- parallel verified reads ------------------------------------------------------------------

namespace {

// Runs body(i) for every i in [0, count) on `pool` and the caller; returns the first error, once
// the items already started have ended (the others are skipped).
Status parallel_until_error(internal::ThreadPool& pool, size_t count,
                            const std::function<Status(size_t)>& body) {
  std::mutex mutex;
  Status first;
  std::atomic<bool> failed{false};
  pool.parallel_for(count, [&](size_t i) {
    if (failed.load(std::memory_order_relaxed)) return;
    Status status = body(i);
    if (!status.is_ok()) {
      std::lock_guard<std::mutex> lock(mutex);
      if (first.is_ok()) first = status;
      failed = true;
    }
  });
  return first;
}

// One unit of reading work: a span of one file, feeding parts of one or more tensors.
struct ReadTask {
  size_t file = 0;
  uint64_t offset = 0;  // in the file
  uint64_t length = 0;
  struct Part {
    size_t read = 0;         // index into the reads
    uint64_t in_task = 0;    // where its bytes start within the task's span
    uint64_t in_tensor = 0;  // where they go within the tensor
    uint64_t bytes = 0;
  };
  std::vector<Part> parts;
  int64_t chunk = -1;  // >= 0: one compressed chunk of parts[0]'s tensor
};

class Restore {
 public:
  Restore(Store& target, const RankManifest& manifest, std::span<const TensorRead> reads,
          const RestoreOptions& options)
      : target_(target), manifest_(manifest), reads_(reads), options_(options) {}

  Status run();

 private:
  Status open_files();
  void plan_tasks();
  Status run_task(const ReadTask& task);
  // Checks the checksum of read `read` once all its bytes arrived; `copy` is a copy of the whole
  // tensor that is still in the CPU caches (the bounce buffer), else the destination is hashed.
  Status tensor_done(size_t read, const std::byte* copy = nullptr);
  const StoredTensor& tensor(size_t read) const { return manifest_.tensors[reads_[read].index]; }

  // Each read gets the whole timeout: a read that stalls is reported, one that is slow is not.
  Deadline deadline() const { return Deadline::after(options_.read_timeout); }

  Store& target_;
  const RankManifest& manifest_;
  std::span<const TensorRead> reads_;
  RestoreOptions options_;
  std::vector<std::string> file_paths_;  // relative
  std::vector<std::unique_ptr<ByteSource>> files_;
  std::vector<size_t> file_of_read_;
  std::vector<ReadTask> tasks_;
  std::unique_ptr<std::atomic<uint64_t>[]> remaining_;  // bytes of each read still to arrive
};

Status Restore::open_files() {
  std::map<std::string, size_t> index;
  for (const TensorRead& r : reads_) {
    if (r.index >= manifest_.tensors.size()) {
      return invalid_argument("tensor index " + std::to_string(r.index) + " is out of range");
    }
    const StoredTensor& t = manifest_.tensors[r.index];
    auto [it, inserted] = index.emplace(t.file, file_paths_.size());
    if (inserted) file_paths_.push_back(t.file);
    file_of_read_.push_back(it->second);
  }
  for (const std::string& rel : file_paths_) {
    // Compressed frames are read whole at any offset: through the page cache.
    const bool raw =
        std::none_of(manifest_.tensors.begin(), manifest_.tensors.end(),
                     [&](const StoredTensor& t) { return t.file == rel && t.codec != "none"; });
    const IoBackend backend = options_.direct && raw ? IoBackend::kDirect : IoBackend::kIoUring;
    ZW_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source,
                        target_.open(rel, backend, metadata_deadline()));
    if (source->bypasses_page_cache() && in_page_cache(source->name())) {
      // Already cached: O_DIRECT would read the disk again for bytes memory holds, and reading
      // through the cache evicts nothing. Straight into the tensors, at memcpy speed.
      ZW_ASSIGN_OR_RETURN(source, target_.open(rel, IoBackend::kIoUring, metadata_deadline()));
    }
    for (const StoredFile& sf : manifest_.files) {
      if (sf.path == rel && sf.bytes != source->size()) {
        return internal::size_mismatch(source->name(), source->size(), sf.bytes);
      }
    }
    files_.push_back(std::move(source));
  }
  return Status::ok();
}

void Restore::plan_tasks() {
  std::vector<size_t> order(reads_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(file_of_read_[a], tensor(a).offset) <
           std::pair(file_of_read_[b], tensor(b).offset);
  });
  for (size_t r : order) {
    const StoredTensor& t = tensor(r);
    const size_t file = file_of_read_[r];
    if (t.codec == "zstd") {
      uint64_t offset = t.offset;
      for (size_t c = 0; c < t.chunks.size(); ++c) {
        const uint64_t raw = internal::chunk_raw_size(t.nbytes, t.chunk_bytes, c);
        tasks_.push_back(
            {file, offset, t.chunks[c], {{r, 0, c * t.chunk_bytes, raw}}, static_cast<int64_t>(c)});
        offset += t.chunks[c];
      }
      continue;
    }
    if (t.nbytes == 0) continue;
    // Small neighbours share one read; a large tensor is cut into pieces read in parallel.
    ReadTask* last = tasks_.empty() ? nullptr : &tasks_.back();
    if (last != nullptr && last->chunk < 0 && last->file == file &&
        t.offset >= last->offset + last->length &&
        t.offset - (last->offset + last->length) <= kMergeGap &&
        t.offset + t.nbytes - last->offset <= kReadPiece) {
      last->parts.push_back({r, t.offset - last->offset, 0, t.nbytes});
      last->length = t.offset + t.nbytes - last->offset;
      continue;
    }
    for (uint64_t off = 0; off < t.nbytes; off += kReadPiece) {
      const uint64_t n = std::min(kReadPiece, t.nbytes - off);
      tasks_.push_back({file, t.offset + off, n, {{r, 0, off, n}}, -1});
    }
  }
}

// Appends reads of `dst` from file `offset` on, cut into kReadRange pieces that are in flight
// together.
void add_requests(std::vector<ReadRequest>& requests, uint64_t offset, std::span<std::byte> dst) {
  for (uint64_t off = 0; off < dst.size(); off += kReadRange) {
    requests.push_back(
        {offset + off, dst.subspan(off, std::min<uint64_t>(kReadRange, dst.size() - off))});
  }
}

Status Restore::run_task(const ReadTask& task) {
  ByteSource& source = *files_[task.file];
  if (task.chunk >= 0) {
    // A compressed chunk: read its frame, decompress straight into the tensor.
    const ReadTask::Part& part = task.parts[0];
    const StoredTensor& t = tensor(part.read);
    thread_local std::vector<std::byte> frame;
    thread_local std::vector<std::byte> scratch;
    frame.resize(task.length);
    ZW_RETURN_IF_ERROR(source.read_at(task.offset, frame, deadline()));
    internal::CodecOptions codec{0, t.group_bytes, t.chunk_bytes};
    ZW_RETURN_IF_ERROR(internal::decompress_chunk(
        frame, codec, std::span<std::byte>(reads_[part.read].dst + part.in_tensor, part.bytes),
        scratch,
        "tensor '" + t.name + "' chunk " + std::to_string(task.chunk) + " in '" + t.file + "'"));
    if (remaining_[part.read].fetch_sub(part.bytes) == part.bytes) return tensor_done(part.read);
    return Status::ok();
  }
  std::vector<ReadRequest> requests;
  if (!source.bypasses_page_cache()) {
    // Through the page cache (or memory): straight into each tensor, no bounce copy.
    for (const ReadTask::Part& part : task.parts) {
      add_requests(requests, task.offset + part.in_task,
                   std::span<std::byte>(reads_[part.read].dst + part.in_tensor, part.bytes));
    }
    ZW_RETURN_IF_ERROR(source.read(requests, deadline()));
  } else {
    // O_DIRECT: aligned reads into a bounce buffer, then copies into the tensors.
    const uint64_t begin = task.offset / kDirectIoAlignment * kDirectIoAlignment;
    const uint64_t end = (task.offset + task.length + kDirectIoAlignment - 1) / kDirectIoAlignment *
                         kDirectIoAlignment;
    thread_local internal::AlignedBuffer bounce;
    ZW_RETURN_IF_ERROR(bounce.reserve(end - begin, kReadPiece + 2 * kDirectIoAlignment, false));
    // The blocks around the task, but not past the end of the file: the last block's read gets
    // what the file has (and a task that reaches past the end is a short read).
    const uint64_t stop = std::max(task.offset + task.length, std::min(end, source.size()));
    add_requests(requests, begin, std::span<std::byte>(bounce.data(), stop - begin));
    ZW_RETURN_IF_ERROR(source.read(requests, deadline()));
    const std::byte* span = bounce.data() + (task.offset - begin);
    for (const ReadTask::Part& part : task.parts) {
      std::memcpy(reads_[part.read].dst + part.in_tensor, span + part.in_task, part.bytes);
      // A whole tensor is hashed from the bounce buffer it was just copied from: still cached.
      const bool whole = part.bytes == tensor(part.read).nbytes;
      if (remaining_[part.read].fetch_sub(part.bytes) == part.bytes) {
        ZW_RETURN_IF_ERROR(tensor_done(part.read, whole ? span + part.in_task : nullptr));
      }
    }
    return Status::ok();
  }
  for (const ReadTask::Part& part : task.parts) {
    if (remaining_[part.read].fetch_sub(part.bytes) == part.bytes) {
      ZW_RETURN_IF_ERROR(tensor_done(part.read));
    }
  }
  return Status::ok();
}

// `bytes` (tensor `t` as stored in file `file`) against its checksum.
Status check_tensor(const StoredTensor& t, const std::byte* bytes, const std::string& file) {
  const uint64_t digest = XXH3_64bits(bytes, t.nbytes);
  if (digest == t.xxh3) return Status::ok();
  return corrupt("tensor '" + t.name + "' in '" + file + "' (offset " + std::to_string(t.offset) +
                 ", " + std::to_string(t.stored_bytes) + " bytes) does not match its checksum " +
                 "(xxh3 " + hex64(digest) + ", manifest " + hex64(t.xxh3) +
                 "): the file is damaged");
}

Status Restore::tensor_done(size_t read, const std::byte* copy) {
  if (!options_.verify) return Status::ok();
  return check_tensor(tensor(read), copy != nullptr ? copy : reads_[read].dst,
                      files_[file_of_read_[read]]->name());
}

Status Restore::run() {
  ZW_RETURN_IF_ERROR(open_files());
  plan_tasks();
  remaining_ = std::make_unique<std::atomic<uint64_t>[]>(reads_.size());
  for (size_t r = 0; r < reads_.size(); ++r) {
    if (reads_[r].fresh) advise_huge_pages(reads_[r].dst, tensor(r).nbytes);
    remaining_[r].store(tensor(r).nbytes);
    if (tensor(r).nbytes == 0) ZW_RETURN_IF_ERROR(tensor_done(r));
  }
  internal::ThreadPool pool(read_threads(options_.threads) - 1);
  return parallel_until_error(pool, tasks_.size(), [&](size_t i) { return run_task(tasks_[i]); });
}

// Reads whose bytes are already in memory (TensorRead::mapped, pages of the files' mappings):
// each tensor hashed where it is, the largest first, as many at once as there are CPUs (hashing
// a mapping faults its pages in from the page cache: CPU, not I/O).
Status verify_in_place(Store& target, const RankManifest& manifest,
                       std::span<const TensorRead> reads, const RestoreOptions& options) {
  for (const TensorRead& r : reads) {
    if (r.index >= manifest.tensors.size() || manifest.tensors[r.index].codec != "none") {
      return invalid_argument("tensor index " + std::to_string(r.index) +
                              " is out of range or compressed: it cannot be read in place");
    }
  }
  if (!options.verify) return Status::ok();
  std::vector<const TensorRead*> order;
  for (const TensorRead& r : reads) order.push_back(&r);
  std::sort(order.begin(), order.end(), [&](const TensorRead* a, const TensorRead* b) {
    return manifest.tensors[a->index].nbytes > manifest.tensors[b->index].nbytes;
  });
  const unsigned threads = std::min(read_threads(options.threads), internal::available_cpus());
  internal::ThreadPool pool(threads - 1);
  return parallel_until_error(pool, order.size(), [&](size_t i) {
    const StoredTensor& t = manifest.tensors[order[i]->index];
    ZW_ASSIGN_OR_RETURN(std::string file, internal::join_store_path(target.describe(), t.file));
    return check_tensor(t, order[i]->dst, file);
  });
}

}  // namespace

Status read_tensors(Store& target, const RankManifest& manifest, std::span<const TensorRead> reads,
                    const RestoreOptions& options) {
  std::vector<TensorRead> mapped, direct, staged;
  for (const TensorRead& r : reads) {
    (r.mapped ? mapped : r.device == kHostMemory ? direct : staged).push_back(r);
  }
  if (!mapped.empty()) ZW_RETURN_IF_ERROR(verify_in_place(target, manifest, mapped, options));
  if (!direct.empty()) {
    Restore restore(target, manifest, direct, options);
    ZW_RETURN_IF_ERROR(restore.run());
  }
  if (staged.empty()) return Status::ok();
  return internal::read_through_staging(target, manifest, staged, options);
}

// --- verification -----------------------------------------------------------------------------

namespace {

// Checks that a safetensors file's own header describes what the manifest says it holds.
Status check_safetensors_header(ByteSource& source, const StoredFile& file,
                                const RankManifest& manifest, std::chrono::nanoseconds timeout) {
  const std::string& local = source.name();
  std::string first8(8, '\0');
  ZW_RETURN_IF_ERROR(
      source.read_at(0, std::as_writable_bytes(std::span(first8)), Deadline::after(timeout)));
  ZW_ASSIGN_OR_RETURN(uint64_t length, internal::safetensors::header_length(first8, local));
  std::string prefix(8 + length, '\0');
  ZW_RETURN_IF_ERROR(
      source.read_at(0, std::as_writable_bytes(std::span(prefix)), Deadline::after(timeout)));
  ZW_ASSIGN_OR_RETURN(auto header, internal::safetensors::decode_header(prefix, file.bytes, local));
  std::map<std::string, const internal::safetensors::TensorEntry*> entries;
  for (const auto& e : header.tensors) entries[e.name] = &e;
  for (const StoredTensor& t : manifest.tensors) {
    if (t.file != file.path) continue;
    auto it = entries.find(t.name);
    if (it == entries.end() || it->second->dtype != t.dtype || it->second->shape != t.shape ||
        header.data_start + it->second->begin != t.offset ||
        it->second->end - it->second->begin != t.nbytes) {
      return corrupt("'" + local + "': the safetensors header's entry for tensor '" + t.name +
                     "' does not match the manifest");
    }
  }
  return Status::ok();
}

}  // namespace

Result<VerifyReport> verify_step(Store& target, uint64_t step, unsigned threads,
                                 const std::function<void(uint64_t)>& progress,
                                 std::chrono::nanoseconds read_timeout) {
  ZW_ASSIGN_OR_RETURN(auto record, read_commit_record(target, step, metadata_deadline()));
  VerifyReport report;
  report.step = step;
  struct Check {
    const RankManifest* manifest;
    const StoredFile* file;
    std::string problem;
  };
  std::vector<RankManifest> manifests;
  for (uint32_t r = 0; r < record.info.world_size; ++r) {
    auto m = read_rank_manifest_of(target, record, r, metadata_deadline());
    if (!m.is_ok()) {
      report.problems.push_back(m.status().message());
      continue;
    }
    manifests.push_back(std::move(m).value());
  }
  std::vector<Check> checks;
  for (const RankManifest& m : manifests) {
    report.tensors += m.tensors.size();
    for (const StoredFile& f : m.files) checks.push_back({&m, &f, {}});
  }
  std::mutex progress_mutex;
  internal::ThreadPool pool(read_threads(threads) - 1);
  pool.parallel_for(checks.size(), [&](size_t i) {
    Check& check = checks[i];
    auto source = target.open(check.file->path, IoBackend::kPread, metadata_deadline());
    if (!source.is_ok()) {
      check.problem = source.status().message();
      return;
    }
    // Through the page cache: verification reads each byte once.
    auto digest = internal::stream_source(*source.value(), *check.file, read_timeout,
                                          [&](uint64_t, std::span<const std::byte> piece) {
                                            if (progress) {
                                              std::lock_guard<std::mutex> lock(progress_mutex);
                                              progress(piece.size());
                                            }
                                            return Status::ok();
                                          });
    if (!digest.is_ok()) {
      check.problem = digest.status().message();
      return;
    }
    if (digest.value() != check.file->xxh3) {
      // Name the damaged tensors: read each of the file's tensors and check it.
      std::vector<std::string> bad;
      for (size_t t = 0; t < check.manifest->tensors.size(); ++t) {
        const StoredTensor& tensor = check.manifest->tensors[t];
        if (tensor.file != check.file->path) continue;
        std::vector<std::byte> scratch(tensor.nbytes);
        TensorRead read{t, scratch.data(), false};
        Status s = read_tensors(target, *check.manifest, std::span(&read, 1),
                                RestoreOptions{1, false, true, read_timeout});
        if (!s.is_ok()) bad.push_back(s.message());
      }
      check.problem = "'" + source.value()->name() + "' does not match its checksum (xxh3 " +
                      hex64(digest.value()) + ", manifest " + hex64(check.file->xxh3) + ")";
      for (const std::string& b : bad) check.problem += "; " + b;
      return;
    }
    if (check.file->container == "safetensors") {
      Status s =
          check_safetensors_header(*source.value(), *check.file, *check.manifest, read_timeout);
      if (!s.is_ok()) check.problem = s.message();
    }
  });
  std::set<std::string> seen;
  for (const Check& check : checks) {
    if (!seen.insert(check.file->path).second) continue;
    ++report.files;
    report.bytes += check.file->bytes;
    if (!check.problem.empty()) report.problems.push_back(check.problem);
  }
  return report;
}

}  // namespace zerowait
