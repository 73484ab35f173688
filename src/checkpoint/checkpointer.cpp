// The write side of checkpoints: snapshot into the staging pool, background write of one rank's
// part, the commit protocol, retention and the mirror tier. The read side is checkpoint_read.cpp.
#include "zerowait/checkpoint/checkpointer.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>

#include "checkpoint/checkpoint_io.hpp"
#include "checkpoint/checkpoint_manifest.hpp"
#include "checkpoint/checkpointer_state.hpp"
#include "checkpoint/commit_protocol.hpp"
#include "checkpoint/part_writer.hpp"
#include "checkpoint/safetensors.hpp"
#include "checkpoint/tensor_codec.hpp"
#include "common/align.hpp"
#include "common/clock.hpp"
#include "common/file.hpp"
#include "common/thread_pool.hpp"
#include "common/xxhash.hpp"
#include "host/aligned_buffer.hpp"
#include "host/cuda_runtime.hpp"
#include "host/thread_priority.hpp"
#include "zerowait/checkpoint/maintenance.hpp"
#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/storage/fault_store.hpp"

namespace zerowait {

using internal::align_up;
using internal::publish_small_file;
using internal::seconds_since;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kCopyPiece = 32ull << 20;       // snapshot memcpy work unit
// How much nicer than the training loop a background copy runs (host/thread_priority.hpp).
constexpr int kBackgroundCopyNice = 5;

// 64 random bits in hex: two runs sharing a tier tell their steps apart by it, and two jobs'
// rank 0s (the coordinator token) alike.
std::string random_id() {
  std::random_device device;
  const uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device();
  return internal::hex64(bits);
}

}  // namespace

Result<Compression> parse_compression(const std::string& name) {
  if (name.empty() || name == "none") return Compression::kNone;
  if (name == "zstd") return Compression::kZstd;
  return invalid_argument("unknown compression '" + name + "' (expected 'none' or 'zstd')");
}

std::string step_directory(uint64_t step) { return "step-" + std::to_string(step); }

bool SaveHandle::done() const {
  std::lock_guard<std::mutex> lock(job_->mutex);
  return job_->phase == SaveJob::Phase::kFinished;
}

Result<SaveResult> SaveHandle::wait(Deadline deadline) const {
  std::unique_lock<std::mutex> lock(job_->mutex);
  auto finished = [&] { return job_->phase == SaveJob::Phase::kFinished; };
  if (deadline.at == Clock::time_point::max()) {
    job_->changed.wait(lock, finished);
  } else if (!job_->changed.wait_until(lock, deadline.at, finished)) {
    return Status(ErrorCode::kDeadlineExceeded,
                  "checkpoint step " + std::to_string(job_->step) +
                      " is still saving at the deadline (the save goes on; wait again)");
  }
  if (!job_->result->is_ok()) {
    // Reported to this caller: the Checkpointer need not report it again.
    auto owner = job_->owner;
    std::lock_guard<std::mutex> owner_lock(owner->mutex);
    if (owner->unreported.message() == job_->result->status().message()) owner->unreported = {};
  }
  return *job_->result;
}

Status SaveHandle::wait_part() const {
  std::unique_lock<std::mutex> lock(job_->mutex);
  job_->changed.wait(lock, [&] { return job_->phase >= SaveJob::Phase::kPartDurable; });
  return job_->part_status;
}

uint64_t SaveHandle::step() const { return job_->step; }

bool SaveHandle::copied() const {
  std::lock_guard<std::mutex> lock(job_->mutex);
  return job_->host_copied;
}

