// Exporting a committed step as one safetensors file of full, unsharded tensors (a model
// release, or a hand-off to tools that read safetensors): `zerowait ckpt export` is its CLI.
//
// What goes in: rank `rank`'s per-rank tensors (those a save stored whole), and every sharded
// (DTensor / ShardedTensor) tensor of the step assembled from its chunks, which may live in any
// rank's files. Names are the state's key paths as RFC 6901 JSON pointers ("/model/w"), the same
// names the step's own tensor files use; with `prefix`, only the key paths under it, the prefix
// removed ("/model/" turns "/model/layers.0.weight" into "layers.0.weight"). The file's
// "__metadata__" holds "format": "pt", the step and the run id.
//
// Thread-safety: reads the target through its thread-safe calls; writes only `path` (through
// "<path>.tmp.<pid>", renamed into place once complete and fsynced).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zerowait/checkpoint/restore.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/store.hpp"

namespace zerowait {

// What floating-point tensors (F64, F32, F16, BF16) are written as; other dtypes (integers,
// bool, fp8, complex) are written as saved. Casts round to nearest even, as torch's .to() does.
enum class ExportDtype { kAsSaved, kBFloat16, kFloat16, kFloat32 };

struct ExportOptions {
  uint32_t rank = 0;   // whose per-rank tensors are exported
  std::string prefix;  // "" : every tensor; else only key paths starting with it, it removed
  ExportDtype dtype = ExportDtype::kAsSaved;
  unsigned threads = 0;  // read threads, as RestoreOptions::threads
  std::chrono::nanoseconds read_timeout = kDefaultReadTimeout;
  // Called after each tensor is written with the bytes written so far and in all (on the
  // calling thread).
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct ExportedTensor {
  std::string name;         // in the file
  std::string dtype;        // safetensors dtype in the file
  std::string saved_dtype;  // safetensors dtype it was saved with
  std::vector<int64_t> shape;
  uint64_t bytes = 0;      // in the file
  uint32_t chunks = 0;     // 0: a per-rank tensor; else the sharded chunks it was assembled from
};

struct ExportReport {
  uint64_t step = 0;
  std::string run_id;
  uint32_t world_size = 1;
  std::vector<ExportedTensor> tensors;  // in file order (sorted by name)
  uint64_t bytes_read = 0;              // tensor bytes read and verified
  uint64_t file_bytes = 0;              // size of the file written
};

// Writes `path` (a local file) holding the tensors of committed step `step` in `target`, each
// read through read_tensors and checked against its xxh3 (every piece of a sharded tensor too).
// Memory: one output tensor at a time (plus its cast, and a chunk for chunks that are not one
// contiguous run of the full tensor; per-rank tensors are read in batches of up to 256 MiB).
// Errors: kNotFound when the step is not committed; kInvalidArgument for a rank the step does
// not have, a prefix no tensor has, a sharded dtype safetensors cannot name, or a URL as `path`;
// kCorrupt naming the tensor or piece, file and offset for damaged data (or a sharded entry
// whose pieces are missing); the target's kIo / kDeadlineExceeded; kIo naming `path` when
// writing fails. On error `path` is left as it was.
Result<ExportReport> export_safetensors(Store& target, uint64_t step, const std::string& path,
                                        const ExportOptions& options = {});

}  // namespace zerowait
