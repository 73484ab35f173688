#include "checkpoint/part_writer.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>

#include "checkpoint/checkpoint_manifest.hpp"
#include "checkpoint/commit_protocol.hpp"
#include "checkpoint/file_digest.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/tensor_codec.hpp"
#include "common/align.hpp"
#include "common/file.hpp"
#include "common/xxhash.hpp"

namespace zerowait {

using internal::kTempSuffix;
using internal::publish_small_file;
using internal::write_small_file;

namespace {

constexpr uint64_t kWriteChunk = 8ull << 20;       // one write(2)
constexpr uint64_t kWritebackEvery = 64ull << 20;  // start writeback this often
constexpr uint64_t kCompressChunk = 4ull << 20;

bool is_floating_group_candidate(const TensorToSave& t) {
  return t.floating_point && t.element_size > 1;
}

}  // namespace

std::vector<uint64_t> staging_layout(const std::vector<TensorToSave>& tensors,
                                     uint64_t max_file_bytes, uint64_t* total) {
  constexpr uint64_t kPage = 4096;
  std::vector<uint64_t> offsets;
  offsets.reserve(tensors.size());
  uint64_t end = 0;
  uint64_t in_file = 0;
  for (const TensorToSave& t : tensors) {
    if (starts_new_file(offsets.empty(), in_file, t.nbytes, max_file_bytes)) {
      end = internal::align_up(end, kPage);
      in_file = 0;
    }
    end = internal::align_up(end, std::max<uint64_t>(t.element_size, 1));
    offsets.push_back(end);
    end += t.nbytes;
    in_file += t.nbytes;
  }
  *total = end;
  return offsets;
}

Status PartWriter::write_part() {
  const CheckpointOptions& opt = state_.options;
  Store& target = *state_.target;
  const std::string final_dir = step_directory(job_.step);
  tmp_dir_ = final_dir + kTempSuffix;

  ZW_ASSIGN_OR_RETURN(bool committed, target.exists(final_dir + "/" + internal::kCommitRecordName,
                                                    metadata_deadline()));
  if (committed) {
    return Status(ErrorCode::kAlreadyExists, "step " + std::to_string(job_.step) +
                                                 " is already committed in " + target.describe() +
                                                 "; save under a new step number");
  }
  // Checked before anything is written: a step this run could not mirror is not saved at all.
  if (opt.mirror) {
    ZW_RETURN_IF_ERROR(internal::require_step_free(*opt.mirror, job_.step, opt.run_id));
  }

  // Checksums of every tensor the background copy did not hash as it went, in parallel.
  const size_t n = job_.tensors.size();
  stored_.resize(n);
  state_.pool.parallel_for(n, [&](size_t i) {
    const TensorToSave& t = job_.tensors[i];
    StoredTensor& s = stored_[i];
    s.name = t.name;
    s.dtype = t.dtype;
    s.shape = t.shape;
    s.nbytes = t.nbytes;
    const bool hashed = i < job_.copy_xxh3.size() && job_.copy_xxh3[i].has_value();
    s.xxh3 = hashed ? *job_.copy_xxh3[i] : XXH3_64bits(job_.staging(i), t.nbytes);
  });

  // Incremental: unchanged tensors point at the bytes an earlier step already holds.
  std::vector<size_t> to_write;
  std::map<std::string, const StoredFile*> referenced_files;
  std::map<std::string, const StoredTensor*> previous;
  std::map<std::string, const StoredFile*> previous_files;
  if (opt.incremental && state_.base) {
    for (const StoredTensor& t : state_.base->tensors) previous[t.name] = &t;
    for (const StoredFile& f : state_.base->files) previous_files[f.path] = &f;
  }
  for (size_t i = 0; i < n; ++i) {
    auto it = previous.find(stored_[i].name);
    if (it != previous.end() && it->second->xxh3 == stored_[i].xxh3 &&
        it->second->nbytes == stored_[i].nbytes && it->second->dtype == stored_[i].dtype &&
        it->second->shape == stored_[i].shape) {
      stored_[i] = *it->second;
      // A manifest lists the file of each of its tensors (checked when it is read).
      referenced_files[stored_[i].file] = previous_files.at(stored_[i].file);
      continue;
    }
    to_write.push_back(i);
  }

  // Cut the written tensors into files of about max_file_bytes.
  const bool compressed = opt.compression == Compression::kZstd;
  std::vector<FilePlan> plans;
  uint64_t current = 0;
  for (size_t i : to_write) {
    const uint64_t bytes = job_.tensors[i].nbytes;
    if (starts_new_file(plans.empty(), current, bytes, opt.max_file_bytes)) {
      plans.push_back(
          {final_dir + "/" +
               internal::data_file_name(opt.rank, static_cast<uint32_t>(plans.size()), compressed),
           {}});
      current = 0;
    }
    plans.back().tensors.push_back(i);
    current += bytes;
  }

  ZW_RETURN_IF_ERROR(target.make_directory(tmp_dir_, metadata_deadline()));
  std::vector<StoredFile> files(plans.size());
  if (compressed) {
    for (size_t f = 0; f < plans.size(); ++f) {
      ZW_RETURN_IF_ERROR(write_compressed(plans[f], files[f]));
    }
  } else {
    std::vector<Status> statuses(plans.size());
    state_.pool.parallel_for(
        plans.size(), [&](size_t f) { statuses[f] = write_safetensors(plans[f], files[f]); });
    for (const Status& s : statuses) ZW_RETURN_IF_ERROR(s);
  }
  for (const StoredFile& f : files) bytes_written_ += f.bytes;
  tensors_written_ = to_write.size();

  manifest_.step = job_.step;
  manifest_.run_id = opt.run_id;
  manifest_.rank = opt.rank;
  manifest_.world_size = opt.world_size;
  if (state_.files_coordinate()) {
    // Rank 0's own token, the one of the rank 0 this rank committed with, or else whichever rank
    // 0 opened the directory last (wait_for_commit() follows a newer one).
    {
      std::lock_guard<std::mutex> lock(state_.mutex);
      manifest_.coordinator = state_.coordinator;
    }
    if (manifest_.coordinator.empty()) {
      ZW_ASSIGN_OR_RETURN(manifest_.coordinator, internal::read_coordinator(target));
    }
  }
  manifest_.structure_json = job_.structure_json;
  manifest_.tensors = stored_;
  manifest_.files = files;
  for (const auto& [path, file] : referenced_files) manifest_.files.push_back(*file);

  // A snapshot the caller found torn (a tensor changed while the background copy read it) must
  // not become a part: its error fails the save here, before the part is visible.
  ZW_RETURN_IF_ERROR(job_.wait_for_copy_verdict());
  // The rank manifest appears whole or not at all: the other ranks' commit looks for it.
  const std::string text = internal::encode_rank_manifest(manifest_);
  ZW_RETURN_IF_ERROR(
      publish_small_file(target, tmp_dir_, internal::rank_manifest_name(opt.rank), text));
  return Status::ok();
}

namespace {

// Streams tensor bytes from staging to `file` at increasing offsets.
class FileStream {
 public:
  FileStream(WritableFile& file, std::chrono::nanoseconds call_timeout)
      : file_(file), call_timeout_(call_timeout) {}
  // Each call on the file gets the whole timeout: a large file takes many calls.
  Deadline call_deadline() const { return Deadline::after(call_timeout_); }
  Status append(std::span<const std::byte> bytes) {
    for (uint64_t off = 0; off < bytes.size(); off += kWriteChunk) {
      auto piece = bytes.subspan(off, std::min<uint64_t>(kWriteChunk, bytes.size() - off));
      ZW_RETURN_IF_ERROR(file_.write_at(offset_, piece, call_deadline()));
      offset_ += piece.size();
      if (offset_ - writeback_from_ >= kWritebackEvery) {
        file_.start_writeback(writeback_from_, offset_ - writeback_from_, call_deadline());
        writeback_from_ = offset_;
      }
    }
    return Status::ok();
  }
  uint64_t offset() const { return offset_; }

