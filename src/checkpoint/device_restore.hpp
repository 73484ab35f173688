// Restores into memory the reads cannot fill directly (CUDA device memory): checkpoint_read.cpp's
// read_tensors hands these reads here.
#pragma once

#include <span>

#include "zerowait/checkpoint/manifest.hpp"
#include "zerowait/checkpoint/restore.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait::internal {

// read_tensors for reads whose `device` is not kHostMemory: their bytes are read in batches into
// the process's pinned restore staging, verified there, and copied to their destinations while
// the next batch is read. Returns once every copy is done (or, after an error, once none is in
// flight any more). Errors: read_tensors', kUnsupported for a device read without CUDA, kIo for a
// failed CUDA copy, kDeadlineExceeded for copies not done within kDeviceCopyTimeout.
Status read_through_staging(Store& target, const RankManifest& manifest,
                            std::span<const TensorRead> reads, const RestoreOptions& options);

}  // namespace zerowait::internal