Status SaveHandle::wait_copied(Deadline deadline) const {
  // The caller is held until the copy is done: its thread copies what is left beside the
  // writer's rather than wait. (Not the pool's threads too: the writer hashes on the pool as soon
  // as the copy is done, and a wait queued behind that would hold the caller for the hashing.)
  if (job_->copy_in_background) {
    job_->copy_waited_for.store(true, std::memory_order_relaxed);
    job_->take_copy_pieces(/*hash=*/false);
  }
  std::unique_lock<std::mutex> lock(job_->mutex);
  auto copied = [&] { return job_->host_copied; };
  if (deadline.at == Clock::time_point::max()) {
    job_->changed.wait(lock, copied);
  } else if (!job_->changed.wait_until(lock, deadline.at, copied)) {
    return Status(ErrorCode::kDeadlineExceeded,
                  "checkpoint step " + std::to_string(job_->step) +
                      ": its host tensors are still being copied at the deadline");
  }
  return Status::ok();
}

void SaveHandle::confirm_copy(const Status& verdict) const {
  std::lock_guard<std::mutex> lock(job_->mutex);
  if (!job_->copy_verdict) job_->copy_verdict = verdict;
  job_->changed.notify_all();
}

PendingSave::PendingSave(std::shared_ptr<SaveJob> job) : job_(std::move(job)) {}
PendingSave::PendingSave(PendingSave&&) noexcept = default;
PendingSave& PendingSave::operator=(PendingSave&&) noexcept = default;

PendingSave::~PendingSave() {
  if (job_ == nullptr) return;
  // Never started: release the staging pool for the next save, once no copy writes into it.
  (void)job_->wait_for_device_copies();
  job_->finish(Status(ErrorCode::kCancelled, "save of step " + std::to_string(job_->step) +
                                                 " was prepared but never started"));
  auto owner = job_->owner;
  std::lock_guard<std::mutex> lock(owner->mutex);
  if (owner->in_flight == job_) owner->in_flight.reset();
  owner->changed.notify_all();
}

std::byte* PendingSave::staging(size_t index) const {
  if (job_ == nullptr || index >= job_->tensors.size()) return nullptr;
  return job_->staging(index);
}

namespace {

// The copies of the tensors `indices` of `job` that have caller memory into staging, in pieces
// of kCopyPiece; the tensors forget their caller memory (only the pieces read it now).
std::vector<SaveJob::CopyPiece> copy_pieces_of(SaveJob& job, const std::vector<size_t>& indices) {
  std::vector<SaveJob::CopyPiece> pieces;
  for (size_t i : indices) {
    TensorToSave& t = job.tensors[i];
    if (t.data == nullptr) continue;
    const auto* src = static_cast<const std::byte*>(t.data);
    for (uint64_t off = 0; off < t.nbytes; off += kCopyPiece) {
      pieces.push_back({src + off, job.staging(i) + off, std::min(kCopyPiece, t.nbytes - off), i});
    }
    t.data = nullptr;
  }
  return pieces;
}

// Copies them on the pool's threads and the calling one.
void copy_into_staging(SaveJob& job, const std::vector<size_t>& indices) {
  const std::vector<SaveJob::CopyPiece> pieces = copy_pieces_of(job, indices);
  job.owner->pool.parallel_for(pieces.size(), [&](size_t i) {
    std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].bytes);
  });
}

std::vector<size_t> every_index(const SaveJob& job) {
  std::vector<size_t> all(job.tensors.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return all;
}

// Tests hold the background copy back with $ZEROWAIT_FAULT_COPY_STALL_MS, so that the training
// loop reaches its next optimizer step while the copy is still to come.
std::chrono::milliseconds copy_stall_from_environment() {
  const char* text = std::getenv("ZEROWAIT_FAULT_COPY_STALL_MS");
  return std::chrono::milliseconds(text == nullptr ? 0 : std::strtoll(text, nullptr, 10));
}

}  // namespace

Status PendingSave::copy_host_tensors() {
  if (job_ == nullptr) return invalid_argument("this save was already started");
  copy_into_staging(*job_, every_index(*job_));
  return Status::ok();
}

Status PendingSave::copy_host_tensors(const std::vector<size_t>& indices) {
  if (job_ == nullptr) return invalid_argument("this save was already started");
  for (size_t i : indices) {
    if (i >= job_->tensors.size()) {
      return invalid_argument("no tensor " + std::to_string(i) + " in this save");
    }
  }
  copy_into_staging(*job_, indices);
  return Status::ok();
}

