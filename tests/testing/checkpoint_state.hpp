// Helpers shared by the checkpoint tests: a training-like state whose bytes a test can
// recompute, saving and reading it back through the public API, and copying a checkpoint
// directory into another storage target.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zerowait/checkpoint/checkpointer.hpp"
#include "zerowait/checkpoint/restore.hpp"

namespace zerowait::testing {

// Tensors whose bytes are a function of (version, tensor): what a test saves it can recompute
// to check what it reads.
struct TrainingState {
  std::vector<std::string> names;  // "/model/layer.<i>.weight"
  std::vector<std::vector<float>> values;

  static TrainingState make(const std::vector<size_t>& sizes);  // floats per tensor
  void fill(size_t tensor, uint64_t version);
  void fill_all(uint64_t version);
  SaveRequest request(uint64_t step) const;  // F32 tensors; the data stays owned by this state
};

// Every tensor of rank `rank`'s part of `step`, read with read_tensors (a failure is a test
// failure and returns what was read so far).
std::vector<std::vector<float>> read_all(Store& target, uint64_t step, uint32_t rank = 0,
                                         RestoreOptions options = {});
// Every tensor of `manifest` read from `target` as floats into `out` (replaced), through
// read_tensors; `fresh` tells it the buffers are newly allocated.
Status read_every_tensor(Store& target, const RankManifest& manifest,
                         std::vector<std::vector<float>>* out, RestoreOptions options = {},
                         bool fresh = false);
// restore_newest, reading every tensor of the copy it settles on into `out` (as Python's load()
// would): what the restore tests compare with the state they saved.
Result<RestoredStep> restore_newest_into(Store& primary, Store* mirror,
                                         const RestoreNewestOptions& options,
                                         std::vector<std::vector<float>>* out,
                                         RestoreOptions read = {});
SaveResult save_and_wait(Checkpointer& cp, const SaveRequest& request);
std::unique_ptr<Checkpointer> open_or_die(std::shared_ptr<Store> target,
                                          CheckpointOptions options = {});

// A store with no local path, made empty for the caller: "memory://<name>-<n>", a new n each
// call (memory stores live as long as the process, one per name).
std::shared_ptr<Store> fresh_memory_store(const std::string& name);

// Copies every directory and file under local directory `dir` into `target` (same relative
// paths) with plain file reads and the target's writes: how a test puts a checkpoint written to
// a directory onto a target with no local path.
void copy_directory_into(const std::string& dir, Store& target);

}  // namespace zerowait::testing