 private:
  WritableFile& file_;
  std::chrono::nanoseconds call_timeout_;
  uint64_t offset_ = 0;
  uint64_t writeback_from_ = 0;
};

Status finish_file(WritableFile& file, const FileStream& stream, const std::string& path,
                   const std::string& container, FileChecksum checksum, uint64_t xxh3,
                   StoredFile& out) {
  ZW_RETURN_IF_ERROR(file.sync(stream.call_deadline()));
  ZW_RETURN_IF_ERROR(file.close(stream.call_deadline()));
  out.path = path;
  out.bytes = stream.offset();
  out.xxh3 = xxh3;
  out.checksum = checksum;
  out.container = container;
  return Status::ok();
}

std::string tmp_path_of(const std::string& final_path) {
  const size_t slash = final_path.find('/');
  return final_path.substr(0, slash) + kTempSuffix + final_path.substr(slash);
}

}  // namespace

Status PartWriter::write_safetensors(const FilePlan& plan, StoredFile& out) {
  std::vector<internal::safetensors::TensorEntry> entries;
  uint64_t offset = 0;
  for (size_t i : plan.tensors) {
    const TensorToSave& t = job_.tensors[i];
    entries.push_back({t.name, t.dtype, t.shape, offset, offset + t.nbytes});
    offset += t.nbytes;
  }
  ZW_ASSIGN_OR_RETURN(std::string header,
                      internal::safetensors::encode_header(entries, {{"format", "pt"}}));
  ZW_ASSIGN_OR_RETURN(auto file,
                      state_.target->create_streamed(tmp_path_of(plan.path), metadata_deadline()));
  FileStream stream(*file, state_.options.write_timeout);
  // The file's checksum is of its segments: each tensor's bytes are hashed once, for the
  // manifest's per-tensor checksum, not again for the file's (a pass over the state saved).
  internal::SegmentDigest checksum;
  checksum.add(XXH3_64bits(header.data(), header.size()));
  ZW_RETURN_IF_ERROR(stream.append(std::span<const std::byte>(
      reinterpret_cast<const std::byte*>(header.data()), header.size())));
  for (size_t i : plan.tensors) {
    stored_[i].file = plan.path;
    stored_[i].offset = stream.offset();
    stored_[i].stored_bytes = job_.tensors[i].nbytes;
    if (stored_[i].nbytes > 0) checksum.add(stored_[i].xxh3);
    ZW_RETURN_IF_ERROR(stream.append(job_.staged(i)));
  }
  return finish_file(*file, stream, plan.path, "safetensors", FileChecksum::kSegments,
                     checksum.digest(), out);
}

Status PartWriter::write_compressed(const FilePlan& plan, StoredFile& out) {
  const CheckpointOptions& opt = state_.options;
  // Every chunk of every tensor of the file is compressed in parallel, then written in order.
  struct Chunk {
    size_t tensor;
    uint64_t raw_offset;
    uint64_t raw_bytes;
    std::vector<std::byte> frame;
    Status status;
  };
  std::vector<Chunk> chunks;
  for (size_t i : plan.tensors) {
    const uint64_t count = internal::chunk_count(job_.tensors[i].nbytes, kCompressChunk);
    for (uint64_t c = 0; c < count; ++c) {
      chunks.push_back({i,
                        c * kCompressChunk,
                        internal::chunk_raw_size(job_.tensors[i].nbytes, kCompressChunk, c),
                        {},
                        {}});
    }
  }
  state_.pool.parallel_for(chunks.size(), [&](size_t k) {
    Chunk& chunk = chunks[k];
    const TensorToSave& t = job_.tensors[chunk.tensor];
    internal::CodecOptions codec{
        opt.zstd_level, is_floating_group_candidate(t) ? t.element_size : 1u, kCompressChunk};
    thread_local std::vector<std::byte> scratch;
    auto r = internal::compress_chunk(
        job_.staged(chunk.tensor).subspan(chunk.raw_offset, chunk.raw_bytes), codec, chunk.frame,
        scratch);
    chunk.status = r.status();
  });

  ZW_ASSIGN_OR_RETURN(auto file,
                      state_.target->create_streamed(tmp_path_of(plan.path), metadata_deadline()));
  FileStream stream(*file, state_.options.write_timeout);
  internal::Xxh3Stream checksum;  // of the whole file: its frames are in memory, and small
  const auto magic = std::as_bytes(std::span(internal::kCompressedFileMagic));
  checksum.update(magic.data(), magic.size());
  ZW_RETURN_IF_ERROR(stream.append(magic));
  for (size_t i : plan.tensors) {
    StoredTensor& s = stored_[i];
    const TensorToSave& t = job_.tensors[i];
    s.file = plan.path;
    s.offset = 0;  // set when its first chunk is written
    s.codec = "zstd";
    s.group_bytes = is_floating_group_candidate(t) ? t.element_size : 1u;
    s.chunk_bytes = kCompressChunk;
    s.stored_bytes = 0;
  }
  for (Chunk& chunk : chunks) {
    ZW_RETURN_IF_ERROR(chunk.status);
    StoredTensor& s = stored_[chunk.tensor];
    if (s.chunks.empty()) s.offset = stream.offset();
    s.chunks.push_back(chunk.frame.size());
    s.stored_bytes += chunk.frame.size();
    checksum.update(chunk.frame.data(), chunk.frame.size());
    ZW_RETURN_IF_ERROR(stream.append(chunk.frame));
    std::vector<std::byte>().swap(chunk.frame);
  }
  return finish_file(*file, stream, plan.path, "zerowait-zstd", FileChecksum::kWholeFile,
                     checksum.digest(), out);
}

}  // namespace zerowait