Status PendingSave::wait_for_stream(void* cuda_stream, int device) {
  if (job_ == nullptr) return invalid_argument("this save was already started");
  ZW_ASSIGN_OR_RETURN(internal::CudaEvent event, internal::CudaEvent::record(device, cuda_stream));
  job_->device_copies.push_back(std::move(event));
  return Status::ok();
}

// --- commit -----------------------------------------------------------------------------------

namespace {

using internal::commit_step;

Status apply_retention(CheckpointerState& state, const std::vector<uint64_t>& spare = {}) {
  const CheckpointOptions& opt = state.options;
  if (opt.keep_last == 0 && opt.keep_every == 0) return Status::ok();
  return collect_garbage(*state.target, opt.keep_last, opt.keep_every, /*only_settled_tmp=*/true,
                         spare)
      .status();
}

// Rank 0: commits `step`, then retires steps retention no longer keeps, or with a mirror queues
// the step for it: the mirror's thread then applies the primary's retention after each copy,
// sparing the steps still queued, so that no step is retired before it is copied (the copy would
// find its files gone). A retention error does not undo the commit: the next wait_all() reports it.
Status commit_and_tidy(CheckpointerState& state, uint64_t step) {
  std::lock_guard<std::mutex> deciding(state.retention_mutex);
  ZW_RETURN_IF_ERROR(commit_step(*state.target, step, state.options.world_size,
                                 state.options.run_id, state.coordinator));
  if (!state.options.mirror) {
    Status retention = apply_retention(state);
    if (!retention.is_ok()) state.remember_error(retention.with_context("retention"));
    return Status::ok();
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  state.mirror_queue.push_back(step);
  state.changed.notify_all();
  return Status::ok();
}

// Ranks meeting through files, once this rank's part is durable: rank 0 waits for every part of
// its job, another rank until the step is committed with its part. A rank's first commit binds
// it to that rank 0: its later parts answer to no other.
Status wait_for_part_or_commit(CheckpointerState& state, SaveJob& job) {
  const CheckpointOptions& opt = state.options;
  if (opt.rank == 0) {
    return internal::wait_for_parts(*state.target, job.step, opt.world_size, state.coordinator,
                                    opt.commit_timeout_s);
  }
  std::string bound;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    bound = state.coordinator;
  }
  ZW_RETURN_IF_ERROR(
      internal::wait_for_commit(*state.target, job.manifest, !bound.empty(), opt.commit_timeout_s));
  std::lock_guard<std::mutex> lock(state.mutex);
  state.coordinator = job.manifest.coordinator;
  return Status::ok();
}

void run_save(std::shared_ptr<CheckpointerState> state, std::shared_ptr<SaveJob> job) {
  const CheckpointOptions& opt = state->options;
  job->set_phase(SaveJob::Phase::kWriting);
  if (job->copy_in_background) {
    const auto stall = copy_stall_from_environment();
    if (stall.count() > 0) std::this_thread::sleep_for(stall);
    const auto copy_start = Clock::now();
    // The copy runs beside the training loop's forward and backward: on one thread, which
    // yields the CPU to them, so it takes idle time first; once the loop waits for it (the
    // optimizer step), the loop's thread copies the pieces left beside it (wait_copied()).
    internal::yield_cpu_to_others(kBackgroundCopyNice);
    job->take_copy_pieces(/*hash=*/true);
    {
      std::unique_lock<std::mutex> lock(job->mutex);
      job->changed.wait(lock, [&] { return job->host_copied; });
    }
    job->copy_s = seconds_since(copy_start);
  }
  PartWriter writer(*state, *job);
  Status status = job->wait_for_device_copies();
  const auto write_start = Clock::now();
  if (status.is_ok()) status = writer.write_part();
  SaveResult result;
  result.step = job->step;
  result.snapshot_s = job->snapshot_s;
  result.device_wait_s = job->device_wait_s;
  result.copy_s = job->copy_s;
  for (const TensorToSave& t : job->tensors) result.bytes_total += t.nbytes;
  result.bytes_written = writer.bytes_written();
  result.tensors_written = writer.tensors_written();
  result.tensors_referenced = job->tensors.size() - writer.tensors_written();
  result.write_s = seconds_since(write_start);
  {
    std::lock_guard<std::mutex> lock(job->mutex);
    job->part_status = status;
    job->manifest = writer.manifest();
    job->phase = SaveJob::Phase::kPartDurable;
    job->changed.notify_all();
  }
  const auto commit_start = Clock::now();
  bool committed = false;
  if (status.is_ok()) {
    if (opt.caller_coordinates) {
      std::unique_lock<std::mutex> lock(job->mutex);
      job->changed.wait(lock, [&] { return job->caller_outcome.has_value(); });
      committed = job->caller_outcome->first;
      status = job->caller_outcome->second;
    } else {
      status = wait_for_part_or_commit(*state, *job);
      if (status.is_ok() && opt.rank == 0) status = commit_and_tidy(*state, job->step);
      if (!status.is_ok() && opt.rank == 0 && opt.world_size > 1) {
        // Tell the other ranks at once instead of letting them time out.
        (void)internal::write_failure_note(*state->target, job->step, state->coordinator,
                                           status.message());
      }
      committed = status.is_ok();
    }
  }
  result.commit_s = seconds_since(commit_start);
  result.committed = committed;
  if (committed) {
    std::lock_guard<std::mutex> lock(state->mutex);
    state->base = job->manifest;
  }
  if (!status.is_ok()) state->remember_error(status);
  {
    // The staging pool is free, and the next save's incremental base is this step: the next
    // save may start — already when this one's handle reports it done.
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->in_flight == job) state->in_flight.reset();
    state->changed.notify_all();
  }
  if (!status.is_ok()) {
    job->finish(status);
  } else {
    job->finish(result);
  }
}

}  // namespace

