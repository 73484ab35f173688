// WebDataset compatibility: the naming rule that groups files into samples, and .tar shards
// read in place through a sample index built once by scanning tar headers.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/reader.hpp"

namespace zerowait {

// Splits a member path the way WebDataset does: the key is the path up to the first dot of the
// file name, the field is the rest ("a/b/0001.seg.png" -> "a/b/0001", "seg.png"). Returns false
// when the file name has no dot, or the key or the field would be empty ("0001.").
bool split_sample_name(std::string_view path, std::string_view* key, std::string_view* field);

// True when `key` is a relative path with no "..", no empty component and no leading '/':
// safe to turn into a file name under an output directory.
bool is_safe_relative_path(std::string_view key);

// Scans the headers of a tar (ustar, GNU long names, pax path records) and builds a sample
// index: consecutive regular members sharing a key form one sample. Directories, links and
// members without a dot are skipped. The index has no checksums (format::kNoChecksums).
// Errors (bad header checksum, truncated member) are kCorrupt with the member's offset.
Result<format::ShardIndex> build_tar_index(ByteSource& tar);

// Path of the sidecar index cached beside `tar_path` ("<tar_path>.zwidx").
std::string tar_index_sidecar_path(const std::string& tar_path);
// Where the sidecar goes when this user may not write beside the tar: the user's cache
// directory (zerowait/io/cache_directory.hpp), "tar-index/<32 hex digits of a hash of the tar's
// absolute path>.zwidx". Errors when no cache directory is known.
Result<std::string> tar_index_user_cache_path(const std::string& tar_path);

// Opens a WebDataset .tar for reading in place. The index is loaded from the sidecar when it
// matches the tar (same size and modification time), otherwise rebuilt and the sidecar
// rewritten atomically; where the tar's directory cannot be written the sidecar lives in the
// user's cache directory (tar_index_user_cache_path), and where neither can be written it only
// costs the cache (noted once).
// A tar at a URL (http(s)://, s3://) is indexed by scanning it at every open, in ranged GETs of
// 8 MiB (each within kOpenTimeout), the next few announced to its source; there is no sidecar.
// Through a node-local cache that scan downloads the tar into the cache once for the node.
Result<std::shared_ptr<ShardReader>> open_tar_shard(const std::string& tar_path,
                                                    IoBackend backend = IoBackend::kPread);
// The same, for a tar already opened (through a Store, a cache): its source's name() says where
// it lies, and so whether a sidecar can be kept beside it.
Result<std::shared_ptr<ShardReader>> open_tar_shard(std::shared_ptr<ByteSource> source);

}  // namespace zerowait