// --- mirror tier ------------------------------------------------------------------------------

void CheckpointerState::mirror_loop() {
  std::unique_lock<std::mutex> lock(mutex);
  while (true) {
    changed.wait(lock, [&] { return stopping || !mirror_queue.empty(); });
    if (mirror_queue.empty()) return;  // stopping, nothing left
    const uint64_t step = mirror_queue.front();
    mirror_queue.pop_front();
    mirror_busy = true;
    lock.unlock();
    Status status = internal::mirror_step(*target, *options.mirror, step, options.write_timeout);
    if (status.is_ok() && (options.keep_last != 0 || options.keep_every != 0)) {
      status =
          collect_garbage(*options.mirror, options.keep_last, options.keep_every, true).status();
    }
    // The primary's retention, now that the step is copied (commit_and_tidy).
    Status retention;
    {
      std::lock_guard<std::mutex> deciding(retention_mutex);
      lock.lock();
      const std::vector<uint64_t> waiting(mirror_queue.begin(), mirror_queue.end());
      lock.unlock();
      retention = apply_retention(*this, waiting);
    }
    lock.lock();
    mirror_busy = false;
    if (!status.is_ok() && unreported.is_ok()) {
      unreported = status.with_context("mirror " + options.mirror->describe());
    }
    if (!retention.is_ok() && unreported.is_ok()) {
      unreported = retention.with_context("retention");
    }
    changed.notify_all();
  }
}

// --- Checkpointer -----------------------------------------------------------------------------

Checkpointer::Checkpointer(std::shared_ptr<Store> target, CheckpointOptions options)
    : target_(target),
      options_(options),
      state_(std::make_shared<CheckpointerState>(target, options)) {}

Result<std::unique_ptr<Checkpointer>> Checkpointer::open(std::shared_ptr<Store> target,
                                                         CheckpointOptions options) {
  if (options.world_size == 0 || options.rank >= options.world_size) {
    return invalid_argument("rank " + std::to_string(options.rank) + " is not below world_size " +
                            std::to_string(options.world_size));
  }
  if (options.max_file_bytes == 0) return invalid_argument("max_file_bytes must be positive");
  // Crash tests through any entry point (the Python layer included): the process ends at the
  // N-th mutating operation on its directory (storage/fault_store.hpp).
  target = with_exit_fault_from_environment(std::move(target));
  // A tier that cannot be used at all (a URL given as a local directory fails every operation)
  // is named before anything is created in the other.
  ZW_RETURN_IF_ERROR(
      target->exists("", metadata_deadline()).status().with_context("checkpoint directory"));
  if (options.mirror) {
    ZW_RETURN_IF_ERROR(
        options.mirror->exists("", metadata_deadline()).status().with_context("checkpoint mirror"));
  }
  ZW_RETURN_IF_ERROR(target->make_directory("", metadata_deadline()));
  if (options.mirror) ZW_RETURN_IF_ERROR(options.mirror->make_directory("", metadata_deadline()));
  if (options.run_id.empty()) options.run_id = random_id();
  std::unique_ptr<Checkpointer> cp(new Checkpointer(target, options));
  if (options.rank == 0) {
    // Orphans of a crashed run. With several ranks, another one may already be writing the next
    // step, so only directories at or below the newest committed step are removed.
    ZW_RETURN_IF_ERROR(
        collect_garbage(*target, 0, 0, /*only_settled_tmp=*/options.world_size > 1).status());
    // A fresh token for this job: parts a dead job left in step-N.tmp carry an older one.
    if (cp->state_->files_coordinate()) {
      cp->state_->coordinator = random_id();
      ZW_RETURN_IF_ERROR(internal::publish_coordinator(*target, cp->state_->coordinator)
                             .with_context("checkpoint directory"));
    }
  }
  if (options.incremental) {
    ZW_ASSIGN_OR_RETURN(auto steps, list_steps(*target));
    if (!steps.empty()) {
      auto base = read_rank_manifest(*target, steps.back(), options.rank);
      // A latest step from another world size or a damaged manifest: start with a full save.
      if (base.is_ok()) cp->state_->base = std::move(base).value();
    }
  }
  if (options.mirror && options.rank == 0) {
    CheckpointerState* state = cp->state_.get();
    state->mirror_thread = std::thread([state] { state->mirror_loop(); });
  }
  return cp;
}

Checkpointer::~Checkpointer() {
  (void)wait_all();
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
    state_->changed.notify_all();
  }
  if (state_->mirror_thread.joinable()) state_->mirror_thread.join();
  if (state_->writer.joinable()) state_->writer.join();
}

Result<std::optional<PendingSave>> Checkpointer::begin_save(SaveRequest request,
                                                            bool skip_if_busy) {
  const auto start = Clock::now();
  CheckpointerState& state = *state_;
  for (const TensorToSave& t : request.tensors) {
    if (t.name.empty()) return invalid_argument("a tensor to save has an empty name");
    if (internal::safetensors::dtype_size(t.dtype) == 0) {
      return invalid_argument("tensor '" + t.name + "' has dtype '" + t.dtype +
                              "', which safetensors does not define");
    }
  }
  {
    std::unordered_set<std::string_view> names;  // hashed: saves of thousands of tensors
    names.reserve(request.tensors.size());
    for (const TensorToSave& t : request.tensors) {
      if (!names.insert(t.name).second) {
        return invalid_argument("two tensors are named '" + t.name + "'");
      }
    }
  }
  {
    // Backpressure: one save owns the staging pool until its part is durable.
    std::unique_lock<std::mutex> lock(state.mutex);
    if (state.in_flight != nullptr && skip_if_busy) return std::optional<PendingSave>();
    state.changed.wait(lock, [&] { return state.in_flight == nullptr; });
  }
  if (state.writer.joinable()) state.writer.join();

  auto job = std::make_shared<SaveJob>();
  job->owner = state_;
  job->step = request.step;
  job->structure_json = std::move(request.structure_json);
  job->tensors = std::move(request.tensors);
  uint64_t total = 0;
  job->staging_offsets = staging_layout(job->tensors, state.options.max_file_bytes, &total);
  // Grows only; pre-faulted so the copy below never takes a first-touch fault after the first
  // save of this size. Pinned when CUDA is present (GPU tensors are copied through it).
  ZW_RETURN_IF_ERROR(state.staging->reserve(std::max<uint64_t>(total, 1),
                                            std::max<uint64_t>(total, 1),
                                            internal::host_memory_pinning_available()));
  job->staging_base = state.staging->data();
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    state.in_flight = job;
  }
  job->snapshot_s = seconds_since(start);
  job->started = start;
  return std::optional<PendingSave>(PendingSave(job));
}

namespace {

// Hands `job` to a new writer thread (the previous one was joined by begin_save).
void start_writer(const std::shared_ptr<SaveJob>& job) {
  auto state = job->owner;
  job->snapshot_s = seconds_since(job->started);
  std::lock_guard<std::mutex> lock(state->mutex);
  job->started_writing = true;
  state->writer = std::thread([state, job] { run_save(state, job); });
}

}  // namespace

Result<SaveHandle> PendingSave::start() {
  if (job_ == nullptr) return invalid_argument("this save was already started");
  std::shared_ptr<SaveJob> job = std::move(job_);
  for (TensorToSave& t : job->tensors) t.data = nullptr;  // the caller's memory is not used again
  {
    std::lock_guard<std::mutex> lock(job->mutex);
    job->host_copied = true;
    job->copy_verdict = Status::ok();
  }
  start_writer(job);
  return SaveHandle(job);
}

Result<SaveHandle> PendingSave::start_copying() {
  if (job_ == nullptr) return invalid_argument("this save was already started");
  std::shared_ptr<SaveJob> job = std::move(job_);
  job->copy_in_background = true;
  job->copy_pieces = copy_pieces_of(*job, every_index(*job));
  job->copy_xxh3.assign(job->tensors.size(), std::nullopt);
  if (job->copy_pieces.empty()) job->host_copied = true;
  start_writer(job);
  return SaveHandle(job);
}

Result<std::optional<SaveHandle>> Checkpointer::save(SaveRequest request, bool skip_if_busy) {
  ZW_ASSIGN_OR_RETURN(auto pending, begin_save(std::move(request), skip_if_busy));
  if (!pending) return std::optional<SaveHandle>();
  ZW_RETURN_IF_ERROR(pending->copy_host_tensors());
  ZW_ASSIGN_OR_RETURN(SaveHandle handle, pending->start());
  return std::optional<SaveHandle>(handle);
}

Status Checkpointer::commit(uint64_t step) {
  if (options_.rank != 0) return invalid_argument("only rank 0 commits a step");
  return commit_and_tidy(*state_, step);
}

void Checkpointer::finish(const SaveHandle& handle, bool committed, const Status& why) {
  SaveJob& job = *handle.job_;
  std::lock_guard<std::mutex> lock(job.mutex);
  if (!job.caller_outcome) job.caller_outcome.emplace(committed, committed ? Status::ok() : why);
  job.changed.notify_all();
}

Status Checkpointer::wait_all() {
  CheckpointerState& state = *state_;
  std::unique_lock<std::mutex> lock(state.mutex);
  // A save prepared but not started is the caller's to start or drop: not waited for here.
  state.changed.wait(
      lock, [&] { return state.in_flight == nullptr || !state.in_flight->started_writing; });
  std::thread writer = std::move(state.writer);
  lock.unlock();
  if (writer.joinable()) writer.join();
  lock.lock();
  state.changed.wait(lock, [&] { return state.mirror_queue.empty() && !state.mirror_busy; });
  Status status = std::move(state.unreported);
  state.unreported = Status::ok();
  return status;
}

}  // namespace zerowait
